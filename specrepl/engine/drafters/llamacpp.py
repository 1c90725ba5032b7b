"""The drafter model run by llama.cpp on its own GGUF file, where that is cheaper.

A drafter only pays when one of its tokens costs a small share of a target
step. The embedded pair's drafter is a copy of the target (SmolLM2-135M has no
smaller sibling), and on a CPU torch runs that copy in bfloat16 at about 0.55
to 0.67 of a float32 target step: too dear to go far past 1.3x. The same
weights ship as a 4-bit GGUF file, and llama.cpp's kernels for it (8-bit
activations against 4-bit blocks) decode a token several times faster than
torch does, while agreeing with the float32 target on most greedy tokens. So
a drafter model that was loaded from a GGUF file can draft in llama.cpp: the
output is still exactly the target's (the drafts' laws q are llama.cpp's
softmax, as for any drafter).

`LlamaCppDraftRuntime` is the `draft_runtime.DraftRuntime` over a
`llama_cpp.Llama`: the tokens it holds are the binding's record of what it
evaluated, so a cut is a truncation, and several drafters may share one
binding. Its tokens sit at positions one after another, except where a copy
holds a window of a long chat (`HeldPositions`, which the copy's importer
keeps): the chat's start, then recent positions where the target holds
them, so that no key is ever rotated again. The drafter over it is
`model.ModelDrafter`, as for torch; `llamacpp_drafter` builds one. Whether
llama.cpp runs the drafter at all, and the default window, are decided by
measurement in `runtime.py`; this module knows nothing of that choice or of
settings.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specrepl.engine.drafters.draft_runtime import DraftRuntime, Importer
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.llamacpp import import_llamacpp

__all__ = ["HeldPositions", "LlamaCppDraftRuntime", "held_positions", "llamacpp_drafter"]


@dataclass
class HeldPositions:
    """Where the tokens a llama.cpp binding holds sit: token i at position i,
    except that from token `gap_at` on each sits `skipped` positions later."""

    gap_at: int = 0
    skipped: int = 0

    def position(self, index: int) -> int:
        """The position of the `index`-th token held (or of the next one fed)."""
        return index + self.skipped if index >= self.gap_at else index

    def cut(self, length: int) -> None:
        """Only the first `length` tokens are held: no gap once none after it is."""
        if length <= self.gap_at:
            self.gap_at, self.skipped = 0, 0


_POSITIONS: weakref.WeakKeyDictionary[Any, HeldPositions] = weakref.WeakKeyDictionary()


def held_positions(llama: Any) -> HeldPositions:
    """The record of where the tokens `llama` (a `llama_cpp.Llama`) holds sit,
    one per binding: its draft runtimes read it, a copy's importer writes it."""
    return _POSITIONS.setdefault(llama, HeldPositions())


class LlamaCppDraftRuntime(DraftRuntime):
    """A `llama_cpp.Llama` holding the drafter model's GGUF file, fed token by
    token, its tokens where its `held_positions` record says."""

    name = "llama.cpp"

    def __init__(self, llama: Any) -> None:
        self._llama_cpp = import_llamacpp()
        self.llama = llama
        self.positions = held_positions(llama)
        self.width = int(llama.n_vocab())
        # the binding records tokens in an array of the context asked for, which
        # llama.cpp itself may round up
        self.context = min(int(llama.n_ctx()), len(llama.input_ids))

    @property
    def model(self) -> Any:
        return self.llama

    def held(self) -> list[int]:
        return self.llama.input_ids[: self.llama.n_tokens].tolist()

    def feed(self, tokens: list[int]) -> None:
        held = self.llama.n_tokens
        first = self.positions.position(held)
        if first == held:
            self.llama.eval(tokens)  # removes every position from `n_tokens` on first
            return
        llama, library = self.llama, self._llama_cpp
        library.llama_memory_seq_rm(library.llama_get_memory(llama.ctx), -1, first, -1)
        for offset in range(0, len(tokens), llama.n_batch):
            part = tokens[offset : offset + llama.n_batch]
            llama._batch.set_batch(batch=part, n_past=first + offset, logits_all=False)
            llama._ctx.decode(llama._batch)
        llama.input_ids[held : held + len(tokens)] = tokens
        llama.n_tokens = held + len(tokens)

    def last_logits(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        row = np.ctypeslib.as_array(pointer, shape=(self.width,))
        return torch.from_numpy(row[:vocab_size].copy()).to(device)

    def cut(self, length: int) -> None:
        self.llama.n_tokens = min(self.llama.n_tokens, length)
        self.positions.cut(self.llama.n_tokens)


def llamacpp_drafter(
    llama: Any,
    *,
    keep_between_prompts: bool = False,
    name: str = "model",
    window: int | None = None,
    importer: Importer | None = None,
    read_seconds_per_token: float | None = None,
    held_window: int | None = None,
) -> ModelDrafter:
    """The model drafter over `llama` (see `ModelDrafter` for the options).

    The importer of a copy is `llamacpp_kv.KvImporter` for a torch target,
    `llamacpp_state.StateImporter` for a llama.cpp one: it writes into the
    binding it holds, which must be (or wrap) `llama`."""
    return ModelDrafter(
        LlamaCppDraftRuntime(llama),
        keep_between_prompts=keep_between_prompts,
        name=name,
        window=window,
        importer=importer,
        read_seconds_per_token=read_seconds_per_token,
        held_window=held_window,
    )
