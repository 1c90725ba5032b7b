"""What a chat session reports: the events of an answer while it runs, the
finished `Answer` with one `Run` per generator (and whether the speculative
run's tokens equal the target-only run's), and the setting changes a command
made.

Plain data without torch, so that the REPL's front end (`app/render/`, `app/commands/`)
can be imported and draw its first screen while the models are still loading;
session.py produces these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from specrepl.chat.settings import Settings
from specrepl.engine.output_match import OutputMatch, TieCheck, compare_outputs
from specrepl.engine.results import GenerationResult, StepEvent

__all__ = [
    "GENERATORS",
    "Answer",
    "Change",
    "EventCallback",
    "GeneratorName",
    "Message",
    "PromptMode",
    "Run",
    "RunFinished",
    "RunStarted",
    "RunStep",
    "SessionEvent",
    "StepPieces",
]

GeneratorName = Literal["speculative", "target", "drafter"]
PromptMode = Literal["chat", "raw"]
Message = dict[str, str]

#: The generators in the order they run, each with the setting that switches it on.
GENERATORS: dict[GeneratorName, str] = {
    "speculative": "speculative",
    "target": "target_gen",
    "drafter": "drafter_gen",
}


@dataclass(frozen=True)
class Change:
    """One setting that a command changed."""

    name: str
    old: Any
    new: Any


@dataclass(frozen=True)
class StepPieces:
    """The tokens of one speculative step, decoded one by one (for the debug view).

    `accepted` are the drafts the target kept, `rejected` the first draft it
    refused, and `target` the token the target chose itself: the correction at
    the rejected position, or the bonus token when every draft was accepted.
    """

    accepted: tuple[str, ...]
    rejected: str | None
    target: str | None


@dataclass(frozen=True)
class RunStarted:
    """A generator is about to run."""

    generator: GeneratorName
    prompt_tokens: int
    settings: Settings


@dataclass(frozen=True)
class RunStep:
    """One decoding step of a running generator."""

    generator: GeneratorName
    step: StepEvent
    text: str
    """What the visible (special-token free) answer grew by in this step."""
    pieces: StepPieces | None
    """The step's tokens one by one; only filled when `Settings.debug` is on."""


@dataclass
class Run:
    """One generator's finished (or interrupted) run."""

    generator: GeneratorName
    result: GenerationResult
    text: str

    @property
    def interrupted(self) -> bool:
        return self.result.stop_reason == "interrupted"

    def to_dict(self) -> dict[str, object]:
        figures = self.result.to_dict()
        figures["text"] = self.text
        figures["generator"] = self.generator
        figures["interrupted"] = self.interrupted
        return figures


@dataclass(frozen=True)
class RunFinished:
    """A generator has finished, or was interrupted (see `run.interrupted`)."""

    generator: GeneratorName
    run: Run


SessionEvent = Union[RunStarted, RunStep, RunFinished]  # noqa: UP007 - a runtime alias
EventCallback = Callable[[SessionEvent], None]


@dataclass
class Answer:
    """Everything one prompt produced: a run per enabled generator, or a refusal."""

    prompt: str
    mode: PromptMode
    settings: Settings
    prompt_tokens: int = 0
    runs: dict[GeneratorName, Run] = field(default_factory=dict)
    refusal: str | None = None
    notices: list[str] = field(default_factory=list)
    tie: TieCheck | None = None
    """The target asked where a greedy speculative run parted from it (`near_ties`)."""

    @property
    def interrupted(self) -> bool:
        return any(run.interrupted for run in self.runs.values())

    @property
    def reply(self) -> Run | None:
        """The run whose text answers the prompt (speculative, else target, else drafter)."""
        return next(iter(self.runs.values()), None)

    def speedup_of(self, generator: GeneratorName) -> float | None:
        """`generator`'s tokens/s over the target-only run's; None unless both completed."""
        run, baseline = self.runs.get(generator), self.runs.get("target")
        if run is None or baseline is None or run.interrupted or baseline.interrupted:
            return None
        fast, slow = run.result.tokens_per_second, baseline.result.tokens_per_second
        if fast is None or not slow:
            return None
        return fast / slow

    @property
    def speedup(self) -> float | None:
        """Speculative tokens/s over target tokens/s (None when either did not complete)."""
        return self.speedup_of("speculative")

    @property
    def output_match(self) -> OutputMatch | None:
        """The speculative run's tokens against the target-only run's (greedy: they
        must be identical); None unless both ran to the end."""
        run, baseline = self.runs.get("speculative"), self.runs.get("target")
        if run is None or baseline is None or run.interrupted or baseline.interrupted:
            return None
        return compare_outputs(
            run.result.token_ids,
            baseline.result.token_ids,
            greedy=self.settings.processor == "greedy",
            tie=self.tie,
        )

    def output_match_dict(self) -> dict[str, object] | None:
        """`output_match` as JSON (None when there is nothing to compare)."""
        match = self.output_match
        return None if match is None else match.to_dict()

    def to_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "mode": self.mode,
            "settings": self.settings.as_dict(),
            "prompt_tokens": self.prompt_tokens,
            "refusal": self.refusal,
            "interrupted": self.interrupted,
            "runs": {name: run.to_dict() for name, run in self.runs.items()},
            "speedup": self.speedup,
            "speculative_vs_target": self.output_match_dict(),
        }
