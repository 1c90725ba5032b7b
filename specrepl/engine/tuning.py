"""The tuning of one loaded model: what its forward passes do beyond the stock call.

A `Tuning` holds three measured choices for one model:

- its width plan (`widths.py`): the width each pass is padded to, and the
  widths whose linear layers multiply weight first or with packed weights;
- whether its linear layers were switched to the form-choosing class
  (`linear_forms.py`), without which the plan's other forms do nothing, and
  whether they hold packed copies of their weights, without which its packed
  widths run in the stock form;
- its attention implementation, when a copy of the target attends in the
  dtype of the target's keys and values (`copy_attention.py`), or a model
  keeps its grouped key/value heads grouped in passes of several tokens
  (`grouped_attention.py`).

Whoever loads the models creates one per model (`specrepl.models`: a
`LoadedModel` carries it, and `specrepl.models.tuning` is the one place that
changes it and the model to match) and passes it in: the generators take the
target's (`tuning=`), a model drafter its model's, and `forward.forward_pass`
reads it at every pass. A holder that was given it before a plan was timed
again reads the new plan at its next pass. Nothing here is module-global, and
this module writes nothing into a model.

This module knows nothing about loading, drafting or timing.
"""

from __future__ import annotations

from dataclasses import dataclass

from specrepl.engine.copy_attention import ATTENTION
from specrepl.engine.linear_forms import STOCK, RowForms
from specrepl.engine.widths import WidthPlan

__all__ = ["Tuning"]


@dataclass
class Tuning:
    """How specrepl's forward passes run one model (an empty one: every pass as
    fed, in the stock form, with the attention it was loaded with)."""

    plan: WidthPlan | None = None
    """The model's width plan; None: not timed (no padding, stock form)."""
    linear_forms: bool = False
    """The model's plain float linear layers on the CPU can take another form
    (the loader switched their class: `linear_forms.allow_forms`)."""
    packed_weights: bool = False
    """Those layers hold packed copies of their weights (`linear_forms.pack_weights`)."""
    attention: str | None = None
    """The attention implementation the loader switched the model to
    (`copy_attention.ATTENTION` or `grouped_attention.GROUPED_ATTENTION`);
    None: the one it was loaded with."""

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
        a plan, or when the layers hold no packed copies)."""
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
        """The forms a pass takes, by its number of rows (what `forward_pass` sets):
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
