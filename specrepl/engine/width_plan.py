"""A width plan: the width each forward pass is fed at, and the form of its products.

A `WidthPlan` holds what `widths.py` measured for one model and machine:
the seconds of a pass per width, in its cheapest form, the width each width
is padded to, and the widths whose linear layers multiply weight first or
with packed weights (`linear_forms.py`), up to every prompt-sized pass.
`plan_widths` makes one from measured seconds. A model's `tuning.Tuning`
carries its plan; `forward.forward_pass` reads it at every pass.

This module knows nothing about timing, models or drafting.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from specrepl.engine.linear_forms import RowForms

__all__ = ["WidthPlan", "plan_widths"]


@dataclass(frozen=True)
class WidthPlan:
    """Measured forward seconds per width (in the cheapest form), the width each
    width is padded to, the widths whose pass multiplies weight first or with
    the packed weights, and from which width on every wider pass (a prompt) is
    packed (None: those run stock)."""

    seconds: dict[int, float]
    padded: dict[int, int]
    weight_first: frozenset[int] = frozenset()
    packed: frozenset[int] = frozenset()
    packed_from: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "ms_per_width": {w: round(s * 1e3, 2) for w, s in sorted(self.seconds.items())},
            "padded": {w: p for w, p in sorted(self.padded.items()) if p != w},
            "weight_first": sorted(self.weight_first),
            "packed": sorted(self.packed),
            "packed_from": self.packed_from,
        }

    @property
    def packs_any(self) -> bool:
        """Whether any pass of the plan multiplies with the packed weights."""
        return bool(self.packed) or self.packed_from is not None

    @functools.cached_property
    def forms(self) -> RowForms:
        """The forms of the linear layers' products by number of rows (made once:
        every forward pass of a model whose layers take them reads it)."""
        return RowForms(
            weight_first=self.weight_first, packed=self.packed, packed_from=self.packed_from
        )

    def step_seconds(self) -> dict[int, float]:
        """Measured seconds of a step with k drafts, by k: it feeds k + 1 tokens,
        padded to the width the plan chose."""
        return {
            width - 1: self.seconds[padded]
            for width, padded in self.padded.items()
            if padded in self.seconds
        }


def plan_widths(
    seconds: dict[int, float],
    *,
    margin: float = 0.9,
    weight_first: frozenset[int] = frozenset(),
    packed: frozenset[int] = frozenset(),
    packed_from: int | None = None,
) -> WidthPlan:
    """Pad a width to the cheapest larger measured width when that costs less
    than `margin` times its own time (a clear win, not noise). `seconds` are
    each width's in the form that `weight_first` and `packed` chose for it;
    `packed_from` is kept as given."""
    padded: dict[int, int] = {}
    for width, cost in seconds.items():
        larger = [(seconds[w], w) for w in seconds if w > width]
        best_cost, best = min(larger, default=(cost, width))
        padded[width] = best if best_cost < margin * cost else width
    return WidthPlan(
        seconds=dict(seconds),
        padded=padded,
        weight_first=frozenset(w for w in weight_first if w in seconds),
        packed=frozenset(w for w in packed if w in seconds),
        packed_from=packed_from,
    )
