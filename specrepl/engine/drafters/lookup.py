"""The prompt lookup drafter: what followed the context's last words where they stood before.

It costs no model call and proposes deterministically (a point-mass q). Its
offers say how long the match they copy after is (`match_profile`), which
the gamma policy keeps acceptance by. It knows nothing of the other kinds of
drafter or of settings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["LONGEST_MATCH", "LookupDrafter", "LookupMatch", "match_profile"]

LONGEST_MATCH = 16
"""The longest match measured (a longer one is counted as this long)."""


def match_profile(length: int) -> str:
    """The class of a match of `length` tokens, by powers of two ("match 2-3",
    "match 4-7", "match 8-15", "match 16+"): the profile lookup's offers carry."""
    if length >= LONGEST_MATCH:
        return f"match {LONGEST_MATCH}+"
    low = 1 << (max(length, 1).bit_length() - 1)
    high = 2 * low - 1
    return f"match {low}" if low == high else f"match {low}-{high}"


@dataclass(frozen=True)
class LookupMatch:
    """What lookup found: the `tokens` that followed the match (at most k), and
    the match's `length`: how many tokens before them equal the context's
    last ones (at least the suffix searched for, at most `LONGEST_MATCH`)."""

    tokens: torch.Tensor
    length: int

    @property
    def profile(self) -> str:
        return match_profile(self.length) if len(self.tokens) else ""

    def offer(self, source: str) -> Offer:
        tokens = tuple(self.tokens.tolist())
        return Offer(source, len(tokens), tokens=tokens, profile=self.profile)


def _match_length(sequence: torch.Tensor, start: int) -> int:
    """How many tokens before `start` equal the sequence's last ones, up to
    `LONGEST_MATCH`."""
    span = min(LONGEST_MATCH, start)
    before = sequence[start - span : start].flip(0)
    last = sequence[sequence.shape[0] - span :].flip(0)
    return int(torch.cumprod((before == last).to(torch.int32), 0).sum())


class LookupDrafter(Drafter):
    """Prompt lookup decoding: find the last n tokens earlier in the context and
    propose what followed them there (n from max_ngram down to min_ngram; the
    latest place they stood).

    Deterministic (a point-mass q); costs no model call.
    """

    def __init__(self, max_ngram: int = DrafterOptions.max_ngram, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "lookup"
        self.width = None
        self.uses_target_features = False
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        pass

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        return [self.find(sequence, k).offer(self.name)]

    def find(self, sequence: torch.Tensor, k: int) -> LookupMatch:
        """The continuation of the latest match of the longest suffix found (at
        most `k` tokens; none without a match), with the match's length."""
        length = sequence.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = sequence[length - n :]
            # windows that start before the suffix itself and are followed by a token
            windows = sequence[: length - 1].unfold(0, n, 1)
            hits = (windows == suffix).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                continuation = sequence[start : start + k]
                # an earlier turn's end is copied with what followed it: nothing after it
                continuation = continuation[: self.through_end(continuation)]
                return LookupMatch(continuation, _match_length(sequence, start))
        return LookupMatch(sequence.new_empty(0), 0)

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        return Draft(self.find(sequence, k).tokens, None)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        pass
