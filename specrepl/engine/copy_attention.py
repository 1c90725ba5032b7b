"""Attention in the precision of the keys and values: a cheaper copy that attends like the target.

A bfloat16 copy of the target drafts with the target's own keys and values
(`drafters.ModelDrafter`, `copy_of_target`). Cast to bfloat16, they make the
copy's attention a bfloat16 product, which a CPU without bfloat16 arithmetic
computes slowly, and its cost grows with the context: on the 2-core AMD EPYC
the copy's step at an 800-token context cost 0.84 of the float32 target's,
0.60 with its attention in float32 over the uncast keys and values (0.64 and
0.60 at 200 tokens). On a CPU with bfloat16 arithmetic the cast may be the
cheaper one, so nothing here decides by constant: `measure_attention`
times one query over a long context both ways on this machine.

`ATTENTION` is a transformers attention implementation (registered on
import) that computes scaled dot-product attention in the keys' dtype and
returns the query's: with keys in the query's dtype it is exactly `sdpa`.
The loader chooses it in one place (`specrepl.models.tuning`) and records it
in the copy's `tuning.Tuning`, which the drafter reads; transformers reads a
model's attention implementation from its config, which names it for the
length of the copy's own passes only (`tuning.Tuning.running`). This module
only measures and never changes a model.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from specrepl.engine.grouped_attention import GROUPED_ATTENTION, attention_module

__all__ = ["ATTENTION", "can_attend_in_cache_dtype", "measure_attention"]

ATTENTION = "specrepl_sdpa_in_cache_dtype"


def _attention_in_cache_dtype(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    if query.dtype == key.dtype:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.to(key.dtype)
    output, weights = sdpa_attention_forward(
        module, query.to(key.dtype), key, value.to(key.dtype), attention_mask, **kwargs
    )
    return output.to(query.dtype), weights


AttentionInterface.register(ATTENTION, _attention_in_cache_dtype)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def can_attend_in_cache_dtype(model: PreTrainedModel) -> bool:
    """Whether `model` attends with `sdpa` (or with `ATTENTION` already, or with
    `grouped_attention.GROUPED_ATTENTION`, which is `sdpa` with other copies),
    which `ATTENTION` can stand in for; a model with another implementation
    cannot."""
    implementation = getattr(model.config, "_attn_implementation", None)
    return implementation in ("sdpa", ATTENTION, GROUPED_ATTENTION)


@torch.no_grad()
def measure_attention(
    model: PreTrainedModel,
    cache_dtype: torch.dtype,
    *,
    context: int = 512,
    repeats: int = 9,
) -> dict[torch.dtype, float]:
    """Median seconds of one query attending over `context` cached positions,
    keys and values in the model's dtype and in `cache_dtype` (the timings
    alternate). Empty when the model has no attention layer this recognises."""
    module = attention_module(model)
    if module is None:
        return {}
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    device = next(model.parameters()).device
    query = torch.randn(1, heads, 1, module.head_dim, device=device, dtype=model.dtype)
    caches = {
        dtype: (
            torch.randn(1, kv_heads, context, module.head_dim, device=device, dtype=dtype),
            torch.randn(1, kv_heads, context, module.head_dim, device=device, dtype=dtype),
        )
        for dtype in (model.dtype, cache_dtype)
    }
    samples: dict[torch.dtype, list[float]] = {dtype: [] for dtype in caches}
    for _ in range(repeats + 1):
        for dtype, (keys, values) in caches.items():
            start = time.perf_counter()
            for _ in range(4):
                _attention_in_cache_dtype(module, query, keys, values, None, is_causal=False)
            samples[dtype].append((time.perf_counter() - start) / 4)
    return {dtype: statistics.median(times[1:]) for dtype, times in samples.items()}
