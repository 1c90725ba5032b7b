"""The command line: `python infer.py [flags]` (the `specrepl` script).

Reads the config (`configs/default.toml` or `--config`), lets flags override
it, loads the model pair and then either opens the REPL or, with `--prompt`,
answers one prompt and exits (`--json` for one JSON object on stdout).

Subcommands are declared in `SUBCOMMANDS`: name, help, flags and body. Each
body lives with what it runs: `bench` (measure/bench/command.py), `soak`
(measure/soak/command.py), `replay` (measure/replay.py), `distill`
(train/distill.py), `compare` (measure/bench/markdown.py) and `cache`
(disk_cache.py); those below the application get a `front.Front`, which
loads their models as every entry point does and draws through a renderer.
Every model and setting flag (flags.py) means the same before or after a
subcommand's name.

Exit statuses: 0; 1 (a model failed to load, a refusal, a failed soak); 2 (a
bad flag or config); 130 (Ctrl-C, at any stage: a short message, no
traceback); 143 (SIGTERM, at any stage: "Terminated.", see signals.py).

On a terminal the REPL's prompt is drawn before the models are loaded (see
startup.py), so this module imports no model library at the top: a
subcommand's module (most import torch) is imported when the command line
names it, and so are its flags.

This module declares and dispatches; it does not print (render/ does), does
not parse REPL commands (commands/) and knows nothing about decoding.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specrepl.app import repl
from specrepl.app.front import Front, report_console
from specrepl.app.render.distill import DistillRenderer
from specrepl.app.render.measure import MeasureRenderer
from specrepl.app.render.repl import Renderer
from specrepl.app.startup import LoadingSession
from specrepl.chat.flags import add_model_options, add_setting_options
from specrepl.engine.processor_specs import PROCESSOR_NAMES
from specrepl.engine.signals import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    Terminated,
    signals_held,
    signals_unwind,
)
from specrepl.measure.bench import markdown as bench_markdown
from specrepl.measure.front import config_block

if TYPE_CHECKING:
    from specrepl.chat.answers import Answer
    from specrepl.chat.config import AppConfig
    from specrepl.chat.session import ChatSession
    from specrepl.models.pair import ModelPair

__all__ = [
    "SUBCOMMANDS",
    "Subcommand",
    "build_parser",
    "main",
    "one_shot_payload",
    "parse_arguments",
]


@dataclass(frozen=True)
class Subcommand:
    """A `python infer.py NAME ...` subcommand."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _arguments_of(module: str) -> Callable[[argparse.ArgumentParser], None]:
    """`module.add_arguments`, imported when a subcommand's flags are configured
    (only when the command line names it: these modules import torch)."""

    def configure(parser: argparse.ArgumentParser) -> None:
        importlib.import_module(module).add_arguments(parser)

    return configure


def _fronted(name: str, help: str, module: str, view: Callable[[], Renderer]) -> Subcommand:
    """A subcommand below the application: `module` declares its flags
    (`add_arguments`) and runs it (`run(args, front)`), drawn by `view()`; the
    module is imported only when the command line names it (it imports torch)."""

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(module).run(args, Front(args, view())))

    return Subcommand(name, help, _arguments_of(module), run)


def _measure_view() -> MeasureRenderer:
    """The report on stdout; the progress and start-up messages on stderr."""
    return MeasureRenderer(report_console(), status_console=Console(stderr=True))


def _distill_view() -> DistillRenderer:
    return DistillRenderer(Console(highlight=False), status_console=Console(stderr=True))


def _run_bench(args: argparse.Namespace) -> int:
    from specrepl.measure.bench import command

    return command.run(args, report_console())


def _run_compare(args: argparse.Namespace) -> int:
    """`python infer.py compare RUN.json...`: saved runs as Markdown (bench/markdown.py)."""
    return bench_markdown.compare_command(args, sys.stdout.write, sys.stderr.write)


def _run_cache(args: argparse.Namespace) -> int:
    from specrepl.app import disk_cache

    return disk_cache.run(args, Console(highlight=False))


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
    _fronted(
        "distill",
        "train a draft head for the target from its own answers (distill --help)",
        "specrepl.train.distill",
        _distill_view,
    ),
    _fronted(
        "replay",
        "play a scripted chat with caches kept and dropped between turns (replay --help)",
        "specrepl.measure.replay",
        _measure_view,
    ),
    _fronted(
        "soak",
        "answer many prompts in one session, watching memory and determinism (soak --help)",
        "specrepl.measure.soak.command",
        _measure_view,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run specrepl with `argv` (default: the process's arguments); returns the exit status.

    SIGTERM, at any stage and in every subcommand, unwinds to here: one line,
    status 143 (the REPL says it itself)."""
    with signals_unwind():
        try:
            return _main(argv)
        except Terminated:
            with contextlib.suppress(KeyboardInterrupt, Terminated):
                Console(stderr=True, highlight=False).print("Terminated.", style="yellow")
            return EXIT_TERMINATED


def _interactive(front: Front[Renderer]) -> int:
    """The REPL on a terminal: the prompt at once, the models loading behind it."""
    config = front.config()
    if isinstance(config, int):
        return config
    renderer = front.view
    session = LoadingSession(config, retime_widths=bool(front.args.retime_widths))
    reader = repl.make_reader(session, renderer, stdin=sys.stdin)
    session.set_on_change(reader.wake)
    session.start()
    try:
        return repl.run(session, renderer, reader)
    except KeyboardInterrupt:
        return front.stopped("Interrupted.")


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = parse_arguments(argv)
    except KeyboardInterrupt:  # Ctrl-C before anything started: as while importing
        with contextlib.suppress(KeyboardInterrupt):
            sys.stderr.write("Interrupted while starting.\n")
        return EXIT_INTERRUPTED
    subcommand = getattr(args, "run", None)
    if subcommand is not None:
        return int(subcommand(args))
    if args.json and args.prompt is None:
        build_parser(subcommand_flags=False).error("--json needs --prompt")
    front = Front(args, Renderer(report_console(), status_console=Console(stderr=True)))
    if args.prompt is None and sys.stdin.isatty():
        return _interactive(front)
    started = front.start()
    if isinstance(started, int):
        return started
    config, session = started
    renderer = front.view
    try:
        if not args.json:
            target = session.target.summary(session.settings)
            renderer.loaded(session.pair, session.head_summary(), session.runtime_summary(), target)
        if args.prompt is not None:
            return _one_shot(config, session, renderer, args)
        # the REPL handles Ctrl-C itself; one can still land in its welcome or goodbye
        return repl.run(session, renderer, repl.make_reader(session, renderer, stdin=sys.stdin))
    except KeyboardInterrupt:
        return front.stopped("Interrupted.")
