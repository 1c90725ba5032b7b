"""Tuning a loaded model: the one place that changes a model for speed.

Each loaded model carries a `Tuning` (`specrepl.engine.tuning`: its width
plan, its linear forms, its attention), made by the loader and handed to
whatever runs the model. Two of its choices cannot stay outside the model,
because of how the libraries decide:

- a linear layer's class decides its forward, so a model whose plan can use
  another form of the product has its plain linear layers switched to
  `linear_forms.FormChoosingLinear` (`allow_linear_forms`), and given packed
  copies of their weights where the memory allows (`pack_linear_weights`,
  undone by `unpack_linear_weights` when no width measured faster with them);
- transformers reads the attention implementation from the model's config,
  so a copy of the target that attends cheaper in the dtype of the target's
  keys and values is switched to `copy_attention.ATTENTION`
  (`choose_copy_attention`), through transformers' `set_attn_implementation`;
  a model with grouped key/value heads that attends with `sdpa` is switched
  to `grouped_attention.GROUPED_ATTENTION` where masked passes of several
  tokens measured cheaper with the heads kept grouped
  (`choose_grouped_attention`).

Only the functions here make those changes, each records it in the model's
`Tuning`, `apply_tuning` makes a model loaded again match what its tuning
records, and `undo_tuning` gives a model its stock layers and attention back.
This module knows nothing about decoding, settings or the store.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specrepl.engine.copy_attention import ATTENTION, can_attend_in_cache_dtype, measure_attention
from specrepl.engine.devices import available_memory, release_memory
from specrepl.engine.grouped_attention import (
    GROUPED_ATTENTION,
    can_group_attention,
    measure_grouped_attention,
)
from specrepl.engine.linear_forms import (
    allow_forms,
    pack_weights,
    packable_bytes,
    stock_forms,
    unpack_weights,
)
from specrepl.engine.tuning import Tuning

__all__ = [
    "STOCK_ATTENTION",
    "allow_linear_forms",
    "apply_tuning",
    "attend_in_cache_dtype",
    "choose_copy_attention",
    "choose_grouped_attention",
    "pack_linear_weights",
    "undo_tuning",
    "unpack_linear_weights",
]

STOCK_ATTENTION = "sdpa"
"""The attention implementation `ATTENTION` and `GROUPED_ATTENTION` replace (and
`undo_tuning` restores)."""


def allow_linear_forms(model: PreTrainedModel, tuning: Tuning) -> None:
    """Let `model`'s plain float linear layers on the CPU take the weight-first
    form (`linear_forms.allow_forms`), and record whether any can."""
    tuning.linear_forms = allow_forms(model) > 0


def pack_linear_weights(model: PreTrainedModel, tuning: Tuning) -> bool:
    """Give `model`'s switched linear layers packed copies of their weights
    (`linear_forms.pack_weights`, where this torch and CPU can), and record
    it; returns whether they hold them. The copies take as much memory again
    as those weights, so they are made only when that is at most half of what
    the system could still give (`devices.available_memory`), never where
    that is unknown."""
    if tuning.packed_weights or not tuning.linear_forms:
        return tuning.packed_weights
    need = packable_bytes(model)
    free = available_memory()
    if need == 0 or free is None or need > free / 2:
        return False
    tuning.packed_weights = pack_weights(model) > 0
    return tuning.packed_weights


def unpack_linear_weights(model: PreTrainedModel, tuning: Tuning) -> None:
    """Drop the packed copies (no width of the plan uses them) and give their
    memory back."""
    if tuning.packed_weights:
        unpack_weights(model)
        tuning.packed_weights = False
        release_memory()


def attend_in_cache_dtype(model: PreTrainedModel, tuning: Tuning) -> bool:
    """Switch `model` (one using `sdpa`) to attend in its cache's dtype and record
    it; False, and nothing changed, for a model with another implementation."""
    if not can_attend_in_cache_dtype(model):
        return False
    model.set_attn_implementation(ATTENTION)
    tuning.attention = ATTENTION
    return True


def choose_copy_attention(copy: PreTrainedModel, tuning: Tuning, cache_dtype: torch.dtype) -> None:
    """For a copy of the target that takes the target's keys and values (in
    `cache_dtype`, the target's dtype): on a CPU, when its own dtype differs,
    time one query over a 512-token context both ways (once, ~20 ms) and attend
    in `cache_dtype` where that measured cheaper than casting the keys and
    values to the copy's dtype (`copy_attention.py`)."""
    own = copy.dtype
    if cache_dtype == own or next(copy.parameters()).device.type != "cpu":
        return
    costs = measure_attention(copy, cache_dtype)
    if costs and costs[cache_dtype] < costs[own]:
        attend_in_cache_dtype(copy, tuning)


def choose_grouped_attention(model: PreTrainedModel, tuning: Tuning) -> bool:
    """For a model on a CPU with grouped key/value heads that attends with
    `sdpa`: time a masked 8-token pass over a 1,024-token context with the
    heads repeated and grouped (once, a few milliseconds) and switch it to
    `GROUPED_ATTENTION` where grouped measured cheaper, recording it. Returns
    whether the model attends grouped; a model already switched to another
    implementation (a copy attending in its cache's dtype) is left as it is."""
    if tuning.attention == GROUPED_ATTENTION:
        return True
    if tuning.attention is None and model.config._attn_implementation == GROUPED_ATTENTION:
        tuning.attention = GROUPED_ATTENTION  # switched when wrapped before
        return True
    if tuning.attention is not None or not can_group_attention(model):
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    costs = measure_grouped_attention(model)
    if not costs or costs["grouped"] >= costs["repeated"]:
        return False
    model.set_attn_implementation(GROUPED_ATTENTION)
    tuning.attention = GROUPED_ATTENTION
    return True


def apply_tuning(model: PreTrainedModel, tuning: Tuning) -> None:
    """Make `model` (the same weights loaded again) run as `tuning` records
    (packed copies again only where the memory allows them now)."""
    if tuning.linear_forms:
        allow_forms(model)
        if tuning.packed_weights:
            tuning.packed_weights = False
            pack_linear_weights(model, tuning)
    if tuning.attention is not None:
        model.set_attn_implementation(tuning.attention)


def undo_tuning(model: PreTrainedModel, tuning: Tuning) -> None:
    """Give `model` its stock linear layers and attention back, and let `tuning`
    say so; its width plan is kept (without the switched layers, its passes
    run in the stock form)."""
    if tuning.linear_forms:
        stock_forms(model)  # the packed copies go with the switched class
        tuning.linear_forms = tuning.packed_weights = False
    if tuning.attention is not None:
        model.set_attn_implementation(STOCK_ATTENTION)
        tuning.attention = None
