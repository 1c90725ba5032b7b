"""Whether a greedy difference is a rounding near-tie or a bug: the target asked again.

Greedy speculative text must be the target's own. In low precision (bfloat16,
float16) a verification pass over k + 1 tokens rounds differently from the
target alone's one-token pass, so where the target's top two logits are
within that rounding the two runs can choose different tokens, both
correctly. `check_difference` asks the target about the position where the
two texts part: its logits there from one pass over the whole context (a
wide pass, as verification runs) and from a one-token pass after the rest
(as the target alone runs). The margin is how far the target alone's token
leads the other run's token in the one-token pass; the rounding is how far
the same two logits moved between the two passes, or the model dtype's step
at their size, whichever is larger. A margin within `TIE_FACTOR` roundings
is a near-tie; a larger one is a bug, and stays one.

It works through `RunnableModel.open()`, so on any runtime. This module
knows nothing of sessions, rendering or drafters.
"""

from __future__ import annotations

import math

import torch

from specrepl.engine.output_match import TieCheck, first_difference
from specrepl.engine.runtime import RunnableModel

__all__ = ["TIE_FACTOR", "check_difference", "logits_dtype", "weigh_difference"]

TIE_FACTOR = 2.0
"""How many roundings a margin may be and still count as a near-tie."""


def logits_dtype(runnable: RunnableModel) -> torch.dtype:
    """The dtype the model computes in (a llama.cpp model, which has none
    here, counts as float32: its float32 file)."""
    model = getattr(runnable, "model", None)
    return getattr(model, "dtype", torch.float32)


def dtype_step(dtype: torch.dtype, value: float) -> float:
    """The spacing of `dtype`'s numbers around `value` (one unit in the last place)."""
    if not dtype.is_floating_point:
        dtype = torch.float32
    magnitude = max(abs(value), torch.finfo(dtype).tiny)
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(magnitude))


@torch.no_grad()
def check_difference(
    runnable: RunnableModel,
    context: list[int],
    expected: int,
    other: int,
    vocab_size: int,
    *,
    position: int,
) -> TieCheck:
    """The target (`runnable`) at the position after `context`, where its own
    greedy run chose `expected` and another run chose `other`; `position` is
    that new token's index, for the verdict."""
    sequence = torch.tensor(context, device=runnable.device)
    wide, _ = runnable.open().score(sequence, 1, vocab_size)
    if len(context) > 1:
        narrow_runtime = runnable.open()
        narrow_runtime.score(sequence[:-1], 1, vocab_size)
        narrow, _ = narrow_runtime.score(sequence, 1, vocab_size)
    else:
        narrow = wide
    wide, narrow = wide[-1].float(), narrow[-1].float()
    margin = float(narrow[expected] - narrow[other])
    moved = max(
        abs(float(wide[expected] - narrow[expected])), abs(float(wide[other] - narrow[other]))
    )
    dtype = logits_dtype(runnable)
    step = dtype_step(dtype, max(abs(float(narrow[expected])), abs(float(narrow[other]))))
    rounding = max(moved, step)
    return TieCheck(
        position=position,
        margin=margin,
        rounding=rounding,
        dtype=str(dtype).removeprefix("torch."),
        near_tie=abs(margin) <= TIE_FACTOR * rounding,
    )


def weigh_difference(
    runnable: RunnableModel,
    prompt: list[int],
    target_tokens: list[int],
    other_tokens: list[int],
    vocab_size: int,
) -> TieCheck | None:
    """`check_difference` at the first new token where `other_tokens` part
    from the target's own `target_tokens` after `prompt`; None where they do
    not part or one run stopped before the other."""
    position = first_difference(other_tokens, target_tokens)
    if position is None or position >= min(len(other_tokens), len(target_tokens)):
        return None
    return check_difference(
        runnable,
        [*prompt, *target_tokens[:position]],
        target_tokens[position],
        other_tokens[position],
        vocab_size,
        position=position,
    )
