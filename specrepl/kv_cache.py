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


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """An empty dynamic cache for `model` that supports rollback.

    Sliding-window layers keep only their window unless past recording is on,
    so it is switched on here: a rollback must be able to restore the states
    that the window had already dropped.
    """
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()
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
