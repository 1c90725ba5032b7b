"""Benchmark results as Markdown tables, to paste into an issue, a pull request or README.

`run_markdown` turns one `bench` run (the JSON that `bench --json` writes, or
a finished report's `to_dict()`) into its tables: every method overall,
the speedup of each method in each category and in each kind of turn (first
turns, later turns, long inputs), where the time of specrepl's runs goes, the
gamma sweep, and every prompt (folded) with its speculative speedup and
whether its speculative text equals target-only's (`prompt_row`, which the
terminal's per-prompt table shows too). `compare_markdown` puts several runs side by
side, one column per run (before and after a change, machine A and B), after
a table saying what each run was: machine, versions, date and command.
`python infer.py bench --format markdown` prints the first,
`python infer.py compare RUN.json...` the second.

Plain text from plain data: no rich, no torch, no model. The figures are
the ones the run measured (medians and pooled ratios, see `summary.py`);
nothing is recomputed here.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from specrepl.engine.output_match import OutputMatch
from specrepl.measure.bench.figures import FIRST_TURNS, LONG_INPUT, SPECULATIVE, TARGET
from specrepl.measure.bench.summary import OVERALL, OverCategories

__all__ = [
    "DASH",
    "LLAMACPP_NOTE",
    "PROMPT_HEADER",
    "add_arguments",
    "compare_command",
    "compare_markdown",
    "format_number",
    "format_percent",
    "format_times",
    "load_run",
    "markdown_table",
    "prompt_row",
    "run_markdown",
]

LLAMACPP_NOTE = (
    "llama.cpp (plain, prompt lookup) runs the GGUF file's quantized weights with its own "
    "kernels, specrepl their float32 de-quantized values, so their greedy texts may differ; "
    "'the target's exact weights' runs a float32 GGUF file of those values: 'same' counts "
    "the prompts where llama.cpp's tokens match specrepl's target token for token."
)

SCHEMA_PREFIX = "specrepl-bench/"
DASH = "—"

Figure = Callable[[dict[str, Any]], str]
"""A cell from one method's summary (a dict of `MethodSummary` fields)."""


def format_times(value: float | None) -> str:
    """`1.23×`; a dash for a figure that was not measured (also in the rich tables)."""
    return DASH if value is None else f"{value:.2f}×"


def format_number(value: float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value:.{digits}f}"


def format_positions(shares: Sequence[float] | None, shown: int = 6) -> str:
    """Acceptance by draft position as '91 80 72 …' (percent, the first `shown`)."""
    if not shares:
        return DASH
    text = " ".join(f"{100 * share:.0f}" for share in shares[:shown])
    return text + (" …" if len(shares) > shown else "")


def format_sources(shares: dict[str, float] | None) -> str:
    """First-draft acceptance by draft source as 'head 55% lookup 80%'; a
    drafter of one source shows its one figure."""
    if not shares:
        return DASH
    return " ".join(f"{source} {100 * share:.0f}%" for source, share in shares.items())


def format_percent(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.0f}%"


def _same(summary: dict[str, Any]) -> str:
    if summary["method"] == TARGET or not summary.get("compared"):
        return DASH
    return f"{summary['identical']}/{summary['compared']}"


#: The figures of a method's row, in order: (header, cell, right-aligned).
OVERALL_FIGURES: tuple[tuple[str, Figure], ...] = (
    ("tok/s", lambda s: format_number(s["tokens_per_second"])),
    ("× target", lambda s: format_times(s["speedup_vs_target"])),
    ("× HF generate", lambda s: format_times(s["speedup_vs_hf"])),
    ("× llama.cpp alone", lambda s: format_times(s.get("speedup_vs_llamacpp"))),
    ("same output", _same),
    ("acceptance", lambda s: format_percent(s["acceptance"])),
    ("α", lambda s: format_number(s["alpha"], 2)),
    ("tok/step", lambda s: format_number(s["mean_accepted_length"], 2)),
    ("predicted", lambda s: format_times(s["predicted_speedup"])),
    ("meas/pred", lambda s: format_number(s["measured_over_predicted"], 2)),
)
COMPARED_FIGURES = ("tok/s", "× target", "× HF generate", "× llama.cpp alone", "same output")
COMPARED_FIGURES += ("acceptance", "tok/step")
"""The overall figures `compare_markdown` puts side by side (`run_markdown` shows all)."""
TIME_FIGURES: tuple[tuple[str, Figure], ...] = (
    ("drafter", lambda s: format_percent(s["draft_share"])),
    ("target", lambda s: format_percent(s["target_share"])),
    ("other", lambda s: format_percent(s["other_share"])),
    ("γ0 steps", lambda s: format_percent(s.get("fallback_share"))),
    ("no-draft steps", lambda s: format_percent(s.get("empty_draft_share"))),
    ("1st draft", lambda s: format_percent(s.get("first_draft_acceptance"))),
    ("1st draft by source", lambda s: format_sources(s.get("first_draft_acceptance_by_source"))),
    ("draft ÷ target", lambda s: format_number(s.get("draft_cost_vs_target"), 3)),
    ("by position", lambda s: format_positions(s.get("acceptance_by_position"))),
)


PROMPT_HEADER = ("prompt", "turn", "fed/prompt", "× target", "speculative vs target")
"""The per-prompt table's columns (`prompt_row`)."""


def _turn_kind(record: dict[str, Any]) -> str:
    """`first` or `later`, and `long` for a long input (a file without turns: first)."""
    groups = record.get("groups") or [FIRST_TURNS]
    kind = "first" if FIRST_TURNS in groups else "later"
    return f"{kind}, long" if LONG_INPUT in groups else kind


def _verdict(figures: dict[str, Any]) -> str:
    """A run's tokens against target-only's (`output_match`), also from older files."""
    if figures.get("output_vs_target"):
        return str(figures["output_vs_target"])
    if figures.get("identical_to_target") is None:
        return DASH
    return OutputMatch(greedy=True, first_difference=figures.get("first_mismatch")).describe()


def prompt_row(record: dict[str, Any]) -> list[str]:
    """One prompt's cells under `PROMPT_HEADER`, from its JSON record: its key, its
    kind of turn, the prompt tokens the speculative run fed (the rest a kept cache
    held) out of the prompt's, its speedup and its verdict."""
    figures = record["methods"].get(SPECULATIVE, {})
    tokens = record["prompt_tokens"]
    fed = tokens - (figures.get("reused_prompt_tokens") or 0)
    return [
        record.get("key") or f"{record['category']}/{record['question_id']}",
        _turn_kind(record),
        f"{fed}/{tokens}",
        format_times(figures.get("speedup_vs_target")),
        _verdict(figures),
    ]


def _cell(text: object) -> str:
    """A table cell: one line, `|` escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table; the first column left-aligned, the others right."""
    lines = [
        "| " + " | ".join(_cell(name) for name in header) + " |",
        "| " + " | ".join(["---", *["---:"] * (len(header) - 1)]) + " |",
    ]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


# -- reading runs ----------------------------------------------------------------


def load_run(path: str | Path) -> dict[str, Any]:
    """A `bench --json` file; ValueError naming the file when it is not one."""
    path = Path(path)
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(run, dict) or not str(run.get("schema", "")).startswith(SCHEMA_PREFIX):
        raise ValueError(f"{path} is not a `bench --json` file (no {SCHEMA_PREFIX}* schema)")
    missing = [key for key in ("methods", "summary", "machine", "versions") if key not in run]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: written by an older specrepl?")
    return run


def _main_methods(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [method for method in run["methods"] if method.get("sweep_gamma") is None]


def _categories(run: dict[str, Any]) -> list[str]:
    return [name for name in run["summary"] if name != OVERALL]


def _prompts(run: dict[str, Any], category: str = OVERALL, part: str = "summary") -> int:
    figures = run.get(part, {}).get(category, {})
    return max((summary["prompts"] for summary in figures.values()), default=0)


def machine_line(run: dict[str, Any]) -> str:
    """`AMD EPYC, 2 CPUs, 2 torch threads, cpu`; a GPU is named when one was used."""
    machine = run["machine"]
    parts = [str(machine.get("cpu") or "unknown CPU")]
    if machine.get("logical_cpus"):
        parts.append(f"{machine['logical_cpus']} CPUs")
    if machine.get("torch_threads"):
        parts.append(f"{machine['torch_threads']} torch threads")
    device = str(machine.get("device", "?"))
    parts.append(f"{device} ({machine['gpu']})" if machine.get("gpu") else device)
    return ", ".join(parts)


def versions_line(run: dict[str, Any]) -> str:
    versions = run["versions"]
    return ", ".join(f"{name} {versions[name]}" for name in sorted(versions))


def command_line(run: dict[str, Any]) -> str:
    command = run.get("command") or []
    return "python " + shlex.join(command) if command else DASH


# -- one run ----------------------------------------------------------------------


def _speedup(run: dict[str, Any], category: str, method: str, part: str = "summary") -> str:
    """A method's speedup over specrepl target-only in a category, or in a kind of
    turn with `part="summary_by_turn"` (a dash if not run)."""
    summary = run.get(part, {}).get(category, {}).get(method, {})
    return format_times(summary.get("speedup_vs_target"))


def _has_hf(run: dict[str, Any]) -> bool:
    return any(method["family"] == "hf" for method in run["methods"])


def _overall_figures(runs: Sequence[dict[str, Any]]) -> list[tuple[str, Figure]]:
    """The overall table's figures, without the columns no run has."""
    figures = list(OVERALL_FIGURES)
    if not any(_has_hf(run) for run in runs):
        figures = [f for f in figures if f[0] != "× HF generate"]
    if not any(run.get("over_llamacpp_alone") for run in runs):
        figures = [f for f in figures if f[0] != "× llama.cpp alone"]
    if not any(run.get("config", {}).get("processor", "greedy") == "greedy" for run in runs):
        figures = [f for f in figures if f[0] != "same output"]
    return figures


def run_markdown(run: dict[str, Any]) -> str:
    """Every table of one run, with what was run where, as Markdown."""
    overall = run["summary"].get(OVERALL, {})
    methods = [m for m in _main_methods(run) if m["name"] in overall]
    parts = [
        f"Machine: {machine_line(run)}; {versions_line(run)}.  ",
        f"Date: {run.get('created', DASH)}.  ",
        f"Command: `{command_line(run)}`",
    ]
    if run.get("interrupted"):
        parts.append("\n**Interrupted**: the figures cover the prompts finished before Ctrl-C.")
    if not methods:
        parts.append("\nNo prompt was measured.")
        return "\n".join(parts) + "\n"
    figures = _overall_figures([run])
    parts += [
        f"\n**Overall** ({_prompts(run)} prompts)\n",
        markdown_table(
            ["method", *(name for name, _ in figures)],
            ([m["label"], *(cell(overall[m["name"]]) for _, cell in figures)] for m in methods),
        ),
    ]
    labels = {m["name"]: m["label"] for m in methods}
    parts += [
        f"\n{OverCategories(**over).in_words(labels.get(name, name))}."
        for name, over in (run.get("over_llamacpp_alone") or {}).items()
    ]
    categories = _categories(run)
    if categories:
        parts += [
            "\n**× specrepl target-only, by category** (prompts per category: "
            + ", ".join(f"{name} {_prompts(run, name)}" for name in categories)
            + ")\n",
            _speedup_matrix(run, methods, [*categories, OVERALL]),
        ]
    parts += _turn_part(run, methods)
    timed = [m for m in methods if m["family"] == "specrepl" and m["speculative"]]
    if timed:
        parts += [
            "\n**Where the time of specrepl's speculative runs goes** (overall)\n",
            markdown_table(
                ["method", *(name for name, _ in TIME_FIGURES)],
                (
                    [m["label"], *(cell(overall[m["name"]]) for _, cell in TIME_FIGURES)]
                    for m in timed
                ),
            ),
        ]
    sweep = [m for m in run["methods"] if m.get("sweep_gamma") is not None and m["name"] in overall]
    if sweep:
        sweep_figures = [f for f in figures if f[0] != "same output"]
        parts += [
            "\n**Gamma sweep** (overall)\n",
            markdown_table(
                ["γ", *(name for name, _ in sweep_figures)],
                (
                    [m["sweep_gamma"], *(cell(overall[m["name"]]) for _, cell in sweep_figures)]
                    for m in sweep
                ),
            ),
        ]
    return "\n".join([*parts, *_prompts_part(run), *_peer_notes(run)]) + "\n"


def _speedup_matrix(
    run: dict[str, Any],
    methods: Sequence[dict[str, Any]],
    groups: Sequence[str],
    part: str = "summary",
) -> str:
    """Each method's speedup over specrepl target-only (rows) in each group (columns)."""
    return markdown_table(
        ["method", *groups],
        (
            [m["label"], *(_speedup(run, group, m["name"], part) for group in groups)]
            for m in methods
        ),
    )


def _turn_part(run: dict[str, Any], methods: Sequence[dict[str, Any]]) -> list[str]:
    """The speedups by kind of turn, when the prompts were not all short first turns."""
    turns = run.get("summary_by_turn") or {}
    if not set(turns) - {FIRST_TURNS}:
        return []
    counts = ", ".join(f"{group} {_prompts(run, group, 'summary_by_turn')}" for group in turns)
    threshold = run.get("config", {}).get("long_input_tokens", DASH)
    return [
        f"\n**× specrepl target-only, by kind of turn** (prompts: {counts}; a long input has"
        f" ≥ {threshold} prompt tokens)\n",
        _speedup_matrix(run, methods, list(turns), "summary_by_turn"),
    ]


def _prompts_part(run: dict[str, Any]) -> list[str]:
    """Every prompt's row (`prompt_row`), folded; a greedy text that differs in bold."""
    records = run.get("prompts") or []
    if not records:
        return []
    rows = []
    for record in records:
        row = prompt_row(record)
        if record["methods"].get(SPECULATIVE, {}).get("identical_to_target") is False:
            row[-1] = f"**{row[-1]}**"
        rows.append(row)
    return [
        "\n<details><summary>Per prompt: specrepl speculative against target-only</summary>\n",
        markdown_table(PROMPT_HEADER, rows),
        "\n</details>",
    ]


def _peer_notes(run: dict[str, Any]) -> list[str]:
    """The compiled peer's compilation time and the peers that could not run."""
    notes = []
    if run.get("compile_seconds") is not None:
        notes.append(
            "\nHF generate (static cache, torch.compile): the first call, compilation"
            f" included, took {run['compile_seconds']:.1f} s (not in the figures above)."
        )
    if any(method["family"] == "llamacpp" for method in run["methods"]):
        notes.append(f"\n{LLAMACPP_NOTE}")
    for name, reason in (run.get("unavailable") or {}).items():
        notes.append(f"\n{name} did not run: {reason}")
    return notes


# -- several runs side by side ----------------------------------------------------


def _run_names(paths: Sequence[str | Path]) -> list[str]:
    """Each file's name without `.json`; the parent folder too where names repeat."""
    stems = [Path(path).name.removesuffix(".json") for path in paths]
    if len(set(stems)) == len(stems):
        return stems
    return [f"{Path(path).parent.name}/{stem}" for path, stem in zip(paths, stems, strict=True)]


def _method_rows(runs: Sequence[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, shown label) of every main method in any run, in first-seen order; a
    method whose label differs between runs shows each run's label."""
    labels: dict[str, list[str]] = {}
    for run in runs:
        for method in _main_methods(run):
            seen = labels.setdefault(method["name"], [])
            if method["label"] not in seen:
                seen.append(method["label"])
    return [(name, " / ".join(shown)) for name, shown in labels.items()]


def compare_markdown(runs: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    """Several runs side by side, one column per run: what each run was, then each
    overall figure and each method's speedup per category."""
    parts = [
        "**Runs**\n",
        markdown_table(
            ["", *names],
            [
                ["machine", *(machine_line(run) for run in runs)],
                ["versions", *(versions_line(run) for run in runs)],
                ["date", *(run.get("created", DASH) for run in runs)],
                ["command", *(f"`{command_line(run)}`" for run in runs)],
                ["prompts", *(_prompts(run) for run in runs)],
            ],
        ),
    ]
    rows = _method_rows(runs)
    for header, cell in _overall_figures(runs):
        if header not in COMPARED_FIGURES:
            continue
        table = [
            [
                label,
                *(
                    cell(run["summary"][OVERALL][name])
                    if name in run["summary"].get(OVERALL, {})
                    else DASH
                    for run in runs
                ),
            ]
            for name, label in rows
        ]
        table = [row for row in table if any(value != DASH for value in row[1:])]
        if table:
            parts += [f"\n**{header}** (overall)\n", markdown_table(["method", *names], table)]
    categories: list[str] = []
    for run in runs:
        categories += [name for name in _categories(run) if name not in categories]
    for name, label in rows:
        measured_by = sum(name in run["summary"].get(OVERALL, {}) for run in runs)
        if name == TARGET or not categories or measured_by < min(2, len(runs)):
            continue  # a method only one of several runs has: see that run's own tables
        parts += [
            f"\n**{label}: × specrepl target-only by category**\n",
            markdown_table(
                ["category", *names],
                (
                    [
                        category,
                        *(_speedup(run, category, name) for run in runs),
                    ]
                    for category in [*categories, OVERALL]
                ),
            ),
        ]
    return "\n".join(parts) + "\n"


# -- the command line -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`python infer.py compare RUN.json [RUN.json ...]`."""
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN.json",
        help="files written by `bench --json`; one prints its tables, several side by side",
    )


def compare_command(
    args: argparse.Namespace, out: Callable[[str], object], err: Callable[[str], object]
) -> int:
    """Write the Markdown of the runs named on the command line to `out`; 0, or 2
    after a message on `err` when a file is not a bench run."""
    try:
        runs = [load_run(path) for path in args.runs]
    except ValueError as error:
        err(f"compare: {error}\n")
        return 2
    if len(runs) == 1:
        out(run_markdown(runs[0]))
    else:
        out(compare_markdown(runs, _run_names(args.runs)))
    return 0
