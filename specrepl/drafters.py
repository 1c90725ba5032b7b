"""Drafters: whatever proposes the tokens that the target then verifies.

Every drafter implements the `Drafter` protocol and goes through the single
verification loop in `generation.py`. A drafter proposes up to k tokens for the
current sequence, with the distributions q it drew them from (or None for a
deterministic drafter: a point mass), and is told after each step how much of
what it saw is still valid. This module never calls the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from .forward import context_length, forward_logits, logits_width, model_device
from .kv_cache import cached_length, new_cache, rollback_to
from .processors import LogitsProcessor


@dataclass(frozen=True)
class Draft:
    """Proposed tokens (k,) and, when the drafter samples, their laws q (k, vocab)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


@runtime_checkable
class Drafter(Protocol):
    """The interface the speculative loop drives."""

    name: str

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """Start a new generation for `prompt` (1-D token ids)."""

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
    ) -> Draft:
        """Up to k tokens that may follow `sequence` (1-D ids, the whole context)."""

    def update(self, sequence: torch.Tensor, valid_length: int) -> None:
        """After verification: `sequence` is the new context; its first
        `valid_length` tokens are ones the drafter already saw unchanged."""


class ModelDrafter:
    """A small causal LM that shares the target's tokenizer (or a cheaper copy of the target)."""

    def __init__(
        self, model: PreTrainedModel, *, use_cache: bool = True, name: str = "model"
    ) -> None:
        self.model = model
        self.name = name
        self.use_cache = use_cache
        self.device = model_device(model)
        self.width = logits_width(model)
        self.context = context_length(model)
        self.vocab_size = self.width
        self.cache = None

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.cache = new_cache(self.model) if self.use_cache else None

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
    ) -> Draft:
        if self.context is not None:
            # the drafter reads the sequence plus k - 1 of its own drafts
            k = min(k, self.context - sequence.shape[0] + 1)
        if k <= 0:
            return Draft(sequence.new_empty(0), None)
        context = sequence.to(self.device)
        tokens: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        for _ in range(k):
            logits = forward_logits(self.model, context, self.cache, 1, self.vocab_size)[0]
            if processor.is_greedy:
                token = torch.argmax(logits, dim=-1, keepdim=True)
            else:
                probs = processor.probabilities(logits)
                token = processor.sample(probs, generator).reshape(1)
                laws.append(probs)
            tokens.append(token)
            context = torch.cat((context, token))
        drafted = torch.cat(tokens).to(sequence.device)
        return Draft(drafted, torch.stack(laws).to(sequence.device) if laws else None)

    def update(self, sequence: torch.Tensor, valid_length: int) -> None:
        rollback_to(self.cache, min(cached_length(self.cache), valid_length))


def as_drafter(drafter: Drafter | PreTrainedModel, *, use_cache: bool = True) -> Drafter:
    """Wrap a bare model as a ModelDrafter; pass Drafter objects through."""
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter, use_cache=use_cache)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(
        f"a drafter must be a transformers causal LM or a Drafter, got {type(drafter).__name__}"
    )
