"""A model's KV cache kept from one generation to the next, so a chat does not re-read its history.

A `PromptCache` holds a cache and the token ids whose keys and values it holds.
The next generation compares its prompt with those ids token by token, crops
the cache to the longest common prefix (never the prompt's last token, which
must be fed for its logits) and feeds only the rest. Comparing ids rather than
turns means that a chat template which renders an earlier turn differently
the next time costs a longer feed, never a wrong answer.

The cache is taken out while a generation uses it and put back only when the
generation ends normally: a run that is interrupted or fails leaves the
`PromptCache` empty, because its cache may hold a half-written step. `keep`
costs nothing (the ids are read at the next `take`), so a drafter may call it
after every step.

This module knows nothing about drafting or chat templates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.kv_cache import cached_length, new_cache, rollback_to

__all__ = ["PromptCache", "common_prefix"]


def common_prefix(held: Sequence[int] | torch.Tensor, inputs: Sequence[int]) -> int:
    """How many leading tokens `held` and `inputs` share."""
    held_ids = held.tolist() if isinstance(held, torch.Tensor) else list(held)
    length = min(len(held_ids), len(inputs))
    for index in range(length):
        if held_ids[index] != inputs[index]:
            return index
    return length


class PromptCache:
    """One model's cache between generations (see the module docstring).

    Pass the same object to every `speculative_generate` or
    `autoregressive_generate` call of a conversation (`prompt_cache=`); one
    object per generator and model, since each holds one model's cache.
    """

    def __init__(self) -> None:
        self._model: PreTrainedModel | None = None
        self._cache: DynamicCache | None = None
        self._ids: torch.Tensor | None = None

    @property
    def held(self) -> int:
        """How many tokens the kept cache holds (0 when nothing is kept)."""
        return 0 if self._ids is None else int(self._ids.shape[0])

    def reusable(self, model: PreTrainedModel, inputs: Sequence[int]) -> int:
        """How many tokens of `inputs` the kept cache would spare `model` from feeding."""
        if self._cache is None or self._ids is None or self._model is not model:
            return 0
        return min(common_prefix(self._ids, inputs), max(len(inputs) - 1, 0))

    def take(
        self, model: PreTrainedModel, inputs: Sequence[int], at_most: int | None = None
    ) -> tuple[DynamicCache, int]:
        """The cache to continue `inputs` with and how many of their tokens it holds
        (at most `at_most`). The `PromptCache` is empty until `keep` is called."""
        reused = self.reusable(model, inputs)
        if at_most is not None:
            reused = min(reused, max(at_most, 0))
        cache = self._cache if reused > 0 and self._cache is not None else new_cache(model)
        rollback_to(cache, reused)
        self.drop()
        return cache, reused

    def keep(self, model: PreTrainedModel, cache: DynamicCache, sequence: torch.Tensor) -> None:
        """Keep `cache`, which holds the first tokens of `sequence` (1-D ids), for next time."""
        self._model, self._cache = model, cache
        self._ids = sequence[: cached_length(cache)]

    def drop(self) -> None:
        """Forget the kept cache (its memory is freed once no run holds it)."""
        self._model, self._cache, self._ids = None, None, None
