"""The drafter model run by llama.cpp on its own GGUF file, where that is cheaper.

A drafter only pays when one of its tokens costs a small share of a target
step. The embedded pair's drafter is a copy of the target (SmolLM2-135M has no
smaller sibling), and on a CPU torch runs that copy in bfloat16 at about 0.55
to 0.67 of a float32 target step: too dear to go far past 1.3x. The same
weights ship as a 4-bit GGUF file, and llama.cpp's kernels for it (8-bit
activations against 4-bit blocks) decode a token several times faster than
torch does, while agreeing with the float32 target on most greedy tokens. So
a drafter model that was loaded from a GGUF file can draft in llama.cpp,
while the target verifies in torch as before: the output is still exactly the
target's (the drafts' laws q are llama.cpp's softmax, as for any drafter).

`choose_runtime` decides, for `runtime = "auto"`, by timing one decoding step
of each on this machine (never by a constant): llama.cpp when it is installed,
the drafter came from a GGUF file, runs on the CPU, and its step measured
cheaper than torch's. `LlamaCppDrafter` implements the `Drafter` protocol
over llama.cpp's own KV cache: the tokens it holds are the binding's record
of what it evaluated, so a rollback is a truncation and a chat's next turn
re-uses the common prefix.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from .drafter_options import DRAFTER_RUNTIMES, DrafterOptions
from .drafters import Draft, collect_draft, next_draft
from .llamacpp import LlamaCppUnavailable, import_llamacpp, open_gguf
from .processors import LogitsProcessor
from .widths import measure_widths

__all__ = [
    "MAX_CONTEXT",
    "LlamaCppDrafter",
    "RuntimeChoice",
    "choose_drafter_runtime",
    "choose_runtime",
    "llama_step_seconds",
]

MAX_CONTEXT = 16384
"""The most tokens llama.cpp's cache holds (its keys and values are allocated
up front); past that the llama.cpp drafter drafts nothing, as any drafter at
its context's end, and the target goes on alone."""


class LlamaCppDrafter:
    """Drafts with a `llama_cpp.Llama` holding the drafter model's GGUF file.

    Each `propose` brings llama.cpp's state to the sequence (keeping the
    prefix it already holds, feeding the rest in one batch), then drafts up to
    k tokens, feeding each but the last back. `update` truncates to the
    tokens verification kept. With `keep_between_prompts` a new generation
    keeps the prefix it shares with the last one (a chat); otherwise it
    starts empty. Several drafters may share one `Llama`: each reads the
    binding's own record of what it holds.
    """

    def __init__(
        self, llama: Any, *, keep_between_prompts: bool = False, name: str = "model"
    ) -> None:
        self._llama_cpp = import_llamacpp()
        self.llama = llama
        self.name = name
        self.width = int(llama.n_vocab())
        self.vocab_size = self.width
        # the binding records tokens in an array of the context asked for, which
        # llama.cpp itself may round up
        self.context = min(int(llama.n_ctx()), len(llama.input_ids))
        self.keep_between_prompts = keep_between_prompts
        self.uses_target_features = False

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.vocab_size = min(vocab_size, self.width)
        if not self.keep_between_prompts:
            self.forget()

    def forget(self) -> None:
        self.llama.n_tokens = 0  # the next evaluation drops every cached position

    def held(self) -> list[int]:
        """The tokens llama.cpp holds keys and values for."""
        return [int(t) for t in self.llama.input_ids[: self.llama.n_tokens]]

    def _read(self, ids: list[int]) -> None:
        """Hold exactly `ids`, with the logits after its last token."""
        held = np.asarray(self.llama.input_ids[: self.llama.n_tokens])
        shared = min(held.shape[0], len(ids) - 1)  # the last token is fed again: its logits
        differ = np.flatnonzero(held[:shared] != np.asarray(ids[:shared]))
        keep = int(differ[0]) if differ.size else shared
        self.llama.n_tokens = keep  # `eval` removes every position from here on
        self.llama.eval(ids[keep:])

    def _logits(self, device: torch.device) -> torch.Tensor:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        row = np.ctypeslib.as_array(pointer, shape=(self.width,))
        return torch.from_numpy(row[: self.vocab_size].copy()).to(device)

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        ids = sequence.tolist()
        # llama.cpp reads the sequence plus k - 1 of its own drafts
        k = min(k, self.context - len(ids) + 1)
        if k <= 0 or not ids:
            return Draft(sequence.new_empty(0), None)
        self._read(ids)
        tokens: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        for index in range(k):
            logits = self._logits(sequence.device)
            token = next_draft(logits, processor, generator, min_confidence, laws)
            if token is None:
                break
            tokens.append(token)
            if index + 1 < k:
                self.llama.eval([int(token)])
        return collect_draft(tokens, laws, sequence)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: Any = None,
    ) -> None:
        self.llama.n_tokens = min(self.llama.n_tokens, valid_length)


def llama_step_seconds(llama: Any, *, context: int = 48, repeats: int = 5, seed: int = 0) -> float:
    """Median seconds of one decoding step after `context` tokens in llama.cpp
    (as `widths.measure_widths` times torch: the first repeat warms up). The
    state is emptied afterwards."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, int(llama.n_vocab()), (context + 1,), generator=generator).tolist()
    llama.n_tokens = 0
    llama.eval(tokens[:context])
    times = []
    for repeat in range(repeats + 1):
        llama.n_tokens = context
        start = time.perf_counter()
        llama.eval(tokens[context:])
        if repeat:
            times.append(time.perf_counter() - start)
    llama.n_tokens = 0
    return statistics.median(times)


@dataclass(frozen=True)
class RuntimeChoice:
    """What runs the drafter model: llama.cpp (`llama` set) or torch, and why."""

    llama: Any | None
    reason: str
    seconds: dict[str, float] = field(default_factory=dict)
    """Measured seconds of one drafting step, by runtime ("torch", "llamacpp")."""

    @property
    def runtime(self) -> str:
        return "torch" if self.llama is None else "llamacpp"

    def describe(self) -> str:
        return f"{'llama.cpp' if self.llama is not None else 'torch'}: {self.reason}"

    def model_drafter(self, *, keep_between_prompts: bool = False) -> LlamaCppDrafter | None:
        """The drafter over llama.cpp to use in place of torch's (`build_drafter`'s
        `model_runtime`), or None when torch drafts."""
        if self.llama is None:
            return None
        return LlamaCppDrafter(self.llama, keep_between_prompts=keep_between_prompts)


def choose_runtime(
    requested: str,
    model: PreTrainedModel,
    gguf: Path | None,
    *,
    threads: int | None = None,
) -> RuntimeChoice:
    """Where the drafter `model` (loaded from the GGUF file `gguf`, or None)
    drafts: "torch"; "llamacpp" (raises LlamaCppUnavailable saying why it
    cannot); or "auto": llama.cpp when it can run here, the model is on the
    CPU, and one decoding step measured cheaper there than in torch (both
    timed now, ~0.5 s once), else torch, with the reason."""
    if requested not in DRAFTER_RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(DRAFTER_RUNTIMES)}, got {requested!r}")
    if requested == "torch":
        return RuntimeChoice(None, "asked for")
    context = min(
        int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or MAX_CONTEXT),
        MAX_CONTEXT,
    )
    threads = threads or torch.get_num_threads()
    if requested == "llamacpp":
        llama = open_gguf(gguf, context_length=context, threads=threads)
        return RuntimeChoice(llama, "asked for", {"llamacpp": llama_step_seconds(llama)})
    device = next(model.parameters()).device
    if device.type != "cpu":
        return RuntimeChoice(None, f"the drafter runs on {device.type}; llama.cpp here on the CPU")
    try:
        llama = open_gguf(gguf, context_length=context, threads=threads)
    except LlamaCppUnavailable as error:
        return RuntimeChoice(None, str(error))
    seconds = {"llamacpp": llama_step_seconds(llama), "torch": measure_widths(model, 1)[1]}
    ratio = seconds["llamacpp"] / seconds["torch"]
    if ratio < 1:
        return RuntimeChoice(llama, f"a step costs {ratio:.2f} of torch's, measured", seconds)
    return RuntimeChoice(None, f"llama.cpp's step measured {ratio:.2f}x torch's", seconds)


def choose_drafter_runtime(
    options: DrafterOptions, model: PreTrainedModel | None, gguf: Path | None
) -> RuntimeChoice | None:
    """What runs the drafter model for the drafter `options` describe (None
    when no model drafts): `choose_runtime` with `options.runtime`, except that
    a prompt window (`options.window`) is torch's alone (asking for llama.cpp
    with one raises LlamaCppUnavailable saying so)."""
    if not options.needs_model or model is None:
        return None
    if options.window:
        if options.runtime == "llamacpp":
            raise LlamaCppUnavailable(
                "it reads the whole prompt: set the drafter window to 0, or the runtime to torch"
            )
        return RuntimeChoice(None, "a prompt window is set, which only torch's drafter reads")
    return choose_runtime(options.runtime, model, gguf)
