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
binding. The drafter over it is `model.ModelDrafter`, as for torch;
`llamacpp_drafter` builds one. Whether llama.cpp runs the drafter at all,
and the default window, are decided by measurement in `runtime.py`; this
module knows nothing of that choice or of settings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specrepl.engine.drafters.draft_runtime import DraftRuntime, Importer
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.llamacpp import import_llamacpp

__all__ = ["LlamaCppDraftRuntime", "llamacpp_drafter"]


class LlamaCppDraftRuntime(DraftRuntime):
    """A `llama_cpp.Llama` holding the drafter model's GGUF file, fed token by token."""

    name = "llama.cpp"

    def __init__(self, llama: Any) -> None:
        self._llama_cpp = import_llamacpp()
        self.llama = llama
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
        self.llama.eval(tokens)  # removes every position from `n_tokens` on first

    def last_logits(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        row = np.ctypeslib.as_array(pointer, shape=(self.width,))
        return torch.from_numpy(row[:vocab_size].copy()).to(device)

    def cut(self, length: int) -> None:
        self.llama.n_tokens = min(self.llama.n_tokens, length)


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
