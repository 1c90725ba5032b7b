"""The prompt lookup drafter: what followed the context's last words where they stood before.

It costs no model call and proposes deterministically (a point-mass q). It
knows nothing of the other kinds of drafter or of settings.
"""

from __future__ import annotations

import torch

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["LookupDrafter"]


class LookupDrafter(Drafter):
    """Prompt lookup decoding: find the last n tokens earlier in the context and
    propose what followed them there (n from max_ngram down to min_ngram).

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
        draft = self.propose(sequence, k, None, None)  # type: ignore[arg-type]
        return [Offer(self.name, len(draft), tokens=tuple(draft.tokens.tolist()))]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        length = sequence.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = sequence[length - n :]
            # windows that start before the suffix itself and are followed by a token
            windows = sequence[: length - 1].unfold(0, n, 1)
            hits = (windows == suffix).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                return Draft(sequence[start : start + k], None)
        return Draft(sequence.new_empty(0), None)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        pass
