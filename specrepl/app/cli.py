"""The command line: `python infer.py [flags]` (the `specrepl` script).

Reads the config (`configs/default.toml` or `--config`), lets flags override
it, loads the model pair and then either opens the REPL or, with `--prompt`,
answers one prompt and exits (`--json` for one JSON object on stdout).
Subcommands (`bench`, `cache`, `distill`, `replay`, `soak`) register a
`Subcommand` in `SUBCOMMANDS` and reuse flags.py (`add_model_options`,
`add_setting_options`, `app_config`) and `load_models`.

Exit statuses: 0; 1 (a model failed to load, a refusal, a failed soak); 2 (a
bad flag or config); 130 (Ctrl-C, at any stage: a short message, no
traceback); 143 (SIGTERM, at any stage: "Terminated.", see signals.py).

On a terminal the REPL's prompt is drawn before the models are loaded (see
startup.py), so this module imports no model library at the top: the
modules that need torch (bench, soak, distill, the loader) are imported by
the subcommand or the step that uses them, and the parser configures a
subcommand's own flags only when the command line names one.

This module wires the parts together; it does not print (render.py does),
does not parse REPL commands (commands.py) and knows nothing about decoding.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specrepl.app import repl
from specrepl.app.render import Renderer
from specrepl.app.startup import LoadingSession, known_failure, load_config_pair, open_session
from specrepl.chat.config import AppConfig, ConfigError
from specrepl.chat.flags import add_model_options, add_setting_options, app_config
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.processor_specs import PROCESSOR_NAMES
from specrepl.engine.signals import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    Terminated,
    ctrl_c_insists,
    signals_held,
    sigterm_unwinds,
)
from specrepl.measure import replay as chat_replay
from specrepl.measure.bench import markdown as bench_markdown
from specrepl.store.atomic import write_text_atomically

if TYPE_CHECKING:
    from specrepl.chat.answers import Answer
    from specrepl.chat.session import ChatSession
    from specrepl.models.pair import ModelPair

__all__ = [
    "SUBCOMMANDS",
    "Subcommand",
    "add_model_options",
    "add_setting_options",
    "app_config",
    "build_parser",
    "config_block",
    "load_models",
    "main",
    "one_shot_payload",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Subcommand:
    """A `python infer.py NAME ...` subcommand."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


REPORT_WIDTH = 160
"""Columns of what is printed on stdout when it goes to a file or a pipe (a
terminal's own width is used, and so is $COLUMNS): wide enough that no table of
`bench`, `soak`, `replay`, `--prompt` or a piped REPL is folded or cut."""


def _report_console() -> Console:
    """stdout: as wide as the terminal, or `REPORT_WIDTH` into a file or pipe."""
    fits = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if fits else REPORT_WIDTH)


def _run_bench(args: argparse.Namespace) -> int:
    from specrepl.measure.bench import command

    return command.run(args, _report_console())


def _run_soak(args: argparse.Namespace) -> int:
    """`python infer.py soak`: many prompts in one session; see soak.py."""
    from specrepl.measure import soak

    renderer = Renderer(_report_console(), status_console=Console(stderr=True))
    prompts, warmup = args.soak_prompts, args.warmup
    if prompts < 1 or args.reset_every < 0 or not 0 <= (warmup or 0) <= prompts:
        renderer.fatal("soak: need --prompts >= 1, --reset-every >= 0, 0 <= --warmup <= --prompts")
        return EXIT_USAGE
    max_growth = None if args.max_growth_mib is None else int(args.max_growth_mib * soak.MIB)
    started = _start(args, renderer)
    if isinstance(started, int):
        return started
    config, session = started
    try:
        renderer.loaded(session.pair, session.head_summary(), session.runtime_summary())
        # each answer is streamed and drawn as in the REPL, into nowhere
        with open(os.devnull, "w", encoding="utf-8") as sink:
            drawer = Renderer(Console(file=sink, width=100))
            with renderer.progress("soak", prompts) as advance:
                result = soak.soak(
                    session,
                    prompts,
                    reset_every=args.reset_every,
                    warmup=warmup,
                    check=args.soak_check,
                    renderer=drawer,
                    on_prompt=advance,
                )
        renderer.soak_report(result, max_growth)
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted.")
    grew_too_much = max_growth is not None and (result.growth or 0) > max_growth
    if args.json_out:
        payload = {
            "config": config_block(
                config,
                session.pair,
                session.settings,
                prompts=prompts,
                reset_every=args.reset_every,
                checked=args.soak_check,
                max_growth=max_growth,
            ),
            "passed": result.ok and not grew_too_much,
            "result": result.to_dict(),
        }
        try:
            write_text_atomically(Path(args.json_out), json.dumps(payload, indent=2))
        except OSError as error:
            renderer.fatal(f"--json: cannot write {args.json_out}: {error}")
            return EXIT_FAILED
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if result.mismatches or grew_too_much else EXIT_OK


def _run_replay(args: argparse.Namespace) -> int:
    """`python infer.py replay`: a scripted chat, caches kept and dropped; see chat_replay.py."""
    renderer = Renderer(_report_console(), status_console=Console(stderr=True))
    try:
        turns = chat_replay.load_turns(args.chat_file)
    except (OSError, ValueError) as error:
        renderer.fatal(f"replay: {error}")
        return EXIT_USAGE
    started = _start(args, renderer)
    if isinstance(started, int):
        return started
    from specrepl.chat.session import ChatSession

    config, kept = started
    dropped = ChatSession(kept.pair, kept.settings)
    try:
        renderer.loaded(kept.pair, kept.head_summary(), kept.runtime_summary())
        with renderer.progress("replay", len(turns)) as advance:
            result = chat_replay.replay(kept, dropped, turns, on_turn=advance)
        renderer.replay_report(result)
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted.")
    if args.json_out:
        payload = {
            "config": config_block(config, kept.pair, kept.settings, chat_file=str(args.chat_file)),
            "result": result.to_dict(),
        }
        try:
            write_text_atomically(Path(args.json_out), json.dumps(payload, indent=1) + "\n")
        except OSError as error:
            renderer.fatal(f"--json: cannot write {args.json_out}: {error}")
            return EXIT_FAILED
    return EXIT_FAILED if result.mismatched_turns or result.refusal else EXIT_OK


def _run_distill(args: argparse.Namespace) -> int:
    """`python infer.py distill`: train a draft head for the target; see distill.py."""
    from specrepl.engine.drafters.draft_head import target_fingerprint
    from specrepl.store.paths import cache_root
    from specrepl.train import distill

    renderer = Renderer(Console(highlight=False), status_console=Console(stderr=True))
    config = _config(args, renderer)
    if isinstance(config, int):
        return config
    try:
        with renderer.loading("Loading the target") as progress:
            pair = load_config_pair(config, progress, with_drafter=False)
        work = cache_root() / "distill" / target_fingerprint(pair.target.model)
        options = distill.options_from_args(args, work)
    except Exception as error:
        if (message := known_failure(error)) is not None:  # the target cannot be loaded
            renderer.fatal(message)
            return EXIT_FAILED
        if not isinstance(error, ValueError):
            raise
        renderer.fatal(f"distill: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted while loading the target.")
    renderer.note(f"distill: work directory {options.work} (rerun the same command to resume)")
    try:
        with renderer.distill_progress() as (on_data, on_train):
            description = distill.distill(
                pair, options, on_data=on_data, on_train=on_train, on_message=renderer.note
            )
    except KeyboardInterrupt:
        return _interrupted(
            renderer,
            "Interrupted: the last checkpoint is kept; run the same command again to resume.",
        )
    renderer.distilled(description, str(options.output))
    return EXIT_OK


def _run_compare(args: argparse.Namespace) -> int:
    """`python infer.py compare RUN.json...`: saved runs as Markdown (bench/markdown.py)."""
    return bench_markdown.compare_command(args, sys.stdout.write, sys.stderr.write)


def _run_cache(args: argparse.Namespace) -> int:
    from specrepl.app import disk_cache

    return disk_cache.run(args, Console(highlight=False))


def _arguments_of(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """`module.add_arguments`, imported when a subcommand's flags are configured
    (only when the command line names it: these modules import torch)."""

    def configure(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_arguments(parser)

    return configure


SUBCOMMANDS: list[Subcommand] = [
    Subcommand(
        "bench",
        "measure speed against the peers on Spec-Bench prompts (bench --help)",
        _arguments_of("specrepl.measure.bench.command"),
        _run_bench,
    ),
    Subcommand(
        "cache",
        "list or clear what specrepl keeps on disk (cache --help)",
        _arguments_of("specrepl.app.disk_cache"),
        _run_cache,
    ),
    Subcommand(
        "compare",
        "print saved bench runs (--json files) as Markdown tables, side by side (compare --help)",
        bench_markdown.add_arguments,
        _run_compare,
    ),
    Subcommand(
        "distill",
        "train a draft head for the target from its own answers (distill --help)",
        _arguments_of("specrepl.train.distill"),
        _run_distill,
    ),
    Subcommand(
        "replay",
        "play a scripted chat with caches kept and dropped between turns (replay --help)",
        chat_replay.add_arguments,
        _run_replay,
    ),
    Subcommand(
        "soak",
        "answer many prompts in one session, watching memory and determinism (soak --help)",
        _arguments_of("specrepl.measure.soak"),
        _run_soak,
    ),
]


def build_parser(*, subcommand_flags: bool = True) -> argparse.ArgumentParser:
    """The command line's parser; without `subcommand_flags` each subcommand is
    known by name only (enough to tell whether the line names one)."""
    parser = argparse.ArgumentParser(
        description=(
            "See, measure and use speculative decoding. Without --prompt, opens the "
            "REPL (type /help there)."
        ),
        epilog=f"Processors: {', '.join(PROCESSOR_NAMES)}.",
    )
    parser.add_argument("--prompt", metavar="TEXT", help="answer one prompt and exit")
    parser.add_argument(
        "--json", action="store_true", help="with --prompt: print one JSON object on stdout"
    )
    parser.add_argument(
        "--retime-widths",
        action="store_true",
        help="on a CPU, time the forward widths again instead of using the stored plan",
    )
    add_model_options(parser)
    add_setting_options(parser)
    if SUBCOMMANDS:
        subparsers = parser.add_subparsers(dest="subcommand", metavar="COMMAND")
        for subcommand in SUBCOMMANDS:
            sub = subparsers.add_parser(
                subcommand.name, help=subcommand.help, add_help=subcommand_flags
            )
            if subcommand_flags:
                subcommand.configure(sub)
            sub.set_defaults(run=subcommand.run)
    return parser


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line. A subcommand's flags are configured (and its module,
    which may import torch, imported) only when the line names that subcommand."""
    light = build_parser(subcommand_flags=False)
    known, _ = light.parse_known_args(argv)
    if getattr(known, "subcommand", None) is None:
        return light.parse_args(argv)
    with signals_held():  # the subcommand's module imports torch (see signals_held)
        parser = build_parser()
    return parser.parse_args(argv)


def load_models(
    config: AppConfig, renderer: Renderer, *, retime_widths: bool = False
) -> ChatSession:
    """Load the config's pair into a warmed-up session, showing progress
    (`retime_widths`: time the forward widths again, see widths.py).

    Raises ModelLoadError, IncompatibleTokenizersError, HeadLoadError or SettingError.
    """
    with ctrl_c_insists(), renderer.loading("Loading models") as progress:
        return open_session(config, progress, retime_widths=retime_widths)


def config_block(
    config: AppConfig, pair: ModelPair, settings: Settings, **extra: Any
) -> dict[str, Any]:
    """The "config" object of every `--json` file but bench's (which has its own
    options): the settings, the config file, the device, the models, and `extra`."""
    return {
        **settings.as_dict(),
        "config_file": None if config.path is None else str(config.path),
        "device": str(pair.device),
        "target": pair.target.to_dict(),
        "drafter": pair.drafter.to_dict() if pair.drafter else None,
        **extra,
    }


def one_shot_payload(config: AppConfig, pair: ModelPair, answer: Answer) -> dict[str, Any]:
    """The `--json` object: the config used, one record per run, the speedup, and
    whether the speculative tokens equal the target-only tokens."""
    return {
        "config": config_block(
            config,
            pair,
            answer.settings,
            prompt_mode=answer.mode,
            prompt_tokens=answer.prompt_tokens,
        ),
        "runs": {name: run.to_dict() for name, run in answer.runs.items()},
        "speedup": answer.speedup,
        "speculative_vs_target": answer.output_match_dict(),
        "refusal": answer.refusal,
    }


def _interrupted(renderer: Renderer, message: str) -> int:
    """Report Ctrl-C and return 130; a second Ctrl-C only cuts the message short."""
    with contextlib.suppress(KeyboardInterrupt):
        renderer.fatal(message)
    return EXIT_INTERRUPTED


def _one_shot(
    config: AppConfig, session: ChatSession, renderer: Renderer, args: argparse.Namespace
) -> int:
    if args.json:
        answer = session.answer(args.prompt)
        renderer.json(one_shot_payload(config, session.pair, answer))
    else:
        with renderer.stream() as on_event:
            answer = session.answer(args.prompt, on_event)
        renderer.answer(answer)
    if answer.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if answer.refusal is not None else EXIT_OK


def _config(args: argparse.Namespace, renderer: Renderer) -> AppConfig | int:
    """The config with the flags applied, or EXIT_USAGE after a message naming what was wrong."""
    try:
        return app_config(args)
    except (ConfigError, SettingError, ValueError) as error:
        renderer.fatal(str(error))
        return EXIT_USAGE


def _start(args: argparse.Namespace, renderer: Renderer) -> tuple[AppConfig, ChatSession] | int:
    """The config and a session on its loaded models, or the exit code after a
    message: a bad config or flag, a model that cannot load, or Ctrl-C."""
    config = _config(args, renderer)
    if isinstance(config, int):
        return config
    try:
        retime = bool(getattr(args, "retime_widths", False))
        return config, load_models(config, renderer, retime_widths=retime)
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted while loading the models.")
    except Exception as error:
        message = known_failure(error)
        if message is None:
            raise
        renderer.fatal(message)
        return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Run specrepl with `argv` (default: the process's arguments); returns the exit status.

    SIGTERM, at any stage and in every subcommand, unwinds to here: one line,
    status 143 (the REPL says it itself)."""
    with sigterm_unwinds():
        try:
            return _main(argv)
        except Terminated:
            with contextlib.suppress(KeyboardInterrupt, Terminated):
                Console(stderr=True, highlight=False).print("Terminated.", style="yellow")
            return EXIT_TERMINATED


def _interactive(args: argparse.Namespace, renderer: Renderer) -> int:
    """The REPL on a terminal: the prompt at once, the models loading behind it."""
    config = _config(args, renderer)
    if isinstance(config, int):
        return config
    session = LoadingSession(config, retime_widths=bool(args.retime_widths))
    reader = repl.make_reader(session, renderer, stdin=sys.stdin)
    session.set_on_change(reader.wake)
    session.start()
    try:
        return repl.run(session, renderer, reader)
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted.")


def _main(argv: Sequence[str] | None) -> int:
    args = parse_arguments(argv)
    subcommand = getattr(args, "run", None)
    if subcommand is not None:
        return int(subcommand(args))
    if args.json and args.prompt is None:
        build_parser(subcommand_flags=False).error("--json needs --prompt")
    renderer = Renderer(_report_console(), status_console=Console(stderr=True))
    if args.prompt is None and sys.stdin.isatty():
        return _interactive(args, renderer)
    started = _start(args, renderer)
    if isinstance(started, int):
        return started
    config, session = started
    try:
        if not args.json:
            renderer.loaded(session.pair, session.head_summary(), session.runtime_summary())
        if args.prompt is not None:
            return _one_shot(config, session, renderer, args)
        # the REPL handles Ctrl-C itself; one can still land in its welcome or goodbye
        return repl.run(session, renderer, repl.make_reader(session, renderer, stdin=sys.stdin))
    except KeyboardInterrupt:
        return _interrupted(renderer, "Interrupted.")
