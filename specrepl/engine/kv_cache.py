"""KV-cache creation and rollback, on the public transformers 5 Cache API only.

Speculative decoding writes draft tokens into both models' caches and must drop
the rejected ones. Every rollback in the project goes through `rollback_to`,
and a drafter that is a copy of the target takes the target's keys and values
through `copy_positions`; nothing else touches cache internals. This module
knows nothing about drafting or sampling.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty dynamic cache for `model` that supports rollback.

    Sliding-window layers keep only their window unless past recording is on,
    so it is switched on here: a rollback must be able to restore the states
    that the window had already dropped.
    """
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
    return cache


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that writes new keys and values into spare
    room instead of concatenating.

    `DynamicLayer` copies its whole cache at every step; for a batch of 32
    answers on a CPU that copy was a quarter of a decoding step. Here `keys`
    and `values` are views of the first `length` positions of a larger tensor,
    which is copied only when it is full (then its room doubles) or when rows
    are dropped from the batch. Everything else (`get_seq_length`, masks, the
    view read by attention) behaves as in `DynamicLayer`.
    """

    def __init__(self, room: int = 256) -> None:
        super().__init__()
        self._room = max(1, room)
        self._key_room: torch.Tensor | None = None
        self._value_room: torch.Tensor | None = None
        self._length = 0

    def _show(self) -> None:
        assert self._key_room is not None and self._value_room is not None
        self.keys = self._key_room[..., : self._length, :]
        self.values = self._value_room[..., : self._length, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_room is None or end > self._key_room.shape[-2]:
            self._grow(key_states, value_states, max(end, 2 * self._length, self._room))
        assert self._key_room is not None and self._value_room is not None
        self._key_room[..., self._length : end, :].copy_(key_states)
        self._value_room[..., self._length : end, :].copy_(value_states)
        self._length = end
        self._show()
        return self.keys, self.values

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, room: int) -> None:
        def larger(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
            shape = (*new.shape[:-2], room, new.shape[-1])
            bigger = new.new_empty(shape)
            if old is not None and self._length:
                bigger[..., : self._length, :].copy_(old[..., : self._length, :])
            return bigger

        self._key_room = larger(self._key_room, key_states)
        self._value_room = larger(self._value_room, value_states)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens, not {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized or self._key_room is None:
            return
        self._length = max(0, self._length + tokens_to_remove)
        self._show()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._key_room is None:
            return
        self._key_room = self._key_room[indices.to(self._key_room.device)]
        self._value_room = self._value_room[indices.to(self._key_room.device)]
        self._show()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self._key_room is None:
            return
        self._key_room = self._key_room.repeat_interleave(repeats, dim=0)
        self._value_room = self._value_room.repeat_interleave(repeats, dim=0)
        self._show()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def reset(self) -> None:
        super().reset()
        self._key_room = self._value_room = None
        self._length = 0


def growing_cache(model: PreTrainedModel, room: int = 256) -> DynamicCache:
    """A dynamic cache for `model` whose full-attention layers are
    `GrowingLayer`s with room for `room` positions to begin with (sliding-window
    and other special layers stay as transformers makes them). For long
    batched generation; the speculative loop keeps `new_cache`."""
    cache = DynamicCache(config=model.config)
    cache.layers = [
        GrowingLayer(room) if type(layer) is DynamicLayer else layer for layer in cache.layers
    ]
    return cache


def cached_length(cache: DynamicCache | None) -> int:
    """How many tokens of the sequence the cache already holds."""
    return 0 if cache is None else cache.get_seq_length()


def rollback_to(cache: DynamicCache | None, length: int) -> None:
    """Drop cached tokens beyond the first `length`; a shorter cache is left as is.

    transformers 5 `crop` takes a negative count of tokens to remove.
    """
    if cache is None:
        return
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def can_copy_positions(cache: DynamicCache) -> bool:
    """Whether `copy_positions` can read `cache`: every layer keeps all its
    positions (no sliding window, no quantized or offloaded layer)."""
    return all(
        not getattr(layer, "is_sliding", True) and hasattr(layer, "keys") for layer in cache.layers
    )


def copy_positions(
    source: DynamicCache,
    destination: DynamicCache,
    end: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Append to `destination` the keys and values `source` holds for the
    positions from `destination`'s length to `end`, cast to `dtype` on `device`.

    Only for two caches of the same architecture (the same layers, heads and
    rotary positions), e.g. a bfloat16 copy of a model fed what the model read.
    """
    start = cached_length(destination)
    if end <= start:
        return
    if end > cached_length(source):
        raise ValueError(f"the source cache holds {cached_length(source)} positions, not {end}")
    if len(source.layers) != len(destination.layers):
        raise ValueError(
            f"the caches have {len(source.layers)} and {len(destination.layers)} layers"
        )
    for index, layer in enumerate(source.layers):
        keys = layer.keys[:, :, start:end, :].to(device=device, dtype=dtype)
        values = layer.values[:, :, start:end, :].to(device=device, dtype=dtype)
        destination.update(keys, values, index)
