"""The hybrid drafter: prompt lookup and a model drafter offered side by side.

The gamma policy chooses between the two sources each step; this module only
offers both and drafts from the chosen one. It knows nothing of which model
drafter it wraps (torch, llama.cpp or a draft head) or of settings.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.lookup import LookupDrafter, LookupMatch
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["HybridDrafter"]


class HybridDrafter(Drafter):
    """Prompt lookup where it pays, a model (or a draft head) elsewhere.

    Copying from the context costs no model call and is often right when the
    answer quotes its prompt (summaries, extraction, code edits); elsewhere the
    model drafter is better informed. The hybrid does not choose by itself:
    it offers both sources each step (`offers`: the lookup candidate, from a
    match of at least `min_match` tokens, with its tokens and its match's
    length class; the model with the context it would have to read first),
    and the gamma policy picks the one
    it expects to give the most tokens per second from what each source's
    drafts have measured (`step_estimates.StepEstimates`; the lookup candidate is
    scored against the target's tokens even on steps that used the model).
    The model drafter catches up on the tokens it did not draft through its
    cache. `propose` without a source takes the lookup candidate when there
    is one.
    """

    def __init__(
        self, model: Drafter, lookup: LookupDrafter, *, min_match: int = DrafterOptions.min_match
    ) -> None:
        self.model = model
        self.lookup = LookupDrafter(lookup.max_ngram, max(min_match, lookup.min_ngram))
        self.name = "hybrid"
        self.width = model.width
        self.uses_target_features = model.uses_target_features
        self.feature_layers = model.feature_layers
        self.uses_target_cache = model.uses_target_cache
        self.last_source = "none"
        # lookup's candidate, for one sequence
        self._candidate: tuple[torch.Tensor, LookupMatch] | None = None

    def stop_at(self, end_tokens: frozenset[int]) -> None:
        super().stop_at(end_tokens)
        self.model.stop_at(end_tokens)
        self.lookup.stop_at(end_tokens)

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.model.begin(prompt, vocab_size)
        self.lookup.begin(prompt, vocab_size)
        self.last_source = "none"
        self._candidate = None

    def features_held(self) -> int:
        return self.model.features_held()

    def forget(self) -> None:
        self.model.forget()

    def _lookup(self, sequence: torch.Tensor, k: int) -> LookupMatch:
        """Lookup's candidate for `sequence` (found once per step)."""
        if self._candidate is not None and self._candidate[0] is sequence:
            found = self._candidate[1]
            return LookupMatch(found.tokens[:k], found.length)
        found = self.lookup.find(sequence, k)
        self._candidate = (sequence, found)
        return found

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        candidate = self._lookup(sequence, k)
        found = [candidate.offer("lookup")] if len(candidate.tokens) else []
        # the model first: lookup's candidate is scored on every step whichever is used,
        # the model's drafts only when it drafts
        return [*self.model.offers(sequence, k), *found]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
        *,
        source: str | None = None,
    ) -> Draft:
        candidate = self._lookup(sequence, k)
        if len(candidate.tokens) and source in (None, "lookup"):
            self.last_source = "lookup"
            return Draft(candidate.tokens, None)
        self.last_source = "model"
        return self.model.propose(sequence, k, processor, generator, min_confidence)

    def propose_source(
        self,
        source: str,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        return self.propose(sequence, k, processor, generator, min_confidence, source=source)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        self._candidate = None
        extra = {"target_cache": target_cache} if self.uses_target_cache else {}
        self.model.update(sequence, valid_length, target_logits, target_features, **extra)
