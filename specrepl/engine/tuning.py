"""The tuning of one loaded model: what its forward passes do beyond the stock call.

A `Tuning` holds three measured choices for one model:

- its width plan (`width_plan.py`, timed by `widths.py`): the width each pass
  is padded to, and the widths whose linear layers multiply weight first or
  with packed weights;
- whether the model has linear layers that can take another form
  (`linear_forms.py`), without which the plan's other forms do nothing, and
  whether its passes multiply with packed copies of their weights, which the
  tuning holds (`FormLayers`), without which its packed widths run in the
  stock form;
- the attention its passes use, when a copy of the target attends in the
  dtype of the target's keys and values (`copy_attention.py`), or a model
  keeps its grouped key/value heads grouped in passes of several tokens
  (`grouped_attention.py`).

Whoever loads the models creates one per model (`specrepl.models`: a
`LoadedModel` carries it, and `specrepl.models.tuning` is the one place that
records its choices) and passes it in: the generators take the target's
(`tuning=`), a model drafter its model's, and `forward.forward_pass` runs
every pass inside `Tuning.running`, as do the timings that run passes in
chosen forms. A holder that was given it before a plan was timed again reads
the new plan at its next pass. Nothing here is module-global.

The model itself is never changed outside such a pass: it keeps its stock
classes, no attribute is added to it, and its config names the attention it
was loaded with, so whatever else runs it (transformers' `generate()` for
bench's peers, training) runs the stock model. For the length of a pass only,
its linear layers take the form-choosing forward and its config the tuned
attention; both are given back when the pass ends, also when it fails or is
interrupted.

This module knows nothing about loading, drafting or timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel

from specrepl.engine.copy_attention import ATTENTION
from specrepl.engine.linear_forms import STOCK, FormLayers, RowForms
from specrepl.engine.width_plan import WidthPlan

__all__ = ["Tuning", "attending_with"]


@dataclass
class Tuning:
    """How specrepl's forward passes run one model (an empty one: every pass as
    fed, in the stock form, with the attention it was loaded with)."""

    plan: WidthPlan | None = None
    """The model's width plan; None: not timed (no padding, stock form)."""
    linear_forms: bool = False
    """The model has plain float linear layers on the CPU that can take another
    form in its passes (`linear_forms.FormLayers`; recorded by the loader)."""
    packed_weights: bool = False
    """Its passes may multiply with packed copies of those layers' weights, which
    `layers` holds (made by the loader where the memory allows)."""
    attention: str | None = None
    """The attention implementation the model's passes use
    (`copy_attention.ATTENTION` or `grouped_attention.GROUPED_ATTENTION`);
    None: the one it was loaded with."""
    layers: FormLayers = field(default_factory=FormLayers, repr=False, compare=False)
    """The model's layers that can take another form, and the packed copies."""

    def padded_width(self, width: int) -> int:
        """The width to feed instead of `width` (itself when there is no plan)."""
        if self.plan is None:
            return width
        return self.plan.padded.get(width, width)

    @property
    def weight_first(self) -> frozenset[int]:
        """The widths whose passes multiply weight first (none without a plan, or
        when the layers cannot take that form)."""
        if self.plan is None or not self.linear_forms:
            return frozenset()
        return self.plan.weight_first

    @property
    def packed(self) -> frozenset[int]:
        """The widths whose passes multiply with the packed weights (none without
        a plan, or without packed copies)."""
        if self.plan is None or not (self.linear_forms and self.packed_weights):
            return frozenset()
        return self.plan.packed

    @property
    def packed_from(self) -> int | None:
        """The width from which every wider pass (a prompt) multiplies with the
        packed weights (None without a plan, packed copies, or such passes)."""
        if self.plan is None or not (self.linear_forms and self.packed_weights):
            return None
        return self.plan.packed_from

    @property
    def forms(self) -> RowForms:
        """The forms a pass takes, by its number of rows (what `running` sets):
        the plan's own when the layers can take all of them."""
        if self.plan is None or not self.linear_forms:
            return STOCK
        if self.packed_weights or not self.plan.packs_any:
            return self.plan.forms
        return RowForms(weight_first=self.plan.weight_first)

    @property
    def one_token_step(self) -> float | None:
        """The model's measured seconds for a one-token step, if timed."""
        return None if self.plan is None else self.plan.seconds.get(1)

    @property
    def attends_in_cache_dtype(self) -> bool:
        """Whether the model attends in its cache's dtype, so that a copy of the
        target can keep the target's keys and values uncast."""
        return self.attention == ATTENTION

    @contextlib.contextmanager
    def running(self, model: PreTrainedModel, forms: RowForms | None = None) -> Iterator[None]:
        """Within the block, `model`'s passes run as this tuning says: its linear
        layers in `forms` (None: the tuning's own) with the packed copies held
        here, its attention this tuning's; on leaving it, also by an exception,
        the model is as it was. The layers are switched where the model has
        layers that can take another form and the pass's forms are not all
        stock, or where `forms` are given (a timing: every form, stock
        included, is timed on the layers that run it)."""
        chosen = self.forms if forms is None else forms
        switch = self.linear_forms and (forms is not None or bool(chosen))
        with (
            self.layers.in_forms(model, chosen) if switch else contextlib.nullcontext(),
            attending_with(model, self.attention),
        ):
            yield


def _attention_configs(config: Any) -> Iterator[Any]:
    """`config` and its sub-configs (a multimodal model's text config), all levels."""
    yield config
    for key in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, key, None)
        if sub is not None:
            yield from _attention_configs(sub)


@contextlib.contextmanager
def attending_with(model: PreTrainedModel, implementation: str | None) -> Iterator[None]:
    """Within the block, `model` attends with `implementation` (None: as loaded):
    every config of the model that names the implementation it was loaded with
    names this one instead (what transformers' `set_attn_implementation` writes,
    without its checks, which the loader's choice has made), and names the old
    one again on leaving the block, also by an exception."""
    loaded = model.config._attn_implementation
    configs = []
    if implementation is not None and implementation != loaded:
        configs = [c for c in _attention_configs(model.config) if c._attn_implementation == loaded]
    try:
        for config in configs:
            config._attn_implementation_internal = implementation
        yield
    finally:
        for config in configs:
            config._attn_implementation_internal = loaded
