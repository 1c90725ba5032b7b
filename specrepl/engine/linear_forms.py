"""Which form a model's linear layers multiply a few rows in, on a CPU.

A speculative step feeds the target 1 + k tokens, so every linear layer
multiplies a few rows x (rows, in) by its weight W (out, in). `F.linear`
computes x Wᵀ; on the 2-core AMD EPYC this project is measured on, the BLAS
(MKL) handles that badly for 2 to 9 rows: the embedded float32 target took 59
ms to score one token but 95-119 ms for 2 to 9 (a memory-bound pass should
cost little more, since the weights are read once either way). Two other
forms of the same product:

- weight first, (W xᵀ)ᵀ: 55-76 ms for 2 to 8 rows there, worse past 9;
- packed: the weight copied once into oneDNN's blocked layout for this CPU
  (`torch.ops.mkldnn._reorder_linear_weight`) and multiplied by oneDNN
  (`_linear_pointwise`): 46 ms for one row, 46-49 ms for 2 to 9 and 56-60
  ms for 16 and 17 (same machine, 2026-11-26). It costs a second copy of the
  weights in memory.

Which form is cheaper depends on the CPU, the BLAS, the dtype and the number
of rows, so nothing here decides: `widths.py` times every form the layers can
take per width once per model and machine, and `forward.forward_pass` runs
each pass in the form that measured cheapest for its number of rows (the
plan's, from the model's `tuning.Tuning`).

A `FormLayers` (a `tuning.Tuning` owns one) finds a model's plain float
`torch.nn.Linear` layers on the CPU that can take another form, and holds the
packed copies of their weights (where this torch and CPU can, see
`packing_works`), by layer, weakly: a model let go of takes its copies with
it. Nothing is written into the model. Only for the length of one pass
(`FormLayers.in_forms`, entered by the code that calls the model) do those
layers take a forward that can choose its form, by a change of their class
(transformers builds the layers, and a layer's class decides its forward,
which has no argument that would reach it); their class is given back when
the pass ends, also when it fails or is interrupted. The forms of the pass
and its packed copies reach the layers through a context variable, so
another thread running the same model meanwhile runs the stock form; outside
such a pass, and for every other layer type (quantized layers included),
nothing changes, so transformers' own `generate()` (bench's peers) and
training run the stock model. The original weights are neither copied nor
moved. Every form gives the same products up to rounding, like any change
of kernel.

This module knows nothing about drafting, widths or timing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "STOCK",
    "FormChoosingLinear",
    "FormLayers",
    "RowForms",
    "packable_bytes",
    "packing_works",
]


@dataclass(frozen=True)
class RowForms:
    """The forms of one forward pass, by number of rows: the row counts whose
    products are packed (those in `packed`, and with `packed_from` every count
    from it up: prompt-sized passes), and those multiplied weight first (stock
    otherwise; packed wins where a count is in both)."""

    weight_first: frozenset[int] = frozenset()
    packed: frozenset[int] = frozenset()
    packed_from: int | None = None

    def __bool__(self) -> bool:
        return bool(self.weight_first or self.packed or self.packed_from is not None)

    def packs(self, rows: int) -> bool:
        """Whether a product of `rows` rows is packed."""
        return rows in self.packed or (self.packed_from is not None and rows >= self.packed_from)


STOCK = RowForms()
"""Every product in the stock form."""


@dataclass(frozen=True)
class _Pass:
    """What the layers of one pass read: its forms and the packed copies by layer."""

    forms: RowForms
    packed: Mapping[nn.Module, torch.Tensor]


_PASS: ContextVar[_Pass | None] = ContextVar("form_pass", default=None)


class FormChoosingLinear(nn.Linear):
    """The class a plain `nn.Linear` takes for the length of a pass
    (`FormLayers.in_forms`): it multiplies in the form the pass's `RowForms`
    give its number of rows, packed when the pass holds a packed copy of its
    weight, or weight first. Only the forward differs, so the change of class
    keeps the layer's parameters and hooks.

    Under `torch.compile` it is a plain `nn.Linear`: reading the context
    variable would break the graph at every layer and leave most of the model
    eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        active = None if torch.compiler.is_compiling() else _PASS.get()
        if active is not None and active.forms:
            forms = active.forms
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            packed = active.packed.get(self) if forms.packs(rows) else None
            if packed is not None and x.dtype == self.weight.dtype:
                flat = x.reshape(rows, x.shape[-1]).contiguous()
                out = torch.ops.mkldnn._linear_pointwise(flat, packed, self.bias, "none", [], "")
                return out.reshape(*x.shape[:-1], self.weight.shape[0])
            if rows in forms.weight_first:
                flat = x.reshape(rows, x.shape[-1])
                out = torch.mm(self.weight, flat.T).T
                if self.bias is not None:
                    out = out + self.bias
                return out.reshape(*x.shape[:-1], self.weight.shape[0])
        return F.linear(x, self.weight, self.bias)


def _eligible(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) in (nn.Linear, FormChoosingLinear)  # switched: inside another pass
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.is_floating_point()
        and weight.device.type == "cpu"
    )


@functools.cache
def packing_works(dtype: torch.dtype) -> bool:
    """Whether this torch and CPU pack weights of `dtype` and multiply with them
    as `F.linear` does (tried once per dtype on a small product; the packing
    operators are oneDNN's, which not every build has)."""
    try:
        weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(0)).to(dtype)
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, NotImplementedError, RuntimeError):
        return False
    expected = F.linear(x, weight).float()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    return out.shape == expected.shape and bool(
        torch.allclose(out.float(), expected, rtol=tolerance, atol=tolerance)
    )


def _packable(layers: Iterable[nn.Module]) -> Iterator[nn.Module]:
    for layer in layers:
        if packing_works(layer.weight.dtype):
            yield layer


def packable_bytes(model: nn.Module) -> int:
    """The memory a packed copy of `model`'s layers that can take another form
    would take (as much again as their weights)."""
    layers = (m for m in model.modules() if _eligible(m))
    return sum(m.weight.numel() * m.weight.element_size() for m in _packable(layers))


class FormLayers:
    """The layers of a model that can take another form (its plain float
    `nn.Linear` layers on the CPU; a model on a GPU has none, its BLAS has no
    such gap), and the packed copies of their weights, both held weakly: by
    model and by layer. What a `tuning.Tuning` owns of the linear forms."""

    def __init__(self) -> None:
        self._layers: WeakKeyDictionary[nn.Module, tuple[nn.Module, ...]] = WeakKeyDictionary()
        self._packed: WeakKeyDictionary[nn.Module, torch.Tensor] = WeakKeyDictionary()

    def layers(self, model: nn.Module) -> tuple[nn.Module, ...]:
        """`model`'s layers that can take another form (found once per model)."""
        found = self._layers.get(model)
        if found is None:
            found = tuple(m for m in model.modules() if _eligible(m))
            self._layers[model] = found
        return found

    @torch.no_grad()
    def pack(self, model: nn.Module) -> int:
        """Hold a packed copy of the weight of every layer of `model` whose dtype
        packs here; returns how many of its layers have one. Idempotent."""
        for layer in _packable(self.layers(model)):
            if layer not in self._packed:
                self._packed[layer] = torch.ops.mkldnn._reorder_linear_weight(layer.weight, None)
        return sum(layer in self._packed for layer in self.layers(model))

    def unpack(self) -> None:
        """Drop every packed copy."""
        self._packed.clear()

    def packed(self, model: nn.Module) -> bool:
        """Whether a packed copy of any of `model`'s layers is held."""
        return any(layer in self._packed for layer in self.layers(model))

    @contextlib.contextmanager
    def in_forms(self, model: nn.Module, forms: RowForms) -> Iterator[None]:
        """Within the block (this thread or task), `model`'s layers that can
        take another form multiply in the form `forms` give their number of
        rows, with the packed copies held here; on leaving it, also by an
        exception, they are plain `nn.Linear` layers again. Layers already
        switched by an enclosing block are left to it."""
        switched: list[nn.Module] = []
        token = _PASS.set(_Pass(forms, self._packed))
        try:
            for layer in self.layers(model):
                if type(layer) is nn.Linear:
                    switched.append(layer)  # first: an interrupt never leaves one switched
                    # object's own: nn.Module.__setattr__'s checks cost far more than the switch
                    object.__setattr__(layer, "__class__", FormChoosingLinear)
            yield
        finally:
            for layer in switched:
                object.__setattr__(layer, "__class__", nn.Linear)
            _PASS.reset(token)
