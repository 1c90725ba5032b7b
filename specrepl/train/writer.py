"""The model that writes distill's prompts and answers, chosen by timing.

The data of a draft head are the target's greedy answers. They may be written
by the target itself or by a bfloat16 copy of it (answers only: the features
that become labels always come from the target), and on a CPU each of them
either with its linear layers in the stock form or multiplying with a packed
copy of their weights (oneDNN, `specrepl.engine.linear_forms`), where this
torch and CPU can and the memory allows. Which is fastest depends on the CPU
(bfloat16 arithmetic, the BLAS, the memory), so nothing here assumes it:
`choose_writer` times a few cached decoding steps of each candidate, shaped as
the writer's own (a batch of answers, one token each, after a prompt), and
keeps the fastest. The bfloat16 copy is kept only where it is clearly faster
(by `BFLOAT16_MARGIN`): the target's own answers are the better data.

An `AnswerWriter` holds the chosen model, its forms and the `Tuning` that
holds its packed copies and the attention of its passes (the target's); its
passes run so inside `writing()` only (`Tuning.running`: the model is the
stock model outside it), and `release()` gives the memory of packed copies
and of an unused copy back.

This module knows nothing of prompts, shards or training.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specrepl.engine.devices import synchronize
from specrepl.engine.linear_forms import STOCK, RowForms
from specrepl.engine.tuning import Tuning
from specrepl.models.tuning import allow_linear_forms, pack_linear_weights, unpack_linear_weights
from specrepl.train.data import batched_generate

__all__ = ["BFLOAT16_MARGIN", "AnswerWriter", "batch_seconds", "choose_writer"]

BFLOAT16_MARGIN = 1.1
"""How much faster a bfloat16 copy must write than the best float32 form of
the target to write the answers instead."""

EVERY_PASS_PACKED = RowForms(packed_from=1)


@dataclass
class AnswerWriter:
    """The model that writes, its dtype's name, the forms of its passes, what
    each candidate measured (seconds to write a batch, by label), and the
    tuning its passes run with (its packed copies, its attention)."""

    model: PreTrainedModel
    dtype: str
    forms: RowForms = STOCK
    timed: dict[str, float] = field(default_factory=dict)
    tuning: Tuning = field(default_factory=Tuning)

    @property
    def form(self) -> str:
        """`packed` or `stock`: how its linear layers multiply."""
        return "packed" if self.forms else "stock"

    @property
    def label(self) -> str:
        return f"{self.dtype}, {self.form}"

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Within the block, the writer's passes run in its chosen forms, with its
        tuning's packed copies and attention."""
        with self.tuning.running(self.model, self.forms):
            yield

    def release(self) -> None:
        """Give the memory of the writer's packed copies back."""
        unpack_linear_weights(self.tuning)


@torch.no_grad()
def batch_seconds(
    model: PreTrainedModel,
    forms: RowForms = STOCK,
    *,
    tuning: Tuning | None = None,
    rows: int = 16,
    prompt_tokens: int = 128,
    answer_tokens: int = 128,
    steps: int = 16,
) -> float:
    """About how long `model`, run as `tuning` runs it (None: the stock model)
    in `forms`, takes to answer `rows` prompts of
    `prompt_tokens` tokens (half of them shorter, as a padded batch holds) with
    `answer_tokens` tokens each, timed on the writer's own code
    (`data.batched_generate`, after a warm-up run): the prompt pass, plus
    `answer_tokens` times a decoding step (the difference of a run of 1 + `steps`
    tokens and the quicker of two runs of 1, over `steps`)."""
    tuning = Tuning() if tuning is None else tuning
    vocab = int(model.config.get_text_config().vocab_size)
    rng = random.Random(0)
    prompts = [
        [rng.randrange(vocab) for _ in range(rng.randint(prompt_tokens // 2, prompt_tokens))]
        for _ in range(rows)
    ]

    def run(new_tokens: int) -> float:
        device = next(model.parameters()).device
        synchronize(device)
        began = time.perf_counter()
        with tuning.running(model, forms):
            batched_generate(
                model,
                prompts,
                max_new_tokens=new_tokens,
                end_tokens=(),
                pad_id=0,
                keep_features=False,
            )
        synchronize(device)
        return time.perf_counter() - began

    run(2)  # warm-up: the kernels for these shapes
    prompt = min(run(1), run(1))
    step = max(run(1 + steps) - prompt, 0.0) / steps
    return prompt + answer_tokens * step


def _candidates(
    model: PreTrainedModel, dtype: str, attention: str | None, timed: dict[str, float]
) -> list[AnswerWriter]:
    """The ways `model` can write here: stock, and packed where its layers take
    a packed copy (held by that candidate's tuning until `release`), each
    attending with `attention` (None: as loaded)."""
    stock = AnswerWriter(model, dtype, STOCK, timed, Tuning(attention=attention))
    packed = Tuning(attention=attention)
    allow_linear_forms(model, packed)
    if not pack_linear_weights(model, packed):
        return [stock]
    return [stock, AnswerWriter(model, dtype, EVERY_PASS_PACKED, timed, packed)]


def _fastest(
    model: PreTrainedModel,
    dtype: str,
    attention: str | None,
    shape: dict[str, int],
    timed: dict[str, float],
) -> AnswerWriter:
    candidates = _candidates(model, dtype, attention, timed)
    for candidate in candidates:
        timed[candidate.label] = batch_seconds(
            model, candidate.forms, tuning=candidate.tuning, **shape
        )
    best = min(candidates, key=lambda candidate: timed[candidate.label])  # stock on a tie
    for candidate in candidates:
        if candidate is not best:
            candidate.release()  # its packed copies are not used
    return best


def choose_writer(
    target: PreTrainedModel,
    dtype: str = "auto",
    *,
    attention: str | None = None,
    rows: int = 16,
    prompt_tokens: int = 128,
    answer_tokens: int = 128,
) -> AnswerWriter:
    """The writer of the answers for `dtype` (`float32`: the target, `bfloat16`:
    a bfloat16 copy, `auto`: a target in another dtype than float32 itself,
    else whichever of the two measured faster, the copy by `BFLOAT16_MARGIN`),
    each in its faster form, timed over `rows` prompts of `prompt_tokens`
    tokens answered with `answer_tokens` tokens each (`batch_seconds`). Each
    writer's passes attend with `attention` (the target's passes' own; None:
    as loaded)."""
    timed: dict[str, float] = {}
    shape = {"rows": rows, "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens}
    target_dtype = str(target.dtype).removeprefix("torch.")
    if dtype == "float32" or (dtype == "auto" and target.dtype != torch.float32):
        return _fastest(target, target_dtype, attention, shape, timed)
    copy_bf16 = copy.deepcopy(target).to(torch.bfloat16).eval()
    if dtype == "bfloat16":
        return _fastest(copy_bf16, "bfloat16", attention, shape, timed)
    own = _fastest(target, target_dtype, attention, shape, timed)
    cheaper = _fastest(copy_bf16, "bfloat16", attention, shape, timed)
    if BFLOAT16_MARGIN * timed[cheaper.label] < timed[own.label]:
        own.release()
        return cheaper
    return own
