"""Tables and the chart of a finished benchmark (`runner.py` measures, this draws).

`render_report` prints, on the console it is given, a rich table per category,
one overall and, when the prompts were not all short first turns, one per kind
of turn (first turns, later turns, long inputs) (median tokens/s, speedups over
specrepl target-only and over transformers plain `generate()`, identical
outputs, acceptance, tokens per target step, predicted speedup and
measured/predicted), every prompt with its speculative speedup and whether its
speculative text equals target-only's, where the time of the specrepl runs goes
(with the share of first drafts accepted and the drafter's seconds per drafted
token over one target-only forward pass), the gamma sweep, and every greedy
output that differs from target-only. `write_chart`
draws a PNG: speedup per category per method, and speedup against gamma for a
sweep.

The chart needs matplotlib, imported only when a chart is drawn: everything
else works without it, and `chart_unavailable` says how to install it.

This module reads a `BenchReport`; it never runs a model and never measures.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specrepl.measure.bench.figures import (
    FIRST_TURNS,
    HF_GENERATE,
    LONG_INPUT,
    SPECULATIVE,
    TARGET,
    Method,
)
from specrepl.measure.bench.markdown import (
    DASH,
    LLAMACPP_NOTE,
    PROMPT_HEADER,
    format_number,
    format_percent,
    format_positions,
    format_sources,
    format_times,
    prompt_row,
)
from specrepl.measure.bench.report import BenchReport
from specrepl.measure.bench.summary import OVERALL, MethodSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "MATPLOTLIB_REQUIREMENT",
    "chart_unavailable",
    "render_report",
    "write_chart",
]

MATPLOTLIB_REQUIREMENT = "matplotlib==3.11.2"
MAX_LISTED_MISMATCHES = 20
FAMILY_STYLE = {"specrepl": "green", "hf": "cyan", "llamacpp": "magenta"}


def _identical(summary: MethodSummary, method: Method) -> str:
    if method.name == TARGET or summary.compared == 0:
        return DASH
    text = f"{summary.identical}/{summary.compared}"
    if summary.identical == summary.compared or method.family == "llamacpp":
        return text
    return f"[bold red]{text}[/]"


def _category_table(report: BenchReport, category: str) -> Table:
    return _summary_table(report, category, report.summary[category])


def _turn_table(report: BenchReport, group: str) -> Table:
    title = group
    if group == LONG_INPUT:
        title = f"long input, ≥ {report.options.long_input_tokens} prompt tokens"
    return _summary_table(report, title, report.turn_summary[group])


def _summary_table(report: BenchReport, title: str, figures: dict[str, MethodSummary]) -> Table:
    """Every main method's figures over one group of prompts, a row each."""
    any_record = next(iter(figures.values()), None)
    count = 0 if any_record is None else any_record.prompts
    table = Table(
        title=f"{escape(title)} ({count} prompt{'s' if count != 1 else ''})",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    table.add_column("method")
    table.add_column("tok/s", justify="right")
    table.add_column("× target", justify="right")
    if report.has_hf:
        table.add_column("× HF gen", justify="right")
    if report.has_llamacpp_alone:
        table.add_column("× llama.cpp", justify="right")
    if report.options.greedy:
        table.add_column("same", justify="right")
    _add_acceptance_columns(table)
    for method in report.main_methods:
        summary = figures.get(method.name)
        if summary is None:
            continue
        row = [
            f"[{FAMILY_STYLE[method.family]}]{escape(method.label)}[/]",
            format_number(summary.tokens_per_second),
            format_times(summary.speedup_vs_target),
        ]
        if report.has_hf:
            row.append(format_times(summary.speedup_vs_hf))
        if report.has_llamacpp_alone:
            row.append(format_times(summary.speedup_vs_llamacpp))
        if report.options.greedy:
            row.append(_identical(summary, method))
        row += _acceptance_cells(summary)
        table.add_row(*row)
    return table


def _add_acceptance_columns(table: Table) -> None:
    """The columns `_acceptance_cells` fills."""
    for name in ("accept", "α", "tok/step", "1st draft by source", "predicted", "meas/pred"):
        table.add_column(name, justify="right")


def _acceptance_cells(summary: MethodSummary) -> list[str]:
    """Acceptance, alpha, tokens per step, first-draft acceptance by source
    (a hybrid's prompt lookup and its model or head apart), predicted and
    measured/predicted."""
    return [
        format_percent(summary.acceptance),
        format_number(summary.alpha, 2),
        format_number(summary.mean_accepted_length, 2),
        format_sources(summary.first_draft_acceptance_by_source),
        format_times(summary.predicted_speedup),
        format_number(summary.measured_over_predicted, 2),
    ]


def _prompts_table(report: BenchReport) -> Table:
    """Every prompt: its kind of turn, the prompt tokens the speculative run fed,
    its speedup, and whether its text equals target-only's (`prompt_row`)."""
    table = Table(
        title="per prompt (specrepl speculative against target-only)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    for index, name in enumerate(PROMPT_HEADER):
        table.add_column(
            name, justify="left" if index in (0, 1, len(PROMPT_HEADER) - 1) else "right"
        )
    for record in report.records:
        cells = [escape(cell) for cell in prompt_row(record.to_dict())]
        match = record.runs[SPECULATIVE].match if SPECULATIVE in record.runs else None
        if match is not None and match.alarming:
            cells[-1] = f"[bold red]{cells[-1]}[/]"
        table.add_row(*cells)
    return table


def _time_split_table(report: BenchReport) -> Table:
    table = Table(
        title="where the time of specrepl runs goes, and what one draft costs (overall)",
        box=box.SIMPLE_HEAD,
        title_justify="left",
    )
    names = (
        "method",
        "drafter",
        "target",
        "other",
        "γ0 steps",
        "no-draft steps",
        "1st draft",
        "draft ÷ target",
        "by position, %",
    )
    for name in names:
        table.add_column(name, justify="left" if name == "method" else "right")
    overall = report.summary[OVERALL]
    for method in report.methods:
        summary = overall.get(method.name)
        if method.family != "specrepl" or summary is None:
            continue
        table.add_row(
            escape(method.label),
            format_percent(summary.draft_share),
            format_percent(summary.target_share),
            format_percent(summary.other_share),
            format_percent(summary.fallback_share),
            format_percent(summary.empty_draft_share),
            format_percent(summary.first_draft_acceptance),
            format_number(summary.draft_cost_vs_target, 3),
            format_positions(summary.acceptance_by_position),
        )
    return table


def _sweep_table(report: BenchReport) -> Table:
    table = Table(title="gamma sweep (overall)", box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("γ", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("× target", justify="right")
    if report.has_hf:
        table.add_column("× HF gen", justify="right")
    _add_acceptance_columns(table)
    overall = report.summary[OVERALL]
    for method in report.sweep_methods:
        summary = overall.get(method.name)
        if summary is None:
            continue
        row = [str(method.sweep_gamma), format_number(summary.tokens_per_second)]
        row.append(format_times(summary.speedup_vs_target))
        if report.has_hf:
            row.append(format_times(summary.speedup_vs_hf))
        row += _acceptance_cells(summary)
        table.add_row(*row)
    return table


def _render_over_llamacpp(report: BenchReport, console: Console) -> None:
    """The figure a speedup over llama.cpp alone is stated by, for each method."""
    labels = {method.name: method.label for method in report.methods}
    for name, over in report.over_llamacpp().items():
        console.print(escape(over.in_words(labels[name])))


def _render_mismatches(report: BenchReport, console: Console) -> None:
    """Every greedy output that differs from target-only's, loudly (none expected)."""
    mismatches = report.mismatches()
    if not mismatches:
        return
    console.print(
        f"[bold red]{len(mismatches)} greedy output(s) differ from specrepl target-only[/] "
        "(a near-tie flipped by a different kernel order, or a bug):"
    )
    for record, run in mismatches[:MAX_LISTED_MISMATCHES]:
        verdict = DASH if run.match is None else run.match.describe()
        console.print(
            f"  {escape(record.key)} {escape(run.method)}: {verdict} ({run.new_tokens} vs "
            f"{record.runs[TARGET].new_tokens} tokens)"
        )
    if len(mismatches) > MAX_LISTED_MISMATCHES:
        console.print(f"  … and {len(mismatches) - MAX_LISTED_MISMATCHES} more (see --json)")


def render_report(report: BenchReport, console: Console) -> None:
    """Print every table of `report`, then the notes a reader must see."""
    machine, versions = report.machine, report.versions
    console.print(
        f"[dim]{escape(str(machine['cpu']))}, {machine['torch_threads']} torch threads, "
        f"{escape(str(machine['device']))}"
        + (f" ({escape(str(machine['gpu']))})" if machine.get("gpu") else "")
        + f"; torch {versions['torch']}, transformers {versions['transformers']}, "
        f"specrepl {versions['specrepl']}[/]"
    )
    if not report.records:
        console.print("[yellow]No prompt was measured.[/]")
    else:
        categories = [name for name in report.summary if name != OVERALL]
        for category in categories:
            console.print(_category_table(report, category))
        console.print(_category_table(report, OVERALL))
        if set(report.turn_summary) - {FIRST_TURNS}:  # some later turns or long inputs
            for group in report.turn_summary:
                console.print(_turn_table(report, group))
        console.print(_prompts_table(report))
        console.print(_time_split_table(report))
        if report.sweep_methods:
            console.print(_sweep_table(report))
        _render_over_llamacpp(report, console)
        console.print(
            "[dim]tok/s, ×, predicted and meas/pred: medians of per-prompt figures. "
            "accept = accepted/drafted, α = accepted/(accepted + rejections), tok/step = "
            "tokens per target forward; all pooled. predicted (over target-only) = "
            "(1 - α^(g+1)) / (1 - α) / (g·c + v), with c = drafter s per draft and v = "
            "verify s per step, each over the target's s per one-token step, from the "
            "same prompt's runs. γ0 steps: the gamma policy chose the target alone; "
            "no-draft steps: the drafter had nothing to propose.[/]"
        )
    _render_mismatches(report, console)
    if report.compile_seconds is not None:
        console.print(
            f"HF generate (static cache, torch.compile): the first call, compilation included,"
            f" took {report.compile_seconds:.1f} s (not in the figures above)"
        )
    if any(method.family == "llamacpp" for method in report.methods):
        console.print(f"[dim]{LLAMACPP_NOTE}[/]")
    for name, reason in report.unavailable.items():
        console.print(f"[yellow]{escape(name)} did not run: {escape(reason)}[/]")
    for turn, reason in report.skipped:
        console.print(f"[yellow]skipped {escape(turn.key)}: {escape(reason)}[/]")
    if report.interrupted:
        console.print("[yellow]Interrupted: the figures cover the prompts finished so far.[/]")


# -- the chart -----------------------------------------------------------------


def chart_unavailable() -> str | None:
    """Why no chart can be drawn (matplotlib missing), or None when it can."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"drawing a chart needs matplotlib: pip install {MATPLOTLIB_REQUIREMENT}"
    return None


def _baseline(report: BenchReport) -> tuple[str, Callable[[MethodSummary], float | None]]:
    if report.has_hf:
        return "transformers generate()", lambda summary: summary.speedup_vs_hf
    return "specrepl target-only", lambda summary: summary.speedup_vs_target


def _speedup_bars(report: BenchReport, axes: Axes) -> None:
    baseline_name, speedup = _baseline(report)
    baseline = HF_GENERATE if report.has_hf else TARGET
    methods = [method for method in report.main_methods if method.name != baseline]
    groups = [*(name for name in report.summary if name != OVERALL), OVERALL]
    width = 0.8 / max(len(methods), 1)
    for index, method in enumerate(methods):
        values = [speedup(report.summary[group][method.name]) or 0.0 for group in groups]
        positions = [
            group + (index - (len(methods) - 1) / 2) * width for group in range(len(groups))
        ]
        axes.bar(positions, values, width, label=method.label)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels(groups, rotation=30, ha="right")
    axes.set_ylabel(f"speedup over {baseline_name} (median)")
    axes.set_title("speedup per category")
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)


def _sweep_lines(report: BenchReport, axes: Axes) -> None:
    overall = report.summary[OVERALL]
    points = [
        (method.sweep_gamma, overall[method.name])
        for method in report.sweep_methods
        if method.sweep_gamma is not None and method.name in overall
    ]
    gammas = [gamma for gamma, _ in points]

    def line(value: Callable[[MethodSummary], float | None], style: str, label: str) -> None:
        pairs = [(gamma, value(summary)) for gamma, summary in points]
        kept = [(gamma, figure) for gamma, figure in pairs if figure is not None]
        if kept:
            axes.plot([g for g, _ in kept], [f for _, f in kept], style, label=label)

    line(lambda summary: summary.speedup_vs_target, "o-", "measured, over specrepl target-only")
    line(lambda summary: summary.predicted_speedup, "s--", "predicted, over specrepl target-only")
    if report.has_hf:
        line(lambda summary: summary.speedup_vs_hf, "^:", "measured, over transformers generate()")
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks(gammas)
    axes.set_xlabel("gamma (fixed)")
    axes.set_ylabel("speedup (median over prompts)")
    axes.set_title("speedup vs gamma (all prompts)")
    axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)


def write_chart(report: BenchReport, path: str | Path) -> Path:
    """Draw the PNG chart of `report` at `path`; needs matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise RuntimeError(chart_unavailable() or str(error)) from error
    sweep = bool(report.sweep_methods)
    figure = Figure(figsize=(15 if sweep else 10, 6.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, 2 if sweep else 1, squeeze=False)[0]
    _speedup_bars(report, axes[0])
    if sweep:
        _sweep_lines(report, axes[1])
    figure.suptitle(
        f"specrepl bench: {report.machine['cpu']}, {report.machine['torch_threads']} threads, "
        f"{report.options.settings.max_new_tokens} new tokens,"
        f" {report.options.processor.describe()}",
        fontsize="medium",
    )
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=110)
    return out
