"""What one benchmark measured: the methods, and each run's figures.

`MethodRun` is one method's run on one prompt (tokens, the synchronized wall
time around the call, and for specrepl runs the engine's own step events,
with the speedup `prediction.py` predicts from them); `PromptRecord` holds
every method's run on one prompt (one user turn: a first turn or a later one,
with the earlier turns and their target-only answers in its context, and a
long input or not); `compare_with_target` gives each run of a prompt its
figures against the target-only run's. `summary.py` sums them up.

Plain arithmetic on recorded runs: no torch, no rich, no model.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specrepl.engine.output_match import OutputMatch, compare_outputs
from specrepl.engine.results import (
    BUDGET_END,
    PROMPT_PASS,
    GenerationResult,
    StepEvent,
    TimedTokens,
)
from specrepl.measure.bench.prediction import Prediction, per_draft_acceptance, predict_from_steps
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
    "LLAMACPP_ALONE",
    "LLAMACPP_EXACT",
    "LLAMACPP_EXACT_FLASH",
    "LLAMACPP_LOOKUP",
    "LONG_INPUT",
    "LONG_INPUT_TOKENS",
    "SPECULATIVE",
    "TARGET",
    "TURN_GROUPS",
    "Method",
    "MethodRun",
    "PromptRecord",
    "compare_with_target",
]

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
LLAMACPP_EXACT = "llamacpp_exact"
LLAMACPP_EXACT_FLASH = "llamacpp_exact_flash"
LLAMACPP_ALONE = (LLAMACPP_EXACT, LLAMACPP_EXACT_FLASH)
"""llama.cpp alone on the target's exact weights, flash attention off and on:
speedups over llama.cpp alone are over the faster of the two on each prompt."""


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
    speedup_vs_llamacpp: float | None = None
    """Over the faster llama.cpp-alone run of the same prompt (`LLAMACPP_ALONE`)."""
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
        return per_draft_acceptance(self.accepted, self.rejections)

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
        by_source = self.first_drafts_by_source
        if by_source is None:
            return None
        return sum(t for t, _ in by_source.values()), sum(n for _, n in by_source.values())

    @property
    def first_drafts_by_source(self) -> dict[str, tuple[int, int]] | None:
        """`first_drafts` for each draft source ("lookup", "head", "model",
        ...): a hybrid's sources are told apart."""
        if self.drafted is None:
            return None
        counts: dict[str, tuple[int, int]] = {}
        for event in self.events:
            if event.gamma > 0:
                taken, tried = counts.get(event.source or "drafter", (0, 0))
                counts[event.source or "drafter"] = (taken + (event.accepted > 0), tried + 1)
        return counts

    @property
    def position_drafts(self) -> list[tuple[int, int]] | None:
        """Per draft position j (1, 2, ...): (steps whose draft j was accepted,
        steps that drafted j tokens or more and accepted the j - 1 before it)."""
        if self.drafted is None:
            return None
        longest = max((event.gamma for event in self.events), default=0)
        counts = []
        for j in range(1, longest + 1):
            tried = [e for e in self.events if e.gamma >= j and e.accepted >= j - 1]
            counts.append((sum(1 for e in tried if e.accepted >= j), len(tried)))
        return counts

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
            "speedup_vs_llamacpp_alone": self.speedup_vs_llamacpp,
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
            "first_drafts_by_source": self.first_drafts_by_source,
            "position_drafts": self.position_drafts,
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


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or not bottom:
        return None
    return top / bottom


def compare_with_target(runs: dict[str, MethodRun], *, greedy: bool) -> None:
    """Give each of one prompt's runs its figures against that prompt's
    target-only run: tokens against target-only's, speedups over it (and over
    plain HF `generate()` and over the faster llama.cpp-alone run when those
    ran), and for a speculative run the prediction and its drafter's cost per
    draft over a target step."""
    target = runs[TARGET]
    hf = runs.get(HF_GENERATE)
    alone = [runs[name].tokens_per_second for name in LLAMACPP_ALONE if name in runs]
    fastest_alone = max(alone) if alone else None
    for name, run in runs.items():
        if name != TARGET:
            run.match = compare_outputs(run.token_ids, target.token_ids, greedy=greedy)
        run.speedup_vs_target = _ratio(run.tokens_per_second, target.tokens_per_second)
        if hf is not None:
            run.speedup_vs_hf = _ratio(run.tokens_per_second, hf.tokens_per_second)
        run.speedup_vs_llamacpp = _ratio(run.tokens_per_second, fastest_alone)
        if run.drafted is not None:
            run.prediction = predict_from_steps(run.events, target.events)
            run.draft_cost_vs_target = _ratio(run.seconds_per_draft, target.target_step_seconds)
