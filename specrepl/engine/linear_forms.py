"""Which form a model's linear layers multiply a few rows in, on a CPU.

A speculative step feeds the target 1 + k tokens, so every linear layer
multiplies a few rows x (rows, in) by its weight W (out, in). `F.linear`
computes x Wᵀ; on the 2-core AMD EPYC this project is measured on, the BLAS
handles that badly for 2 to 9 rows: the embedded float32 target took 59 ms
to score one token but 95-119 ms for 2 to 9 (a memory-bound pass should cost
little more, since the weights are read once either way). The same product
written weight first, (W xᵀ)ᵀ, took 64-102 ms for 2 to 9 (67-73 ms for 2 to 4),
while the target's bf16 copy was faster in the stock form at every width.
Which form is cheaper depends on the CPU, the BLAS, the
dtype and the number of rows, so nothing here decides: `widths.py` times both
forms per width once per model and machine, and `forward.forward_pass` runs
each pass with the set of row counts that measured faster weight first (the
plan's, from the model's `tuning.Tuning`).

`allow_forms(model)` gives a model's plain `torch.nn.Linear` layers a forward
that can read that set, by a change of their class (transformers builds the
layers, and a layer's class decides its forward); `stock_forms` changes them
back. Only the loader calls them (`specrepl.models.tuning`, which records the
change in the model's `Tuning`). The set reaches the layers through
`weight_first_rows`, a context variable set for the length of one forward
pass by the code that calls the model (a model's `forward` has no argument
that would reach its linear layers); outside such a block, and for every
other layer type (quantized layers included), nothing changes, so
transformers' own `generate()` (bench's peers) runs the stock form. The
weights are not copied or moved. Both forms give the same products up to
rounding, like any change of kernel.

This module knows nothing about drafting, widths or timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FormChoosingLinear",
    "allow_forms",
    "forms_allowed",
    "stock_forms",
    "weight_first_rows",
]

_WEIGHT_FIRST: ContextVar[frozenset[int]] = ContextVar("weight_first_rows", default=frozenset())


class FormChoosingLinear(nn.Linear):
    """A `nn.Linear` that multiplies weight first when its number of rows is in
    the active set (see `weight_first_rows`). Only the forward differs: a layer
    becomes one by a change of class, keeping its parameters and hooks.

    Under `torch.compile` (transformers' compiled `generate()`, bench's
    hf-compiled peer) it is a plain `nn.Linear`: reading the context variable
    would break the graph at every layer and leave most of the model eager."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = frozenset() if torch.compiler.is_compiling() else _WEIGHT_FIRST.get()
        if chosen:
            rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
            if rows in chosen:
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
    """Let `model`'s plain float linear layers on the CPU take the weight-first
    form where `weight_first_rows` asks for it; returns how many layers can.
    Idempotent. A model on a GPU gets none (its BLAS has no such gap)."""
    for module in model.modules():
        if _eligible(module):
            module.__class__ = FormChoosingLinear
    return sum(isinstance(module, FormChoosingLinear) for module in model.modules())


def stock_forms(model: nn.Module) -> None:
    """Undo `allow_forms`: every layer it switched is a plain `nn.Linear` again."""
    for module in model.modules():
        if type(module) is FormChoosingLinear:
            module.__class__ = nn.Linear


def forms_allowed(model: nn.Module) -> bool:
    """Whether any of `model`'s layers can take the weight-first form."""
    return any(isinstance(module, FormChoosingLinear) for module in model.modules())


@contextlib.contextmanager
def weight_first_rows(rows: frozenset[int]) -> Iterator[None]:
    """Within the block (this thread or task), layers made by `allow_forms`
    multiply weight first whenever their input has a number of rows in `rows`."""
    token = _WEIGHT_FIRST.set(frozenset(rows))
    try:
        yield
    finally:
        _WEIGHT_FIRST.reset(token)
