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

`allow_forms(model)` gives a model's plain `torch.nn.Linear` layers a forward
that can take another form, by a change of their class (transformers builds
the layers, and a layer's class decides its forward); `stock_forms` changes
them back. `pack_weights` gives those layers their packed copy (where this
torch and CPU can, see `packing_works`), `unpack_weights` drops it. Only the
loader calls them (`specrepl.models.tuning`, which records the changes in
the model's `Tuning` and decides whether the memory allows a packed copy).
The forms of a pass reach the layers through `chosen_forms`, a context
variable set for the length of one forward pass by the code that calls the
model (a model's `forward` has no argument that would reach its linear
layers); outside such a block, and for every other layer type (quantized
layers included), nothing changes, so transformers' own `generate()`
(bench's peers) runs the stock form. The original weights are neither copied
nor moved. Every form gives the same products up to rounding, like any
change of kernel.

This module knows nothing about drafting, widths or timing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "STOCK",
    "FormChoosingLinear",
    "RowForms",
    "allow_forms",
    "chosen_forms",
    "forms_allowed",
    "pack_weights",
    "packable_bytes",
    "packing_works",
    "stock_forms",
    "unpack_weights",
    "weights_packed",
]

PACKED = "packed_weight"
"""The attribute of a `FormChoosingLinear` that holds its packed copy (a plain
attribute: not a parameter or buffer, so never in a state dict)."""


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
_FORMS: ContextVar[RowForms] = ContextVar("row_forms", default=STOCK)


class FormChoosingLinear(nn.Linear):
    """A `nn.Linear` that multiplies in the form the active `RowForms` give its
    number of rows (see `chosen_forms`): packed when it holds a packed copy
    (`pack_weights`), or weight first. Only the forward differs: a layer
    becomes one by a change of class, keeping its parameters and hooks.

    Under `torch.compile` (transformers' compiled `generate()`, bench's
    hf-compiled peer) it is a plain `nn.Linear`: reading the context variable
    would break the graph at every layer and leave most of the model eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        forms = STOCK if torch.compiler.is_compiling() else _FORMS.get()
        if forms:
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            packed = getattr(self, PACKED, None) if forms.packs(rows) else None
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
        type(module) is nn.Linear
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.is_floating_point()
        and weight.device.type == "cpu"
    )


def allow_forms(model: nn.Module) -> int:
    """Let `model`'s plain float linear layers on the CPU take another form
    where `chosen_forms` asks for it; returns how many layers can.
    Idempotent. A model on a GPU gets none (its BLAS has no such gap)."""
    for module in model.modules():
        if _eligible(module):
            module.__class__ = FormChoosingLinear
    return sum(isinstance(module, FormChoosingLinear) for module in model.modules())


def stock_forms(model: nn.Module) -> None:
    """Undo `allow_forms` (and `pack_weights`): every layer it switched is a
    plain `nn.Linear` again."""
    unpack_weights(model)
    for module in model.modules():
        if type(module) is FormChoosingLinear:
            module.__class__ = nn.Linear


def forms_allowed(model: nn.Module) -> bool:
    """Whether any of `model`'s layers can take another form."""
    return any(isinstance(module, FormChoosingLinear) for module in model.modules())


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


def _packable(model: nn.Module) -> Iterator[FormChoosingLinear]:
    for module in model.modules():
        if isinstance(module, FormChoosingLinear) and packing_works(module.weight.dtype):
            yield module


def packable_bytes(model: nn.Module) -> int:
    """The memory a packed copy of `model`'s switched layers would take (as
    much again as their weights)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in _packable(model))


@torch.no_grad()
def pack_weights(model: nn.Module) -> int:
    """Give every layer switched by `allow_forms` whose dtype packs here its
    packed copy; returns how many layers hold one. Idempotent."""
    for module in _packable(model):
        if getattr(module, PACKED, None) is None:
            setattr(module, PACKED, torch.ops.mkldnn._reorder_linear_weight(module.weight, None))
    return sum(getattr(m, PACKED, None) is not None for m in model.modules())


def unpack_weights(model: nn.Module) -> None:
    """Drop the packed copies `pack_weights` made."""
    for module in model.modules():
        if getattr(module, PACKED, None) is not None:
            delattr(module, PACKED)


def weights_packed(model: nn.Module) -> bool:
    """Whether any of `model`'s layers holds a packed copy."""
    return any(getattr(module, PACKED, None) is not None for module in model.modules())


@contextlib.contextmanager
def chosen_forms(forms: RowForms) -> Iterator[None]:
    """Within the block (this thread or task), layers made by `allow_forms`
    multiply in the form `forms` give their number of rows."""
    token = _FORMS.set(forms)
    try:
        yield
    finally:
        _FORMS.reset(token)
