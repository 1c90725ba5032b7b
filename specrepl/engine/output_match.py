"""Whether a speculative run's tokens equal the target-only run's, said the same way everywhere.

Greedy speculative decoding must give exactly the target's greedy tokens, so a
difference there is reported loudly with the first new token (counted from 0)
where the two part; a sampled speculative run draws from the target's
distribution but not the same sample, so its text differs by design.
`compare_outputs` gives the verdict the REPL's summary, the one-shot `--json`
object and `bench` all show. Token ids are compared, never decoded text.
Where the target was asked about a greedy difference (`near_ties`), the
verdict carries its `TieCheck`: a near-tie within the pass's rounding is
said plainly ("differs at token N: a bfloat16 near-tie, margin 0.25"), not
as an alarm.

Plain data: no torch, no rich, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OutputMatch", "TieCheck", "compare_outputs", "first_difference"]


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where `tokens` and `reference` differ (the shorter one's
    length when one is a prefix of the other), or None when they are equal."""
    for index, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


@dataclass(frozen=True)
class TieCheck:
    """The target asked where a greedy run parted from its own (`near_ties`)."""

    position: int
    """The new token, counted from 0, where the runs part."""
    margin: float
    """How far the target's own token's logit leads the other run's token's."""
    rounding: float
    """How far those logits move between a wide and a one-token pass, or the
    dtype's step at their size, whichever is larger."""
    dtype: str
    near_tie: bool
    """Whether the margin is within the rounding (then both choices are correct)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "margin": self.margin,
            "rounding": self.rounding,
            "dtype": self.dtype,
            "near_tie": self.near_tie,
        }


@dataclass(frozen=True)
class OutputMatch:
    """One run's tokens against the target-only run's on the same prompt."""

    greedy: bool
    """Whether both runs decoded greedily (then they must be identical)."""
    first_difference: int | None
    """The first new token, counted from 0, where the two differ; None when identical."""
    tie: TieCheck | None = None
    """The target asked at the first difference (greedy only), where it was."""

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    @property
    def alarming(self) -> bool:
        """A greedy run that differs, not shown to be a near-tie: a bug, or a
        near-tie nobody checked."""
        return self.greedy and not self.identical and not self.near_tie

    @property
    def near_tie(self) -> bool:
        """A greedy difference at a position the target found within its rounding."""
        return self.tie is not None and self.tie.near_tie

    def describe(self) -> str:
        """`identical`, `DIFFERS at token N` (greedy) or `differs by design (sampling)`."""
        if self.identical:
            return "identical" if self.greedy else "identical (sampling)"
        if self.near_tie:
            tie = self.tie
            return (
                f"differs at token {self.first_difference}: a {tie.dtype} near-tie, "
                f"margin {tie.margin:.3g} (rounding {tie.rounding:.2g})"
            )
        if self.greedy and self.tie is not None:
            tie = self.tie
            return (
                f"DIFFERS at token {self.first_difference} (margin {tie.margin:.3g}, "
                f"{tie.margin / tie.rounding:.0f}x the {tie.dtype} rounding {tie.rounding:.2g}: "
                "not a near-tie)"
            )
        if self.greedy:
            return f"DIFFERS at token {self.first_difference}"
        return "differs by design (sampling)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "first_difference": self.first_difference,
            "greedy": self.greedy,
            "near_tie": None if self.tie is None else self.tie.to_dict(),
            "verdict": self.describe(),
        }


def compare_outputs(
    tokens: Sequence[int],
    reference: Sequence[int],
    *,
    greedy: bool,
    tie: TieCheck | None = None,
) -> OutputMatch:
    """`tokens` (a speculative or peer run's new tokens) against `reference` (the
    target-only run's new tokens on the same prompt); `tie`: the target asked
    at the first difference."""
    position = first_difference(tokens, reference)
    kept = tie if tie is not None and tie.position == position else None
    return OutputMatch(greedy=greedy, first_difference=position, tie=kept)
