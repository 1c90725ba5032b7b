"""The model drafter: a small causal LM (or a cheaper copy of the target) run in torch.

`ModelDrafter` drafts token by token with its own KV cache; a copy of the
target (`is_copy_of`) takes the target's keys and values instead of reading
the context itself. `as_drafter` wraps a bare model passed to the library API.
This module knows nothing of the other kinds of drafter, of llama.cpp or of
settings.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.devices import synchronize
from specrepl.engine.drafters.base import Draft, Drafter, collect_draft, next_draft
from specrepl.engine.drafters.head_store import target_fingerprint
from specrepl.engine.forward import context_length, forward_logits, logits_width, model_device
from specrepl.engine.kv_cache import (
    cached_length,
    can_copy_positions,
    copy_positions,
    new_cache,
    rollback_to,
)
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import Offer
from specrepl.engine.runtime import ModelRuntime
from specrepl.engine.tuning import Tuning

__all__ = ["ModelDrafter", "as_drafter", "is_copy_of"]


def is_copy_of(model: PreTrainedModel, target: PreTrainedModel) -> bool:
    """Whether `model` holds the target's own weights (in any precision: the
    same fingerprint) on one device, so that it can take the target's keys and
    values (see `ModelDrafter`'s `copy_of_target`)."""
    devices = set(getattr(model, "hf_device_map", {}).values())
    return len(devices) <= 1 and target_fingerprint(model) == target_fingerprint(target)


class ModelDrafter(Drafter):
    """A small causal LM that shares the target's tokenizer (or a cheaper copy of the target).

    `copy_of_target` (a copy of the target's own weights, e.g. in bfloat16,
    see `is_copy_of`; with the cache on and no window): after every
    verification the drafter takes the target's keys and values for the
    positions it has not read, cast to its own precision, instead of
    computing them. It never reads a prompt (a cheaper copy may still read a
    long one slower than the target: bfloat16 on a CPU without bfloat16
    arithmetic) nor catches up on tokens it did not draft; in exchange it
    drafts nothing before the target's first pass of a generation. Without a
    target cache (the target runs uncached) it reads for itself.

    `tuning` is the drafter model's (`tuning.Tuning`, from whoever loaded
    it): its passes run with its width plan, and a copy whose tuning says it
    attends in its cache's dtype (the loader measured that cheaper on this
    machine, `copy_attention.py`) keeps the target's keys and values uncast;
    otherwise they are cast to the copy's dtype. None: untuned, always cast.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        use_cache: bool = True,
        name: str = "model",
        window: int | None = None,
        keep_between_prompts: bool = False,
        copy_of_target: bool = False,
        tuning: Tuning | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        self.model = model
        self.name = name
        self.uses_target_features = False
        self.uses_target_cache = copy_of_target and use_cache and window is None
        self._seeded = False  # this generation takes the target's cache (set by `begin`)
        self.use_cache = use_cache
        self.window = window
        self.device = model_device(model)
        self.width = logits_width(model)
        self.context = context_length(model)
        self.vocab_size = self.width
        self.keep_between_prompts = keep_between_prompts
        self.cache: DynamicCache | None = None
        self.offset = 0
        self._kept = PromptCache()  # the cache between generations, with keep_between_prompts
        self._runtime: ModelRuntime | None = None  # what `_kept` keeps (keep_between_prompts)
        self.tuning = Tuning() if tuning is None else tuning
        self.cache_dtype: torch.dtype | None = None
        """The dtype the target's keys and values are kept in (None: not decided yet)."""

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """A `window` lets the drafter read only the prompt's last `window`
        tokens: a long prompt then costs the drafter a short prefill (the
        target still reads all of it, so the output does not change).

        With `keep_between_prompts` (and no window), the cache of the last
        generation is cropped to what the new prompt shares with it."""
        self.vocab_size = vocab_size
        self._runtime = None
        self.offset = 0 if self.window is None else max(0, prompt.shape[0] - self.window)
        if not self.use_cache:
            self.cache = None
        elif self.keep_between_prompts and self.window is None:
            self._runtime, _ = self._kept.take(self.model, prompt.tolist(), tuning=self.tuning)
            self.cache = self._runtime.key_values()
        else:
            self.cache = new_cache(self.model)
        self._seeded = (
            self.uses_target_cache and self.cache is not None and can_copy_positions(self.cache)
        )

    def forget(self) -> None:
        self.cache = None
        self._runtime = None
        self._kept.drop()

    def _room(self, sequence: torch.Tensor, k: int) -> int:
        """How many of k drafts the drafter can give for `sequence` now."""
        seen = sequence.shape[0] - self.offset
        if self._seeded and seen - cached_length(self.cache) > 1:
            # tokens the target has not read yet: it will, and hand over their keys and values
            return 0
        if self.context is not None:
            # the drafter reads the sequence plus k - 1 of its own drafts
            k = min(k, self.context - seen + 1)
        return max(k, 0)

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        seen = sequence.shape[0] - self.offset
        return [Offer(self.name, self._room(sequence, k), seen - cached_length(self.cache))]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        k = self._room(sequence, k)
        if k <= 0:
            return Draft(sequence.new_empty(0), None)
        context = sequence[self.offset :].to(self.device)
        unread = context.shape[0] - cached_length(self.cache)
        tokens: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        read_seconds = 0.0
        for index in range(k):
            started = time.perf_counter()
            logits = forward_logits(
                self.model, context, self.cache, 1, self.vocab_size, tuning=self.tuning
            )[0]
            if index == 0:  # the read of what the drafter had not seen
                synchronize(self.device)
                read_seconds = time.perf_counter() - started
            token = next_draft(logits, processor, generator, min_confidence, laws)
            if token is None:
                break
            tokens.append(token)
            context = torch.cat((context, token))
        return replace(
            collect_draft(tokens, laws, sequence), read_seconds=read_seconds, read_tokens=unread
        )

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        rollback_to(self.cache, min(cached_length(self.cache), valid_length - self.offset))
        if self._seeded:
            if target_cache is None or self.cache is None or not can_copy_positions(target_cache):
                self._seeded = False  # read for itself for the rest of this generation
            else:
                copy_positions(
                    target_cache,
                    self.cache,
                    valid_length,
                    dtype=self._copied_dtype(target_cache),
                    device=self.device,
                )
        if self.keep_between_prompts and self._runtime is not None and self.window is None:
            self._kept.keep(self._runtime, sequence)

    def _copied_dtype(self, target_cache: DynamicCache) -> torch.dtype:
        """The dtype to keep the target's keys and values in: the copy's own, or
        (decided at the first copy, from its tuning) the target's, attended as such."""
        source = target_cache.layers[0].keys.dtype
        own = self.model.dtype
        if self.cache_dtype is None:
            self.cache_dtype = source if self.tuning.attends_in_cache_dtype else own
        return self.cache_dtype if self.cache_dtype == source else own


def as_drafter(drafter: Drafter | PreTrainedModel, *, use_cache: bool = True) -> Drafter:
    """Wrap a bare model as a ModelDrafter; pass Drafter objects through."""
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter, use_cache=use_cache)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(
        f"a drafter must be a transformers causal LM or a Drafter, got {type(drafter).__name__}"
    )
