"""Tuning a loaded model: the one place that chooses how specrepl's passes run a model.

Each loaded model carries a `Tuning` (`specrepl.engine.tuning`: its width
plan, its linear forms, its attention), made by the loader and handed to
whatever runs the model. The functions here record the loader's choices in
it; none of them changes the model, which stays the stock model outside
specrepl's own passes (`Tuning.running` gives it the choices for the length
of a pass):

- whether a model has plain float linear layers on the CPU that can take
  another form of the product (`allow_linear_forms`), and packed copies of
  their weights, held by the tuning, where the memory allows
  (`pack_linear_weights`, dropped by `unpack_linear_weights` when no width
  measured faster with them);
- the attention of a copy of the target that attends cheaper in the dtype
  of the target's keys and values, `copy_attention.ATTENTION`
  (`choose_copy_attention`), and of a model with grouped key/value heads
  that attends with `sdpa`, `grouped_attention.GROUPED_ATTENTION`, where
  masked passes of several tokens measured cheaper with the heads kept
  grouped (`choose_grouped_attention`).

`apply_tuning` readies a tuning for its model loaded again (the packed
copies go with the layers they were made from). This module knows nothing
about decoding, settings or the store.
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
from specrepl.engine.linear_forms import packable_bytes
from specrepl.engine.tuning import Tuning

__all__ = [
    "allow_linear_forms",
    "apply_tuning",
    "attend_in_cache_dtype",
    "choose_copy_attention",
    "choose_grouped_attention",
    "pack_linear_weights",
    "unpack_linear_weights",
]


def allow_linear_forms(model: PreTrainedModel, tuning: Tuning) -> None:
    """Record whether `model` has plain float linear layers on the CPU, which
    can take the weight-first form in its passes (`linear_forms.FormLayers`)."""
    tuning.linear_forms = bool(tuning.layers.layers(model))


def pack_linear_weights(model: PreTrainedModel, tuning: Tuning) -> bool:
    """Have `tuning` hold packed copies of the weights of `model`'s layers that
    can take another form (`linear_forms.FormLayers.pack`, where this torch
    and CPU can), and record it; returns whether its passes have them. The
    copies take as much memory again as those weights, so they are made only
    when that is at most half of what the system could still give
    (`devices.available_memory`), never where that is unknown."""
    if not tuning.linear_forms:
        return tuning.packed_weights
    if tuning.packed_weights and tuning.layers.packed(model):
        return True
    need = packable_bytes(model)
    free = available_memory()
    if need == 0 or free is None or need > free / 2:
        return False
    tuning.packed_weights = tuning.layers.pack(model) > 0
    return tuning.packed_weights


def unpack_linear_weights(tuning: Tuning) -> None:
    """Drop the packed copies (no width of the plan uses them) and give their
    memory back."""
    if tuning.packed_weights:
        tuning.layers.unpack()
        tuning.packed_weights = False
        release_memory()


def attend_in_cache_dtype(model: PreTrainedModel, tuning: Tuning) -> bool:
    """Record that `model` (one using `sdpa`) attends in its cache's dtype in its
    passes; False, and nothing recorded, for a model with another
    implementation."""
    if not can_attend_in_cache_dtype(model):
        return False
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
    heads repeated and grouped (once, a few milliseconds) and record
    `GROUPED_ATTENTION` as its passes' attention where grouped measured
    cheaper. Returns whether its passes attend grouped; a tuning that chose
    another implementation (a copy attending in its cache's dtype) is left as
    it is."""
    if tuning.attention == GROUPED_ATTENTION:
        return True
    if tuning.attention is not None or not can_group_attention(model):
        return False
    if next(model.parameters()).device.type != "cpu":
        return False
    costs = measure_grouped_attention(model)
    if not costs or costs["grouped"] >= costs["repeated"]:
        return False
    tuning.attention = GROUPED_ATTENTION
    return True


def apply_tuning(model: PreTrainedModel, tuning: Tuning) -> None:
    """Ready `tuning` for `model`, the same weights loaded again: packed copies
    of its layers again, where the tuning had them and the memory allows them
    now (those of the model it replaces went with their layers). Its plan,
    forms and attention apply as they are."""
    if tuning.packed_weights:
        tuning.packed_weights = False
        pack_linear_weights(model, tuning)
