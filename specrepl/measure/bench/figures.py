"""What one benchmark measured: the methods, each run's figures, and their summaries.

`MethodRun` is one method's run on one prompt (tokens, the synchronized wall
time around the call, and for specrepl runs the engine's own step events);
`PromptRecord` holds every method's run on one prompt (one user turn: a first
turn or a later one, with the earlier turns and their target-only answers in
its context, and a long input or not); `summarize` turns the records into
figures per category and overall, and `summarize_turns` per kind of turn
(first turns, later turns, long inputs) (`MethodSummary`): medians of
per-prompt figures (tokens/s, speedups as per-prompt ratios), pooled acceptance
and tokens per target step, and the speedup predicted from the run's own
acceptance and cost ratios (Leviathan et al. 2023):
(1 - a^(g+1)) / (1 - a) / (g*c + v), with c the drafter's seconds per drafted
token and v the seconds of a verification step, both over the target's
seconds for a one-token step of the target-only run on the same prompt; a is
the chance that a draft is accepted once the drafts before it were, estimated
as accepted / (accepted + rejections).

Plain arithmetic on recorded runs: no torch, no rich, no model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specrepl.engine.gamma import expected_tokens
from specrepl.engine.output_match import OutputMatch
from specrepl.engine.results import (
    BUDGET_END,
    PROMPT_PASS,
    GenerationResult,
    StepEvent,
    TimedTokens,
)
from specrepl.measure.bench.prompts import BenchPrompt, BenchTurn

__all__ = [
    "FIRST_TURNS",
    "HF_ASSISTED",
    "HF_ASSISTED_MATCHED",
    "HF_COMPILED",
    "HF_GENERATE",
    "HF_LOOKUP",
    "LATER_TURNS",
    "LLAMACPP",
    "LLAMACPP_LOOKUP",
    "LONG_INPUT",
    "LONG_INPUT_TOKENS",
    "OVERALL",
    "SPECULATIVE",
    "TARGET",
    "TURN_GROUPS",
    "Method",
    "MethodRun",
    "MethodSummary",
    "Prediction",
    "PromptRecord",
    "predict_from_steps",
    "predicted_speedup",
    "summarize",
    "summarize_turns",
]

OVERALL = "overall"
"""The summary's name for all prompts together."""

# The kinds of turn summed up apart (`summarize_turns`); a turn is a first or a
# later one, and may also be a long input.
FIRST_TURNS = "first turns"
LATER_TURNS = "later turns"
LONG_INPUT = "long input"
TURN_GROUPS = (FIRST_TURNS, LATER_TURNS, LONG_INPUT)
LONG_INPUT_TOKENS = 512
"""A turn whose prompt (its history included) has at least this many tokens is
a long input, unless `bench --long-input` says otherwise."""

# The method names; a sweep adds `speculative_g{N}` for each gamma N.
TARGET = "target"
SPECULATIVE = "speculative"
HF_GENERATE = "hf_generate"
HF_COMPILED = "hf_compiled"
HF_ASSISTED = "hf_assisted"
HF_ASSISTED_MATCHED = "hf_assisted_matched"
HF_LOOKUP = "hf_lookup"
LLAMACPP = "llamacpp"
LLAMACPP_LOOKUP = "llamacpp_lookup"


@dataclass(frozen=True)
class Method:
    """One way of generating that the benchmark times.

    `settings` are what the method was given (recorded in the JSON); a
    speculative specrepl method has drafts, acceptance and a prediction.
    """

    name: str
    label: str
    family: Literal["specrepl", "hf", "llamacpp"]
    speculative: bool = False
    sweep_gamma: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Prediction:
    """The speedup over target-only expected from measured acceptance and costs.

    `alpha` is the per-draft acceptance of the formula (accepted over accepted
    plus rejections); `draft_cost` (c) and `verify_cost` (v) are in units of
    the target's one-token step; `mean_gamma` is the mean number of drafts per
    step and `tokens_per_step` the expected tokens per verification step.
    """

    alpha: float
    mean_gamma: float
    draft_cost: float
    verify_cost: float
    tokens_per_step: float
    speedup: float


def predicted_speedup(
    acceptance: float, gamma: float, draft_cost: float, verify_cost: float
) -> float:
    """(1 - a^(g+1)) / (1 - a) / (g*c + v) (Leviathan et al. 2023): expected tokens per
    verification step over its cost in one-token target steps."""
    if acceptance >= 1.0:
        tokens = gamma + 1.0
    else:
        tokens = (1.0 - acceptance ** (gamma + 1)) / (1.0 - acceptance)
    return tokens / (gamma * draft_cost + verify_cost)


def _alpha(accepted: int, rejections: int) -> float:
    """Per-draft acceptance: each step is `accepted` successes, then a failure
    unless every draft was accepted (the maximum-likelihood estimate for
    independent drafts)."""
    trials = accepted + rejections
    return accepted / trials if trials else 0.0


def predict_from_steps(
    speculative: Sequence[StepEvent], target_only: Sequence[StepEvent]
) -> Prediction | None:
    """The prediction for one speculative run from its steps and the same prompt's
    target-only steps.

    The first step of each run is left out of the costs (it processes the
    prompt). A gamma that changes from step to step (a policy) is handled per
    step: expected tokens are averaged over steps with each step's own draft
    count, which for a fixed gamma is exactly the formula above. None when
    either run has no decoding step after the first.
    """
    one_token = [event.target_seconds for event in target_only[1:]]
    steps = list(speculative[1:])
    if not one_token or not steps:
        return None
    step_seconds = statistics.fmean(one_token)
    if step_seconds <= 0:
        return None
    alpha = _alpha(
        sum(event.accepted for event in speculative),
        sum(1 for event in speculative if event.accepted < event.gamma),
    )
    drafted_later = sum(event.gamma for event in steps)
    draft_seconds = sum(event.draft_seconds for event in steps)
    draft_cost = draft_seconds / drafted_later / step_seconds if drafted_later else 0.0
    verify_cost = statistics.fmean(event.target_seconds for event in steps) / step_seconds
    mean_gamma = statistics.fmean(event.gamma for event in steps)
    tokens = statistics.fmean(expected_tokens(alpha, event.gamma) for event in steps)
    cost = mean_gamma * draft_cost + verify_cost
    if cost <= 0:
        return None
    return Prediction(
        alpha=alpha,
        mean_gamma=mean_gamma,
        draft_cost=draft_cost,
        verify_cost=verify_cost,
        tokens_per_step=tokens,
        speedup=tokens / cost,
    )


@dataclass
class MethodRun(TimedTokens):
    """One method's run on one prompt: its tokens and the timings around it.

    `seconds` is the wall time of the whole call, read with a synchronized
    clock, the same way for every method. For specrepl runs `engine_seconds`
    is the engine's own active time and `draft_seconds`/`target_seconds`
    the time inside the drafter and the target; the rest is `other_seconds`.
    `match` compares the tokens with the target-only run's (every run but
    target-only's); `identical` and `first_mismatch` read it for greedy runs.
    `reused_prompt_tokens` (specrepl runs) counts the prompt tokens a cache
    kept from the previous turn held (`bench --chat`).
    """

    method: str
    token_ids: list[int]
    seconds: float
    stop_reason: str | None = None
    engine_seconds: float | None = None
    steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    rejections: int | None = None
    draft_seconds: float | None = None
    target_seconds: float | None = None
    decode_seconds: float | None = None
    decode_tokens: int | None = None
    reused_prompt_tokens: int | None = None
    match: OutputMatch | None = None
    speedup_vs_target: float | None = None
    speedup_vs_hf: float | None = None
    draft_cost_vs_target: float | None = None
    prediction: Prediction | None = None
    events: list[StepEvent] = field(default_factory=list, repr=False)

    @property
    def identical(self) -> bool | None:
        """Greedy runs: whether the tokens equal target-only's (None when sampling)."""
        if self.match is None or not self.match.greedy:
            return None
        return self.match.identical

    @property
    def first_mismatch(self) -> int | None:
        """Greedy runs: the first new token where they differ from target-only's."""
        if self.match is None or not self.match.greedy:
            return None
        return self.match.first_difference

    @property
    def acceptance(self) -> float | None:
        if not self.drafted or self.accepted is None:
            return None
        return self.accepted / self.drafted

    @property
    def alpha(self) -> float | None:
        """The per-draft acceptance of the prediction formula."""
        if not self.drafted or self.accepted is None or self.rejections is None:
            return None
        return _alpha(self.accepted, self.rejections)

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target forward pass (the target's own token included)."""
        if self.drafted is None or not self.steps:
            return None
        return self.new_tokens / self.steps

    @property
    def other_seconds(self) -> float | None:
        """Time outside the two models' forward passes (specrepl runs only)."""
        if self.draft_seconds is None or self.target_seconds is None:
            return None
        return max(0.0, self.seconds - self.draft_seconds - self.target_seconds)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens/s after the first step (which processes the prompt)."""
        if not self.decode_seconds or self.decode_tokens is None:
            return None
        return self.decode_tokens / self.decode_seconds

    @property
    def fallback_steps(self) -> int | None:
        """Steps where the gamma policy chose the target alone (gamma 0)."""
        if self.drafted is None:
            return None
        # the prompt pass and the budget's last token draft nothing by the loop's rule
        return sum(
            1
            for event in self.events
            if event.requested_gamma == 0 and event.choice not in (PROMPT_PASS, BUDGET_END)
        )

    @property
    def empty_draft_steps(self) -> int | None:
        """Steps where drafts were asked for but the drafter had none."""
        if self.drafted is None:
            return None
        return sum(1 for event in self.events if event.requested_gamma > 0 and event.gamma == 0)

    @property
    def first_drafts(self) -> tuple[int, int] | None:
        """(steps whose first draft was accepted, steps with at least one draft)."""
        if self.drafted is None:
            return None
        drafted = [event for event in self.events if event.gamma > 0]
        return sum(1 for event in drafted if event.accepted > 0), len(drafted)

    @property
    def seconds_per_draft(self) -> float | None:
        """Drafter seconds per drafted token after the first step (which also
        reads the prompt), pooled over the run."""
        later = [event for event in self.events[1:] if event.gamma > 0]
        drafted = sum(event.gamma for event in later)
        if self.drafted is None or not drafted:
            return None
        return sum(event.draft_seconds for event in later) / drafted

    @property
    def target_step_seconds(self) -> float | None:
        """Median seconds of the target's forward passes after the first step
        (for target-only decoding: the cost of one token)."""
        later = [event.target_seconds for event in self.events[1:]]
        return statistics.median(later) if later else None

    @property
    def measured_over_predicted(self) -> float | None:
        if self.prediction is None or self.speedup_vs_target is None:
            return None
        return self.speedup_vs_target / self.prediction.speedup

    @classmethod
    def from_result(
        cls, method: str, result: GenerationResult, seconds: float, events: list[StepEvent]
    ) -> MethodRun:
        speculative = result.kind == "speculative"
        first = events[0] if events else None
        return cls(
            method=method,
            token_ids=list(result.token_ids),
            seconds=seconds,
            stop_reason=result.stop_reason,
            engine_seconds=result.seconds,
            steps=result.steps,
            drafted=result.drafted if speculative else None,
            accepted=result.accepted if speculative else None,
            rejections=(
                sum(1 for event in events if event.accepted < event.gamma) if speculative else None
            ),
            draft_seconds=result.draft_seconds,
            target_seconds=result.target_seconds,
            decode_seconds=None if first is None else result.seconds - first.seconds_since_start,
            decode_tokens=None if first is None else result.new_tokens - len(first.appended),
            reused_prompt_tokens=result.reused_prompt_tokens,
            events=events,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "stop_reason": self.stop_reason,
            "identical_to_target": self.identical,
            "first_mismatch": self.first_mismatch,
            "output_vs_target": None if self.match is None else self.match.describe(),
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "speedup_vs_target": self.speedup_vs_target,
            "speedup_vs_hf_generate": self.speedup_vs_hf,
            "engine_seconds": self.engine_seconds,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "rejections": self.rejections,
            "acceptance": self.acceptance,
            "alpha": self.alpha,
            "mean_accepted_length": self.mean_accepted_length,
            "draft_seconds": self.draft_seconds,
            "target_seconds": self.target_seconds,
            "other_seconds": self.other_seconds,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "prediction": None if self.prediction is None else asdict(self.prediction),
            "measured_over_predicted": self.measured_over_predicted,
            "first_drafts_accepted": None if self.first_drafts is None else self.first_drafts[0],
            "first_drafts": None if self.first_drafts is None else self.first_drafts[1],
            "seconds_per_draft": self.seconds_per_draft,
            "target_step_seconds": self.target_step_seconds,
            "draft_cost_vs_target": self.draft_cost_vs_target,
            "drafts_per_step": (
                [event.gamma for event in self.events] if self.drafted is not None else None
            ),
            "accepted_per_step": (
                [event.accepted for event in self.events] if self.drafted is not None else None
            ),
            "fallback_steps": self.fallback_steps,
            "empty_draft_steps": self.empty_draft_steps,
            "requested_gamma_per_step": (
                [event.requested_gamma for event in self.events]
                if self.drafted is not None
                else None
            ),
            "token_ids": list(self.token_ids),
        }


@dataclass
class PromptRecord:
    """Every method's run on one prompt (one user turn), in the order they ran.

    `turn` is which of its question's turns it is (from 1); `earlier_turns`
    counts the turns asked before it in its conversation (0: a first turn),
    `history_turns` those still in its context (the oldest go when the chat
    would overflow it); `long_input`: its prompt had at least the benchmark's
    long-input tokens.
    """

    prompt: BenchPrompt
    prompt_tokens: int
    max_new_tokens: int
    order: list[str]
    runs: dict[str, MethodRun]
    text: str = ""
    """The target-only answer, decoded."""
    turn: int = 1
    earlier_turns: int = 0
    history_turns: int = 0
    long_input: bool = False

    @property
    def key(self) -> str:
        """`writing/81#2`: the question and, when it has several, the turn."""
        return BenchTurn(self.prompt, self.turn).key

    @property
    def first_turn(self) -> bool:
        return self.earlier_turns == 0

    @property
    def groups(self) -> list[str]:
        """The kinds of turn (`TURN_GROUPS`) this prompt counts in."""
        kind = FIRST_TURNS if self.first_turn else LATER_TURNS
        return [kind, LONG_INPUT] if self.long_input else [kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "question_id": self.prompt.question_id,
            "category": self.prompt.category,
            "turn": self.turn,
            "first_turn": self.first_turn,
            "earlier_turns": self.earlier_turns,
            "history_turns": self.history_turns,
            "long_input": self.long_input,
            "groups": self.groups,
            "prompt_tokens": self.prompt_tokens,
            "max_new_tokens": self.max_new_tokens,
            "order": list(self.order),
            "target_text": self.text,
            "methods": {name: run.to_dict() for name, run in self.runs.items()},
        }


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
    draft_cost_vs_target: float | None = None
    """Median over prompts of (drafter seconds per drafted token) / (seconds of
    one target-only forward pass)."""


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
    return MethodSummary(
        method=method,
        prompts=len(runs),
        tokens_per_second=_median(run.tokens_per_second for run in runs),
        speedup_vs_target=_median(run.speedup_vs_target for run in runs),
        speedup_vs_hf=_median(run.speedup_vs_hf for run in runs),
        acceptance=accepted / drafted if drafted else None,
        alpha=_alpha(accepted, rejections) if drafted else None,
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
        draft_cost_vs_target=_median(run.draft_cost_vs_target for run in runs),
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
