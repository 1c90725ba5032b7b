"""`python infer.py bench`: the command line over the runner, the report and the tables.

Flags and the config become the application config through the same
`flags.app_config` as the REPL and `--prompt`, so every model and setting flag
means the same before or after `bench`; then the pair is loaded, a progress bar
follows the runs, and the report goes to the tables (or Markdown), `--json`
and `--chart`. Exit status: 0, 1 (models could not be loaded), 2 (bad input)
or 130 (Ctrl-C; what was measured is still shown and written).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from specrepl.chat.config import AppConfig, ConfigError
from specrepl.chat.flags import add_model_options, add_setting_options, app_config
from specrepl.chat.loading import load_config_pair
from specrepl.chat.settings import GAMMA_MAX, SettingError
from specrepl.engine.signals import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from specrepl.measure.bench import tables
from specrepl.measure.bench.figures import LONG_INPUT_TOKENS
from specrepl.measure.bench.markdown import run_markdown
from specrepl.measure.bench.options import DEFAULT_PEERS, PEERS, BenchOptions
from specrepl.measure.bench.prompts import (
    PROMPTS_FILE,
    BenchError,
    BenchPrompt,
    default_prompts_path,
    load_prompts,
)
from specrepl.measure.bench.report import BenchReport
from specrepl.measure.bench.runner import Benchmark
from specrepl.models.compatibility import IncompatibleTokenizersError
from specrepl.models.errors import ModelLoadError
from specrepl.models.pair import ModelPair

__all__ = ["add_arguments", "parse_peers", "parse_sweep", "run"]


def parse_sweep(value: str | None) -> tuple[int, ...]:
    """`1-8`, `2,4,6` or a mix (`1-3,6`): the gammas of a sweep, sorted, no repeats."""
    if value is None or not value.strip():
        return ()
    gammas: set[int] = set()
    for part in value.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise BenchError(f"--gamma-sweep: expected a range like 1-8 or a list, got {value!r}")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if low > high:
            raise BenchError(f"--gamma-sweep: {low}-{high} is an empty range")
        if low < 1 or high > GAMMA_MAX:
            raise BenchError(f"--gamma-sweep: gammas must be between 1 and {GAMMA_MAX}")
        gammas.update(range(low, high + 1))
    return tuple(sorted(gammas))


def parse_peers(value: str | None) -> tuple[str, ...]:
    """`hf,hf-compiled`: the peers to run, in the order given, no repeats; () for
    none; the default peers when not given."""
    if value is None:
        return DEFAULT_PEERS
    names = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in PEERS]
    if unknown or not names:
        got = unknown[0] if unknown else value
        raise BenchError(f"--peers: expected some of {', '.join(PEERS)}, got {got!r}")
    return () if names == ["none"] else tuple(name for name in names if name != "none")


def _categories(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise BenchError("--categories: give at least one category name")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py bench`: its own, and the model and setting flags
    every entry point takes (flags.py), which mean the same before or after `bench`."""
    parser.add_argument(
        "--prompts",
        metavar="PATH",
        help="Spec-Bench JSONL (question_id, category, turns: each turn is measured, asked"
        " after the question's earlier turns and their target-only answers); default:"
        f" {PROMPTS_FILE.as_posix()}, shipped with specrepl",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="at most N questions (with all their turns) per category",
    )
    parser.add_argument(
        "--categories", metavar="A,B", help="only these categories (comma-separated)"
    )
    parser.add_argument(
        "--peers",
        metavar="A,B",
        help="also time what users run instead, comma-separated: hf (transformers generate()"
        " plain, assisted and prompt lookup), hf-lookup (generate() and its prompt lookup"
        " only), hf-compiled (generate() with a static cache and torch.compile; the"
        " compilation is timed apart), llamacpp (llama.cpp on the target's GGUF file, plain"
        " and with its prompt lookup; needs bash scripts/setup.sh), llamacpp-exact (llama.cpp on a"
        " GGUF file of the target's exact weights, float32 for a quantized file, flash attention"
        " off and on: the faster is the fastest plain run; the default), none",
    )
    parser.add_argument(
        "--gamma-sweep",
        metavar="RANGE",
        help="also run the speculative method with each fixed gamma, e.g. 1-8",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure here")
    parser.add_argument(
        "--format",
        choices=("table", "markdown"),
        default="table",
        help="the report on stdout: tables (default), or Markdown to paste into an issue or"
        " README (progress then goes to stderr); `python infer.py compare` prints saved runs",
    )
    parser.add_argument(
        "--chart", dest="chart_out", metavar="OUT.png", help="draw speedups here (matplotlib)"
    )
    parser.add_argument(
        "--warmup", type=int, metavar="N", default=1, help="warm-up runs of every method (1)"
    )
    parser.add_argument(
        "--widths",
        choices=("tune", "off"),
        default="tune",
        help="tune: time each model's forward widths first and pad to cheaper ones (default)",
    )
    _add_turn_arguments(parser)
    add_model_options(parser, after_subcommand=True)
    add_setting_options(parser, after_subcommand=True)


def _add_turn_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that say how turns run and are summed up: `--chat`, `--long-input`."""
    parser.add_argument(
        "--chat",
        dest="one_chat",
        action="store_true",
        help="every prompt of the file is a turn of one chat, asked after the earlier turns and"
        " their target-only answers, with specrepl's caches kept from turn to turn as the REPL"
        " keeps them (the oldest turns go when the context would overflow); without it, only a"
        " question's own turns are one chat, and nothing is kept between turns",
    )
    parser.add_argument(
        "--long-input",
        type=int,
        metavar="N",
        default=LONG_INPUT_TOKENS,
        help="a turn whose prompt (its history included) has at least N tokens is summed up"
        f" apart as a long input ({LONG_INPUT_TOKENS})",
    )


def _arg(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


@dataclass(frozen=True)
class _Plan:
    config: AppConfig
    prompts_path: Path
    prompts: list[BenchPrompt]
    options: BenchOptions
    load_drafter: bool

    def config_dict(self, args: argparse.Namespace) -> dict[str, Any]:
        return {
            "config_file": None if self.config.path is None else str(self.config.path),
            "device": self.config.device,
            "prompts_file": str(self.prompts_path),
            "categories": list(dict.fromkeys(prompt.category for prompt in self.prompts)),
            "limit_per_category": _arg(args, "limit"),
            "prompts": len(self.prompts),
            "turns": self.turns,
        }

    @property
    def turns(self) -> int:
        return sum(len(prompt.turns) for prompt in self.prompts)


def _plan(args: argparse.Namespace) -> _Plan:
    """Everything the flags and the config decide, checked before any model loads."""
    config = app_config(args)
    settings = config.settings
    if _arg(args, "prompts"):
        prompts_path = Path(_arg(args, "prompts")).expanduser()
    else:
        found, looked = default_prompts_path()
        if found is None:
            raise BenchError(
                "no prompts file: looked for "
                + ", ".join(str(path) for path in looked)
                + "; give one with --prompts PATH"
            )
        prompts_path = found
    prompts = load_prompts(
        prompts_path, categories=_categories(_arg(args, "categories")), limit=_arg(args, "limit")
    )
    peers = parse_peers(_arg(args, "peers"))
    options = BenchOptions(
        settings,
        peers=peers,
        sweep=parse_sweep(_arg(args, "gamma_sweep")),
        warmup=1 if _arg(args, "warmup") is None else _arg(args, "warmup"),
        tune_widths=_arg(args, "widths") != "off",
        conversation=bool(_arg(args, "one_chat")),
        long_input_tokens=(
            LONG_INPUT_TOKENS if _arg(args, "long_input") is None else _arg(args, "long_input")
        ),
    )
    needs_model = settings.drafter_options().needs_model
    if needs_model and config.drafter is None:
        raise BenchError(
            f"--drafter-kind {settings.drafter_kind} needs a drafter model, and the config has"
            " none (or --drafter none was given): use --drafter-kind ngram, lookup or head"
        )
    return _Plan(config, prompts_path, prompts, options, needs_model or bool(peers))


def _progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("left"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def _load(plan: _Plan, console: Console) -> ModelPair:
    """The config's pair, loaded under a spinner that names each stage."""
    with console.status("loading models…") as status:
        return load_config_pair(
            plan.config,
            lambda message: status.update(escape(message)),
            with_drafter=plan.load_drafter,
        )


def _intro(plan: _Plan, benchmark: Benchmark, pair: ModelPair) -> str:
    """The line saying what is about to be measured."""
    turns = "" if plan.turns == len(plan.prompts) else f" ({plan.turns} turns)"
    chat = ", one chat with caches kept" if plan.options.conversation else ""
    return (
        f"[bold]bench[/] {len(plan.prompts)} prompts{turns}{chat} × {len(benchmark.methods)}"
        f" methods, {plan.options.settings.max_new_tokens} new tokens,"
        f" {escape(plan.options.processor.describe())}, {torch.get_num_threads()} threads,"
        f" on {pair.device}"
    )


def _measure(benchmark: Benchmark, prompts: list[BenchPrompt], console: Console) -> bool:
    """Run the benchmark under a progress bar; True when Ctrl-C cut it short."""
    with _progress_bar(console) as progress:
        task = progress.add_task("warm-up", total=benchmark.total_runs(prompts))

        def on_progress(done: int, total: int, description: str) -> None:
            progress.update(task, completed=done, total=total, description=escape(description))

        try:
            benchmark.run(prompts, on_progress)
        except KeyboardInterrupt:
            return True
    return False


def run(args: argparse.Namespace, console: Console, *, pair: ModelPair | None = None) -> int:
    """`python infer.py bench`: measure, show the tables, write JSON and chart.

    `pair` replaces loading the config's models (tests). Returns the exit
    status: 0, 1 (models could not be loaded), 2 (bad input) or 130 (Ctrl-C;
    what was measured is still shown and written).
    """
    markdown = _arg(args, "format") == "markdown"
    report_console = console
    if markdown:  # stdout is the Markdown alone; everything else goes to stderr
        console = Console(stderr=True, highlight=False)

    def fail(message: str, status: int) -> int:
        console.print(f"[bold red]error:[/] {escape(message)}")
        return status

    try:
        plan = _plan(args)
    except (BenchError, ConfigError, SettingError, ValueError) as error:
        return fail(str(error), EXIT_USAGE)
    chart_out = _arg(args, "chart_out")
    if chart_out:
        missing = tables.chart_unavailable()
        if missing is not None:
            return fail(f"--chart: {missing}", EXIT_USAGE)
    if pair is None:
        try:
            pair = _load(plan, console)
        except (ModelLoadError, IncompatibleTokenizersError) as error:
            return fail(str(error), EXIT_FAILED)
        except KeyboardInterrupt:
            return fail("interrupted while loading the models", EXIT_INTERRUPTED)
    try:
        benchmark = Benchmark(pair, plan.options)
    except BenchError as error:
        return fail(str(error), EXIT_USAGE)
    console.print(_intro(plan, benchmark, pair))
    interrupted = _measure(benchmark, plan.prompts, console)
    report = BenchReport.build(benchmark, config=plan.config_dict(args), interrupted=interrupted)
    if markdown:
        report_console.file.write(run_markdown(report.to_dict()))
        report_console.file.flush()
    else:
        tables.render_report(report, report_console)
    json_out = _arg(args, "json_out")
    if json_out:
        try:
            console.print(f"wrote {escape(str(report.write_json(json_out)))}")
        except OSError as error:
            return fail(f"--json: cannot write {json_out}: {error}", EXIT_FAILED)
    if chart_out and report.records:
        try:
            console.print(f"wrote {escape(str(tables.write_chart(report, chart_out)))}")
        except OSError as error:
            return fail(f"--chart: cannot write {chart_out}: {error}", EXIT_FAILED)
    return EXIT_INTERRUPTED if interrupted else EXIT_OK
