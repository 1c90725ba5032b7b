"""The head drafter: a trained draft head that drafts from the target's own features.

The head network and its files are in `draft_head.py` and `head_store.py`;
this module only drives a loaded head through the `Drafter` interface. It
knows nothing of the other kinds of drafter or of settings.
"""

from __future__ import annotations

import torch

from specrepl.engine.drafters.base import Draft, Drafter, collect_draft, next_draft
from specrepl.engine.drafters.draft_head import DraftHead, HeadCache
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.prompt_cache import common_prefix
from specrepl.engine.results import Offer

__all__ = ["HeadDrafter"]


class HeadDrafter(Drafter):
    """A trained draft head (`draft_head.py`) that drafts from the target's features.

    It reads the target's final hidden state at every position the target
    verified, so it has nothing to propose before the target's first pass
    (the first step of a generation is the target's alone). Its cache holds
    the positions read with the target's own features; draft positions, read
    with the head's guesses, are dropped after every verification and read
    again with the target's features. q is the head's distribution over its
    draft vocabulary, zero elsewhere. On a CPU it stops drafting at an end
    token (`stop_at`); on a GPU its drafts stay on the device, unread, and a
    draft past the answer's end is verified and dropped like any other.
    """

    def __init__(
        self, head: DraftHead, *, name: str = "head", keep_between_prompts: bool = False
    ) -> None:
        self.head = head
        self.name = name
        self.width = None
        self.uses_target_features = True
        self.feature_layers = head.config.fused_layers
        self.keep_between_prompts = keep_between_prompts
        self.vocab_size = 0
        self.cache = HeadCache()
        self.real = 0  # positions in the cache read with the target's features
        self.pending: torch.Tensor | None = None  # features not yet read, from position `real`
        self._seen: torch.Tensor | None = None  # the sequence those positions belong to

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """With `keep_between_prompts`, what the last generation read is cropped
        to what the new prompt shares with it; else the head starts empty."""
        self.vocab_size = vocab_size
        held = 0
        if self.keep_between_prompts and self._seen is not None:
            held = min(common_prefix(self._seen, prompt.tolist()), self.features_held())
        if held == 0:
            self.cache = HeadCache()
            self.real = 0
        elif held < self.real:
            self.real = held
            self.cache.rollback_to(held)
        if self.pending is not None and held > self.real:
            self.pending = self.pending[: held - self.real]
        else:
            self.pending = None
        self._seen = None

    def features_held(self) -> int:
        """Leading positions of the sequence the head has the target's features for."""
        return self.real + (0 if self.pending is None else self.pending.shape[0])

    def forget(self) -> None:
        self.cache = HeadCache()
        self.real, self.pending, self._seen = 0, None, None

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        ready = self.pending is not None and self.features_held() == sequence.shape[0] - 1
        return [Offer(self.name, k if ready else 0)]

    @torch.no_grad()
    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        if self.pending is None or k <= 0 or self.features_held() != sequence.shape[0] - 1:
            # nothing to draft from before the target's first pass of a generation
            return Draft(sequence.new_empty(0), None)
        head = self.head
        device = head.token_ids.device
        features = head.fused(self.pending.to(device=device, dtype=head.output_rows.dtype))
        count = features.shape[0]
        tokens = sequence[self.real + 1 : self.real + 1 + count].to(device)
        positions = torch.arange(self.real, self.real + count, device=device)
        hidden = head.step(features[None], tokens[None], positions[None], self.cache)[:, -1:]
        self.real += count
        self.pending = None
        drafted: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        position = self.real
        on_host = device.type == "cpu"  # reading a draft there costs no wait on a device
        for index in range(k):
            token = next_draft(
                head.logits(hidden[0, 0]).float(),
                processor,
                generator,
                min_confidence,
                laws,
                token_ids=head.token_ids,
                vocab_size=self.vocab_size,
            )
            if token is None:
                break
            token = token.to(device)
            drafted.append(token)
            if on_host and self.end_tokens and int(token) in self.end_tokens:
                break  # nothing after the answer's end is kept
            if index + 1 < k:
                hidden = head.step(
                    hidden, token[None], torch.tensor([[position]], device=device), self.cache
                )
                position += 1
        return collect_draft(drafted, laws, sequence)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        if target_features is None:
            raise ValueError("the head drafter needs the target's features after every step")
        start = valid_length - target_features.shape[0]
        known = self.real + (0 if self.pending is None else self.pending.shape[0])
        if start > known:
            raise RuntimeError(
                f"the head drafter has features up to position {known} but was given "
                f"features from {start}: a step was not reported to it"
            )
        if start < self.real:  # the target recomputed positions the head has read
            self.real = start
        self.cache.rollback_to(self.real)
        kept = None if self.pending is None else self.pending[: start - self.real]
        fresh = target_features.detach()
        self.pending = fresh if kept is None or kept.shape[0] == 0 else torch.cat((kept, fresh))
        if self.pending.shape[0] == 0:
            self.pending = None
        self._seen = sequence
