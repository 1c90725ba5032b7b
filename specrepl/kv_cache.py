"""KV-cache creation and rollback, on the public transformers 5 Cache API only.

Speculative decoding writes draft tokens into both models' caches and must drop
the rejected ones. Every rollback in the project goes through `rollback_to`;
nothing else touches cache internals. This module knows nothing about drafting
or sampling.
"""

from __future__ import annotations

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
