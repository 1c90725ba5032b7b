"""Which drafter to build: the kinds users can name and the options of each.

Plain data without torch, so that settings, config files and the REPL's first
screen can name and check drafters before any model library is imported;
`drafters.build_drafter` turns these options into a drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DRAFTER_KINDS", "DrafterOptions"]

DRAFTER_KINDS = ("model", "ngram", "lookup", "hybrid", "head")


@dataclass(frozen=True)
class DrafterOptions:
    """Everything that says which drafter to build (see `drafters.build_drafter`)."""

    kind: str = "model"
    ngram_order: int = 4
    ngram_keep: bool = False
    top_k_filler: int = 1
    lookup_max_ngram: int = 3
    window: int | None = None
    min_match: int = 2
    head: str | None = None
    """A draft head directory (or "embedded"): the `head` kind drafts with it,
    and `hybrid` uses it instead of the drafter model."""

    @property
    def needs_model(self) -> bool:
        return self.kind == "model" or (self.kind == "hybrid" and self.head is None)

    @property
    def needs_head(self) -> bool:
        return self.kind == "head" or (self.kind == "hybrid" and self.head is not None)
