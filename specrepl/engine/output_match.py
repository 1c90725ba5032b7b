"""Whether a speculative run's tokens equal the target-only run's, said the same way everywhere.

Greedy speculative decoding must give exactly the target's greedy tokens, so a
difference there is reported loudly with the first new token (counted from 0)
where the two part; a sampled speculative run draws from the target's
distribution but not the same sample, so its text differs by design.
`compare_outputs` gives the verdict the REPL's summary, the one-shot `--json`
object and `bench` all show. Token ids are compared, never decoded text.

Plain data: no torch, no rich, no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OutputMatch", "compare_outputs", "first_difference"]


def first_difference(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The first position where `tokens` and `reference` differ (the shorter one's
    length when one is a prefix of the other), or None when they are equal."""
    for index, (token, expected) in enumerate(zip(tokens, reference, strict=False)):
        if token != expected:
            return index
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


@dataclass(frozen=True)
class OutputMatch:
    """One run's tokens against the target-only run's on the same prompt."""

    greedy: bool
    """Whether both runs decoded greedily (then they must be identical)."""
    first_difference: int | None
    """The first new token, counted from 0, where the two differ; None when identical."""

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    @property
    def alarming(self) -> bool:
        """A greedy run that differs: a near-tie flipped by another kernel order, or a bug."""
        return self.greedy and not self.identical

    def describe(self) -> str:
        """`identical`, `DIFFERS at token N` (greedy) or `differs by design (sampling)`."""
        if self.identical:
            return "identical" if self.greedy else "identical (sampling)"
        if self.greedy:
            return f"DIFFERS at token {self.first_difference}"
        return "differs by design (sampling)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "first_difference": self.first_difference,
            "greedy": self.greedy,
            "verdict": self.describe(),
        }


def compare_outputs(
    tokens: Sequence[int], reference: Sequence[int], *, greedy: bool
) -> OutputMatch:
    """`tokens` (a speculative or peer run's new tokens) against `reference` (the
    target-only run's new tokens on the same prompt)."""
    return OutputMatch(greedy=greedy, first_difference=first_difference(tokens, reference))
