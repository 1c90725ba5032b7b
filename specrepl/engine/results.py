"""What the generators report: one event per decoding step and one result per run.

The generators in `generation.py` yield `StepEvent`s while they decode and the
REPL or benchmark streams them; `GenerationResult` is the summary of a finished
(or interrupted) run. Both are plain data: this module knows nothing about
models, tokenizers or rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

StopReason = Literal["eos", "length", "context", "interrupted"]
GeneratorKind = Literal["speculative", "autoregressive"]


PROMPT_PASS = "the target's prompt pass"
"""A step's `choice` when the loop itself drafts nothing: the first step, whose
token comes from the target's prompt pass at the target's own pace."""
BUDGET_END = "the budget's last token"
"""A step's `choice` when only one token is left to generate: nothing to draft."""


@dataclass(frozen=True)
class StepEvent:
    """One decoding step: a target forward pass and the tokens it settled.

    For a speculative step, `drafts` are the drafter's proposals, the first
    `accepted` of them were kept, and `appended` is what the sequence grew by:
    the accepted drafts followed by the target's own token (the correction at
    the first rejected position, or the bonus token when all were accepted).
    For an autoregressive step `drafts` is empty and `appended` has one token.
    `requested_gamma` is what the gamma policy asked for; a drafter may propose
    fewer (a confidence stop, no n-gram match, the end of the budget).
    `appended` is already cut at an end token and at the length budget.

    `source` names what proposed the drafts ("model", "lookup", "head", ...;
    empty when nothing was drafted); `read_seconds` is the part of
    `draft_seconds` a drafter spent reading `read_tokens` context tokens it
    had not seen (its catch-up before the first draft), and `import_seconds`
    the part it spent taking the target's keys and values for
    `imported_tokens` positions instead of reading them; `choice` says why
    the gamma policy chose this source and gamma, with the costs it used;
    `positions` is how many positions the sequence held when the step began
    (the context its passes attend over; 0 where not known).
    """

    drafts: tuple[int, ...]
    accepted: int
    appended: tuple[int, ...]
    draft_seconds: float
    target_seconds: float
    seconds_since_start: float
    requested_gamma: int = 0
    source: str = ""
    read_seconds: float = 0.0
    read_tokens: int = 0
    choice: str = ""
    import_seconds: float = 0.0
    imported_tokens: int = 0
    positions: int = 0

    @property
    def rejected(self) -> int | None:
        """The first draft the target refused, if any."""
        return self.drafts[self.accepted] if self.accepted < len(self.drafts) else None

    @property
    def gamma(self) -> int:
        return len(self.drafts)


@dataclass(frozen=True)
class Offer:
    """What one draft source can propose at a step, before it is asked to.

    `drafts`: at most this many tokens; `unread`: context tokens the source
    must read before its first draft (0 for a source that reads nothing);
    `tokens`: the draft itself where it is known in advance (a deterministic
    source such as prompt lookup), so a policy can also score it on the steps
    where another source was used; `profile`: what the source knows of this
    draft that sets its chance apart from its others (prompt lookup: the
    length class of the match it copies after, "match 8-15"), so that a
    policy can keep acceptance per profile ("" for none)."""

    source: str
    drafts: int
    unread: int = 0
    tokens: tuple[int, ...] | None = None
    profile: str = ""


class TimedTokens:
    """The figures of any timed generation: its new tokens, and tokens per
    second over `seconds` (the engine's active time for `GenerationResult`,
    the wall time around the call for a benchmark run)."""

    token_ids: list[int]
    seconds: float

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None


@dataclass
class GenerationResult(TimedTokens):
    """Summary of one generation run; token counts are tokens, never characters."""

    kind: GeneratorKind
    prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    reused_prompt_tokens: int = 0
    """Prompt tokens a kept cache already held (`PromptCache`): not fed again."""
    text: str | None = None
    seconds: float = 0.0
    time_to_first_token: float | None = None
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_length_histogram: list[int] = field(default_factory=list)
    stop_reason: StopReason = "length"
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    """Drafts proposed by each source ("model", "lookup", ...)."""
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    read_tokens: int = 0
    """Context tokens the drafter read before drafting (its catch-up reads)."""
    read_seconds: float = 0.0
    imported_tokens: int = 0
    """Positions whose keys and values the drafter took from the target instead of reading."""
    import_seconds: float = 0.0
    choices: list[tuple[str, int, int, str]] = field(default_factory=list)
    """Per step: the source, drafts, accepted drafts, and why the policy chose them."""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted drafts / drafted tokens (None when nothing was drafted)."""
        if self.kind != "speculative" or self.drafted == 0:
            return None
        return self.accepted / self.drafted

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens gained per target forward pass, the target's own token included."""
        if self.kind != "speculative" or self.steps == 0:
            return None
        return self.new_tokens / self.steps

    @property
    def acceptance_per_position(self) -> list[float | None]:
        """Share of the drafts at each position that the target accepted."""
        return [
            accepted / drafted if drafted else None
            for accepted, drafted in zip(
                self.accepted_per_position, self.drafted_per_position, strict=True
            )
        ]

    @property
    def other_seconds(self) -> float:
        """Time spent outside the two models' forward passes."""
        return max(0.0, self.seconds - self.draft_seconds - self.target_seconds)

    def record(self, event: StepEvent) -> None:
        """Fold one step into the running totals."""
        self.steps += 1
        self.token_ids.extend(event.appended)
        self.draft_seconds += event.draft_seconds
        self.target_seconds += event.target_seconds
        if self.time_to_first_token is None and event.appended:
            self.time_to_first_token = event.seconds_since_start
        if self.kind == "speculative":
            self.choices.append((event.source, event.gamma, event.accepted, event.choice))
            self.read_tokens += event.read_tokens
            self.read_seconds += event.read_seconds
            self.imported_tokens += event.imported_tokens
            self.import_seconds += event.import_seconds
        if self.kind == "speculative" and event.gamma > 0:
            self.drafted += event.gamma
            self.accepted += event.accepted
            source = event.source or "drafter"
            self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + event.gamma
            self.accepted_by_source[source] = (
                self.accepted_by_source.get(source, 0) + event.accepted
            )
            while len(self.accepted_per_position) < event.gamma:
                self.accepted_per_position.append(0)
                self.drafted_per_position.append(0)
            for position in range(event.gamma):
                self.drafted_per_position[position] += 1
            for position in range(event.accepted):
                self.accepted_per_position[position] += 1
            while len(self.accepted_length_histogram) <= event.accepted:
                self.accepted_length_histogram.append(0)
            self.accepted_length_histogram[event.accepted] += 1

    def to_dict(self) -> dict[str, object]:
        """JSON-ready figures; fields that do not apply to this kind are None."""
        speculative = self.kind == "speculative"
        return {
            "kind": self.kind,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens_per_second,
            "time_to_first_token": self.time_to_first_token,
            "drafted": self.drafted if speculative else None,
            "accepted": self.accepted if speculative else None,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "steps": self.steps,
            "draft_seconds": self.draft_seconds if speculative else None,
            "target_seconds": self.target_seconds,
            "accepted_per_position": list(self.accepted_per_position) if speculative else None,
            "drafted_per_position": list(self.drafted_per_position) if speculative else None,
            "accepted_length_histogram": (
                list(self.accepted_length_histogram) if speculative else None
            ),
            "stop_reason": self.stop_reason,
            "drafted_by_source": dict(self.drafted_by_source) if speculative else None,
            "accepted_by_source": dict(self.accepted_by_source) if speculative else None,
            "read_tokens": self.read_tokens if speculative else None,
            "read_seconds": self.read_seconds if speculative else None,
            "imported_tokens": self.imported_tokens if speculative else None,
            "import_seconds": self.import_seconds if speculative else None,
            "steps_chosen": (
                [
                    {"source": source, "drafts": drafts, "accepted": accepted, "why": why}
                    for source, drafts, accepted, why in self.choices
                ]
                if speculative
                else None
            ),
        }
