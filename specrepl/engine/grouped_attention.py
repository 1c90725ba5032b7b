"""Attention that keeps grouped key and value heads grouped when several tokens are fed at once.

A model with grouped-query attention (fewer key/value heads than query heads,
as SmolLM2, Llama 3 and Qwen 2.5 have) stores each key and value head once.
transformers' `sdpa` attention hands them to torch as they are for a single
token or an unmasked pass, but for a masked pass of several tokens (a
verification pass after the prompt, a follow-up turn fed after a kept cache)
it first copies every key and value head once per query head that reads it
(`repeat_kv`). That copy grows with the context: on the 2-core AMD EPYC
(family 25, model 17), nine tokens over 2,800 cached positions took 31 ms of
attention for the 30 layers repeated against 22 ms grouped, and the copies'
fresh memory made some passes take several times as long. torch's own
`scaled_dot_product_attention(..., enable_gqa=True)` reads the grouped heads
in place and gives the same numbers.

`GROUPED_ATTENTION` is a transformers attention implementation (registered
on import) that does exactly that for masked passes of several tokens and
is `sdpa` for every other pass. Whether it pays is timed on this machine
(`measure_grouped_attention`), never assumed; the loader chooses it in one
place (`specrepl.models.tuning.choose_grouped_attention`) and records it in
the model's `Tuning`, whose passes attend with it (`Tuning.running`). This
module only measures and never changes a model; it knows nothing about
drafting or decoding.
"""

from __future__ import annotations

import statistics
import time

import torch
from transformers import AttentionInterface, AttentionMaskInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

__all__ = [
    "GROUPED_ATTENTION",
    "attention_module",
    "can_group_attention",
    "measure_grouped_attention",
]

GROUPED_ATTENTION = "specrepl_sdpa_grouped"

_SDPA_ONLY = ("position_bias", "cache", "softcap")
"""Arguments that only transformers' own `sdpa` path handles: a pass that has any
of them set goes there."""


def _grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    grouped = (
        groups > 1
        and query.shape[2] > 1
        and attention_mask is not None
        and not kwargs.get("output_attentions", False)
        and all(kwargs.get(name) is None for name in _SDPA_ONLY)
    )
    if not grouped:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_ATTENTION, _grouped_attention)
AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)


def attention_module(model: PreTrainedModel) -> torch.nn.Module | None:
    """`model`'s first attention layer (one with key/value groups and a head
    size), or None when it has none this recognises."""
    for module in model.modules():
        if hasattr(module, "num_key_value_groups") and hasattr(module, "head_dim"):
            return module
    return None


def _heads(model: PreTrainedModel) -> tuple[int, int, int] | None:
    """Query heads, key/value heads and head size of `model`'s attention, or None
    when it has no attention layer this recognises."""
    module = attention_module(model)
    if module is None:
        return None
    heads = int(model.config.get_text_config().num_attention_heads)
    return heads, heads // int(module.num_key_value_groups), int(module.head_dim)


def can_group_attention(model: PreTrainedModel) -> bool:
    """Whether `GROUPED_ATTENTION` can stand in for `model`'s attention: it
    attends with `sdpa` (or with `GROUPED_ATTENTION` already) and has fewer
    key/value heads than query heads."""
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", GROUPED_ATTENTION):
        return False
    heads = _heads(model)
    return heads is not None and heads[1] < heads[0]


@torch.no_grad()
def measure_grouped_attention(
    model: PreTrainedModel,
    *,
    width: int = 8,
    context: int = 1024,
    repeats: int = 7,
) -> dict[str, float]:
    """Median seconds of one masked pass of `width` tokens attending over
    `context` cached positions (one layer, causal among the new tokens), with
    the key and value heads repeated as transformers' `sdpa` does and grouped
    as `GROUPED_ATTENTION` does; the two alternate after a warm-up. Empty when
    the model has no grouped attention layer this recognises, or when this
    torch cannot attend grouped heads under a mask."""
    heads = _heads(model)
    if heads is None or heads[1] >= heads[0]:
        return {}
    query_heads, kv_heads, head_size = heads
    device = next(model.parameters()).device
    dtype = model.dtype
    generator = torch.Generator().manual_seed(0)

    def random(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    query = random(1, query_heads, width, head_size)
    keys = random(1, kv_heads, context + width, head_size)
    values = random(1, kv_heads, context + width, head_size)
    mask = torch.ones(width, context + width, dtype=torch.bool, device=device)
    mask = mask.tril(context)[None, None]
    layer = _StandIn(query_heads // kv_heads)
    samples: dict[str, list[float]] = {"repeated": [], "grouped": []}
    for round_index in range(repeats + 1):  # the first round warms the kernels up
        for form in samples:
            attend = sdpa_attention_forward if form == "repeated" else _grouped_attention
            start = time.perf_counter()
            try:
                attend(layer, query, keys, values, mask, scaling=head_size**-0.5)
            except (TypeError, RuntimeError, NotImplementedError):
                return {}  # this torch or device has no grouped masked attention
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if round_index:
                samples[form].append(time.perf_counter() - start)
    return {form: statistics.median(times) for form, times in samples.items()}


class _StandIn(torch.nn.Module):
    """The attributes of an attention layer that the attention functions read."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True
