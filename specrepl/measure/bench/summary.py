"""A benchmark's figures summed up: per category and overall, and per kind of turn.

`summarize` turns the records into figures per category and overall, and
`summarize_turns` per kind of turn (first turns, later turns, long inputs)
(`MethodSummary`): medians of per-prompt figures (tokens/s, speedups as
per-prompt ratios, the predicted speedup), pooled acceptance and tokens per
target step, and pooled shares of time and steps. `over_llamacpp_by_category`
gives the figure a speedup over llama.cpp alone is stated by: the median over
categories of each category's median, and the lowest category.

Plain arithmetic on recorded runs: no torch, no rich, no model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from specrepl.measure.bench.figures import TURN_GROUPS, Method, MethodRun, PromptRecord
from specrepl.measure.bench.prediction import per_draft_acceptance

__all__ = [
    "OVERALL",
    "MethodSummary",
    "OverCategories",
    "over_llamacpp_by_category",
    "summarize",
    "summarize_turns",
]

OVERALL = "overall"
"""The summary's name for all prompts together."""


@dataclass(frozen=True)
class MethodSummary:
    """One method's figures over a set of prompts.

    Tokens/s, speedups, predictions and measured/predicted are medians of the
    per-prompt figures; acceptance (accepted / drafted), alpha (accepted /
    (accepted + rejections)) and tokens per step are pooled (sums over the
    prompts); the time shares are pooled over specrepl runs.
    `identical` counts the prompts whose tokens equal target-only's, out of
    `compared` (greedy runs only).
    """

    method: str
    prompts: int
    tokens_per_second: float | None
    speedup_vs_target: float | None
    speedup_vs_hf: float | None
    acceptance: float | None
    alpha: float | None
    mean_accepted_length: float | None
    predicted_speedup: float | None
    measured_over_predicted: float | None
    identical: int
    compared: int
    draft_share: float | None
    target_share: float | None
    other_share: float | None
    fallback_share: float | None = None
    """Pooled share of steps where the policy chose the target alone."""
    empty_draft_share: float | None = None
    """Pooled share of steps where the drafter had nothing to propose."""
    first_draft_acceptance: float | None = None
    """Pooled share of drafting steps whose first draft was accepted."""
    first_draft_acceptance_by_source: dict[str, float] | None = None
    """The same for each draft source (a hybrid's prompt lookup and its model
    or head apart), with the share of drafting steps each source had."""
    drafting_steps_by_source: dict[str, float] | None = None
    draft_cost_vs_target: float | None = None
    """Median over prompts of (drafter seconds per drafted token) / (seconds of
    one target-only forward pass)."""
    acceptance_by_position: tuple[float, ...] | None = None
    """Pooled share of draft j accepted where draft j was proposed and the
    ones before it accepted, for j = 1, 2, ... (positions tried 20 times or more)."""
    speedup_vs_llamacpp: float | None = None
    """Median over prompts of tokens/s over the faster llama.cpp-alone run."""


@dataclass(frozen=True)
class OverCategories:
    """One method's speedup over llama.cpp alone across categories: the median
    of the categories' medians, and the lowest category with its median."""

    median: float
    lowest_category: str
    lowest: float
    categories: int

    def in_words(self, label: str) -> str:
        """The figure as the terminal and the Markdown tables state it."""
        return (
            f"{label} over llama.cpp alone (the faster of flash attention off and on, prompt"
            f" by prompt): median over {self.categories} categories {self.median:.2f}×,"
            f" lowest {self.lowest_category} {self.lowest:.2f}×"
        )


def over_llamacpp_by_category(
    summary: dict[str, dict[str, MethodSummary]], method: str
) -> OverCategories | None:
    """`method`'s speedup over llama.cpp alone, category by category (`summarize`'s
    groups but `overall`); None where no category has the figure."""
    medians = {
        name: figures[method].speedup_vs_llamacpp
        for name, figures in summary.items()
        if name != OVERALL and method in figures
    }
    present = {name: value for name, value in medians.items() if value is not None}
    if not present:
        return None
    lowest = min(present, key=present.__getitem__)
    return OverCategories(
        median=statistics.median(present.values()),
        lowest_category=lowest,
        lowest=present[lowest],
        categories=len(present),
    )


def _by_source(runs: list[MethodRun]) -> tuple[dict[str, float], dict[str, float]] | None:
    """Pooled over `runs`: each source's first-draft acceptance and its share
    of the drafting steps; None where nothing was drafted."""
    pooled: dict[str, list[int]] = {}
    for run in runs:
        for source, (taken, tried) in (run.first_drafts_by_source or {}).items():
            counts = pooled.setdefault(source, [0, 0])
            counts[0] += taken
            counts[1] += tried
    steps = sum(tried for _, tried in pooled.values())
    if not steps:
        return None
    acceptance = {source: taken / tried for source, (taken, tried) in sorted(pooled.items())}
    shares = {source: tried / steps for source, (_, tried) in sorted(pooled.items())}
    return acceptance, shares


MIN_POSITION_TRIES = 20
"""A draft position's acceptance is reported when it was tried this often."""


def _by_position(runs: list[MethodRun]) -> tuple[float, ...] | None:
    pooled: dict[int, list[int]] = {}
    for run in runs:
        for j, (taken, tried) in enumerate(run.position_drafts or []):
            total = pooled.setdefault(j, [0, 0])
            total[0] += taken
            total[1] += tried
    shares = []
    for j in sorted(pooled):
        taken, tried = pooled[j]
        if tried < MIN_POSITION_TRIES:
            break
        shares.append(taken / tried)
    return tuple(shares) if shares else None


def _median(values: Iterable[float | None]) -> float | None:
    present = [value for value in values if value is not None and math.isfinite(value)]
    return statistics.median(present) if present else None


def _summary(method: str, runs: list[MethodRun]) -> MethodSummary:
    drafted = sum(run.drafted or 0 for run in runs)
    accepted = sum(run.accepted or 0 for run in runs)
    rejections = sum(run.rejections or 0 for run in runs)
    speculative = any(run.drafted is not None for run in runs)
    steps = sum(run.steps or 0 for run in runs)
    timed = [run for run in runs if run.draft_seconds is not None]
    seconds = sum(run.seconds for run in timed)

    def share(part: Callable[[MethodRun], float | None]) -> float | None:
        if not timed or seconds <= 0:
            return None
        return sum(part(run) or 0.0 for run in timed) / seconds

    compared = [run for run in runs if run.identical is not None]
    firsts = [run.first_drafts for run in runs if run.first_drafts is not None]
    first_taken = sum(taken for taken, _ in firsts)
    first_tried = sum(tried for _, tried in firsts)
    by_source = _by_source(runs)
    return MethodSummary(
        method=method,
        prompts=len(runs),
        tokens_per_second=_median(run.tokens_per_second for run in runs),
        speedup_vs_target=_median(run.speedup_vs_target for run in runs),
        speedup_vs_hf=_median(run.speedup_vs_hf for run in runs),
        acceptance=accepted / drafted if drafted else None,
        alpha=per_draft_acceptance(accepted, rejections) if drafted else None,
        mean_accepted_length=(
            sum(run.new_tokens for run in runs) / steps if speculative and steps else None
        ),
        predicted_speedup=_median(
            run.prediction.speedup if run.prediction is not None else None for run in runs
        ),
        measured_over_predicted=_median(run.measured_over_predicted for run in runs),
        identical=sum(1 for run in compared if run.identical),
        compared=len(compared),
        draft_share=share(lambda run: run.draft_seconds),
        target_share=share(lambda run: run.target_seconds),
        other_share=share(lambda run: run.other_seconds),
        fallback_share=(
            sum(run.fallback_steps or 0 for run in runs) / steps if speculative and steps else None
        ),
        empty_draft_share=(
            sum(run.empty_draft_steps or 0 for run in runs) / steps
            if speculative and steps
            else None
        ),
        first_draft_acceptance=first_taken / first_tried if first_tried else None,
        first_draft_acceptance_by_source=by_source[0] if by_source else None,
        drafting_steps_by_source=by_source[1] if by_source else None,
        draft_cost_vs_target=_median(run.draft_cost_vs_target for run in runs),
        acceptance_by_position=_by_position(runs),
        speedup_vs_llamacpp=_median(run.speedup_vs_llamacpp for run in runs),
    )


def _by_group(
    groups: dict[str, list[PromptRecord]], methods: Sequence[Method]
) -> dict[str, dict[str, MethodSummary]]:
    """Each group's figures, per method (a method left out of a prompt is left out there)."""
    return {
        name: {
            method.name: _summary(
                method.name,
                [record.runs[method.name] for record in members if method.name in record.runs],
            )
            for method in methods
        }
        for name, members in groups.items()
    }


def summarize(
    records: Sequence[PromptRecord], methods: Sequence[Method]
) -> dict[str, dict[str, MethodSummary]]:
    """Figures per category (in the order first met) and `overall`, per method."""
    groups: dict[str, list[PromptRecord]] = {}
    for record in records:
        groups.setdefault(record.prompt.category, []).append(record)
    if records:
        groups[OVERALL] = list(records)
    return _by_group(groups, methods)


def summarize_turns(
    records: Sequence[PromptRecord], methods: Sequence[Method]
) -> dict[str, dict[str, MethodSummary]]:
    """Figures per kind of turn (first turns, later turns, long input; the
    kinds no prompt is of are left out), per method."""
    groups: dict[str, list[PromptRecord]] = {
        name: [record for record in records if name in record.groups] for name in TURN_GROUPS
    }
    return _by_group({name: members for name, members in groups.items() if members}, methods)
