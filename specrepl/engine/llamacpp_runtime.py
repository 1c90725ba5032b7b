"""A target run by llama.cpp: a GGUF file's weights loaded once, one context per runtime.

On a CPU llama.cpp runs a small model's one-token step several times faster
than an eager transformers forward of the same weights, so the fastest plain
run of a GGUF model, and the fastest verification, are llama.cpp's.
`LlamaCppModel` is a `runtime.RunnableModel`: it loads the file once
(`llamacpp.open_gguf`, after the crash trial) and opens `LlamaCppRuntime`s,
each with a context (its own keys and values) of its own, so that the
speculative run and the target-alone run of one chat keep separate caches as
they do in torch. A context whose runtime is gone goes back to a pool and is
cleared before it serves again.

Keys and values are kept in float32: with llama.cpp's default float16
cache a pass over several tokens gives logits measurably away from one-token
passes over the same text, enough to part a verification from the target's
own greedy text at a near-tie (docs/runtimes.md).
A pass feeds the tokens the context does not hold in batches of the
context's batch size, asks llama.cpp for the logits of only the last `keep`
positions (the verification's k + 1 rows, or the prompt's last), and copies
them out in one read; a rollback removes the positions past the kept length
from the context's one sequence. `time_widths` measures the seconds of a pass
by width after a short context, which the gamma policy reads as the target's
step costs. A prompt pass (new tokens whose logits are asked at the last
alone) of at least `reads_wide_from` tokens is read in a flash-attention
context and its keys and values moved back (`llamacpp_reading`), where
`time_reading` found that faster. Where a drafter reads the target's features (a draft head), a
pass also gives the hidden states it reads, through a `llamacpp_features`
tap: such a runtime moves to a context with a tap (reading what it held
again) the first time it is asked for them, so that the plain runtimes'
passes never call into Python.

This module knows nothing about drafting, acceptance or settings.
"""

from __future__ import annotations

import ctypes
import statistics
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specrepl.engine.llamacpp import import_llamacpp, open_gguf
from specrepl.engine.llamacpp_features import FeatureTap, feature_names, tap_problem
from specrepl.engine.llamacpp_reading import READ_WIDTH, WideReader, time_reading
from specrepl.engine.runtime import FeaturesUnavailable, ModelRuntime, RunnableModel

__all__ = ["LlamaCppModel", "LlamaCppRuntime"]

BATCH = 512
"""Tokens llama.cpp reads in one decode call (a longer prompt takes several)."""


class _Context:
    """A llama.cpp context with its batch and the tokens its sequence 0 holds
    (`flash`: with flash attention, for `llamacpp_reading.WideReader`)."""

    batch_size = BATCH

    def __init__(
        self, llama_cpp: Any, llama: Any, *, tapped: bool = False, flash: bool = False
    ) -> None:
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        self.tap: FeatureTap | None = None
        if tapped:  # the tap's callback in the copy of the parameters
            self.tap = FeatureTap(llama_cpp)
            params.cb_eval = self.tap.callback
        if flash:
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        self.owner = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        self.ctx = self.owner.ctx
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(BATCH, 0, 1)
        self.held: list[int] = []

    def decode(self, tokens: list[int], position: int, first_output: int) -> int:
        """Decode `tokens` at positions from `position`, with logits from the
        `first_output`-th token of the chunk on; returns how many were asked."""
        batch = self.batch
        outputs = 0
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = position + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = 0
            wanted = index >= first_output
            batch.logits[index] = 1 if wanted else 0
            outputs += wanted
        batch.n_tokens = len(tokens)
        status = self._llama_cpp.llama_decode(self.ctx, batch)
        if status != 0:
            self.remove_from(position)
            raise RuntimeError(f"llama.cpp could not decode {len(tokens)} tokens (status {status})")
        self.held.extend(tokens)
        return outputs

    def range_state(self, start: int, count: int) -> tuple[Any, int]:
        """llama.cpp's state of positions start..count-1 of sequence 0 (a
        buffer and its size): the positions are marked into the second
        sequence, whose state holds only them, which is emptied again."""
        llama_cpp, memory = self._llama_cpp, self.memory
        llama_cpp.llama_memory_seq_rm(memory, 1, -1, -1)
        llama_cpp.llama_memory_seq_cp(memory, 0, 1, start, count)
        try:
            size = llama_cpp.llama_state_seq_get_size(self.ctx, 1)
            buffer = (ctypes.c_uint8 * size)()
            written = llama_cpp.llama_state_seq_get_data(self.ctx, buffer, size, 1)
        finally:
            llama_cpp.llama_memory_seq_rm(memory, 1, -1, -1)
        if written != size:
            raise RuntimeError(f"llama.cpp wrote {written} of {size} bytes of the state")
        return buffer, size

    def clear(self) -> None:
        """Forget every position. The buffers are not zeroed (that writes the
        whole cache, tens of milliseconds at a long context): a cell no
        sequence holds is masked out of every pass, and what it keeps was
        computed by a pass or moved from one, so it is finite."""
        self._llama_cpp.llama_memory_clear(self.memory, False)
        self.held = []

    def remove_from(self, length: int) -> None:
        if length < len(self.held):
            self._llama_cpp.llama_memory_seq_rm(self.memory, 0, length, -1)
            del self.held[length:]

    def close(self) -> None:
        self._llama_cpp.llama_batch_free(self.batch)
        self.owner.close()


class LlamaCppModel(RunnableModel):
    """The GGUF file at `path` in llama.cpp, as a target (see the module docstring).

    `context_length` is the positions each runtime's context holds; `threads`
    the threads of every pass (default: every CPU). Raises
    `llamacpp.LlamaCppUnavailable` saying why it cannot run here.
    """

    runtime_name = "llama.cpp"

    def __init__(
        self,
        path: Path | None,
        *,
        context_length: int,
        threads: int | None = None,
        name: str | None = None,
    ) -> None:
        self._llama_cpp = import_llamacpp()
        self.llama = open_gguf(
            path,
            context_length=context_length,
            threads=threads,
            n_batch=BATCH,
            n_ubatch=BATCH,
            type_k=self._llama_cpp.GGML_TYPE_F32,
            type_v=self._llama_cpp.GGML_TYPE_F32,
            sequences=2,
        )
        assert path is not None  # open_gguf refuses no file
        self.path = path
        self.name = name or path.name
        self.device = torch.device("cpu")
        self.width = int(self.llama.n_vocab())
        self.context = int(self.llama.n_ctx())
        self.layers = int(self._llama_cpp.llama_model_n_layer(self.llama._model.model))
        self.features_problem = tap_problem(self._llama_cpp)
        self.gives_features = self.features_problem is None
        self._free: dict[bool, list[_Context]] = {False: [], True: []}
        self._seconds: dict[int, float] | None = None
        self.reads_wide_from: int | None = None
        """The fewest new tokens a prompt pass reads with flash attention
        (`time_reading`; None: never)."""
        self.reading: str | None = None
        """What `time_reading` measured, in words (None before)."""
        self._reader: WideReader | None = None

    def open(self, *, use_cache: bool = True) -> LlamaCppRuntime:
        return LlamaCppRuntime(self, keeps=use_cache)

    def take_context(
        self, owner: LlamaCppRuntime, *, tapped: bool = False
    ) -> tuple[_Context, weakref.finalize]:
        """A cleared context (with a feature tap where `tapped`), and what gives
        it back to the pool: called, or run when `owner` is gone."""
        pool = self._free[tapped]
        context = pool.pop() if pool else _Context(self._llama_cpp, self.llama, tapped=tapped)
        context.clear()
        return context, weakref.finalize(owner, pool.append, context)

    def runs(self, model: Any) -> bool:
        return model is self

    def step_seconds(self) -> Mapping[int, float] | None:
        """Seconds of a pass with k drafts (k + 1 tokens) by k, once timed."""
        return self._seconds

    def one_token_seconds(self) -> float | None:
        return None if self._seconds is None else self._seconds.get(0)

    def time_widths(
        self, max_width: int, *, context: int = 48, repeats: int = 3
    ) -> dict[int, float]:
        """Median seconds of a pass over 1..`max_width` tokens after `context`
        held ones, by drafts (width - 1); kept for `step_seconds`.

        The widths are timed in rounds, each width once a round: the policy
        reads the costs of widths against each other, and a machine whose
        speed wanders over seconds (other tenants of a shared host) would
        otherwise charge a slow moment to whichever widths it fell on."""
        runtime = self.open()
        ids = [int(i) % self.width for i in range(1000, 1000 + context + max_width)]
        sequence = torch.tensor(ids)
        runtime.score(sequence[:context], 1, self.width)
        timings: dict[int, list[float]] = {width: [] for width in range(1, max_width + 1)}
        for _ in range(repeats):
            for width, taken in timings.items():
                started = time.perf_counter()
                runtime.score(sequence[: context + width], width, self.width)
                taken.append(time.perf_counter() - started)
                runtime.rollback_to(context)
        seconds = {width - 1: statistics.median(taken) for width, taken in timings.items()}
        self._seconds = seconds
        return seconds

    def reads_wide(self, count: int) -> bool:
        """Whether a prompt pass over `count` new tokens is read with flash attention."""
        return self.reads_wide_from is not None and count >= self.reads_wide_from

    def take_reading(self, reads_wide_from: int | None, reading: str) -> None:
        """Read prompts as an earlier start measured (`time_reading`'s
        `reads_wide_from` and words). The flash-attention context is made now,
        at start-up: making a context takes up to a second, which would
        otherwise land in the first long prompt's answer."""
        self.reads_wide_from, self.reading = reads_wide_from, reading
        if reads_wide_from is not None:
            self._wide_reader()

    def _wide_reader(self) -> WideReader:
        if self._reader is None:
            flash = _Context(self._llama_cpp, self.llama, flash=True)
            self._reader = WideReader(self._llama_cpp, flash)
        return self._reader

    def read_wide(self, context: _Context, tokens: list[int], width: int) -> np.ndarray | None:
        """`tokens` read after what `context` holds, in the flash-attention
        context (`llamacpp_reading`); the last one's logits. None where
        llama.cpp refused a move (`context` holds what it held): from then on
        no prompt is read wide, and `reading` says why."""
        reader = self._wide_reader()
        try:
            return reader.read(context, tokens, width)
        except RuntimeError as error:
            self.reads_wide_from = None
            self.reading = f"reads every prompt plainly (a wide read failed: {error})"
            return None

    def time_reading(self, *, held: int = 64) -> str:
        """Time a prompt pass of `READ_WIDTH` tokens after `held` read plainly
        and with flash attention; the faster is used from then on for prompt
        passes at least that long (`reads_wide_from`). Returns, and keeps in
        `reading`, what was measured, in words."""
        self.reads_wide_from, self.reading = None, None
        if held + READ_WIDTH > self.context:
            self.reading = f"reads every prompt plainly (a context of {self.context} is too short)"
            return self.reading
        runtime = self.open()
        ids = [int(i) % self.width for i in range(2000, 2000 + held + READ_WIDTH)]
        sequence = torch.tensor(ids)
        runtime.score(sequence[:held], 1, self.width)

        def read(wide: bool) -> None:
            self.reads_wide_from = READ_WIDTH if wide else None
            runtime.score(sequence, 1, self.width)
            runtime.rollback_to(held)
            if wide and self.reads_wide_from is None:  # refused, read plainly (`read_wide`)
                raise RuntimeError("a wide read was refused")

        try:
            plain, wide = time_reading(lambda: read(False), lambda: read(True))
        except (RuntimeError, ValueError) as error:
            self.reads_wide_from = None
            self.reading = self.reading or f"reads every prompt plainly (it could not: {error})"
            return self.reading
        faster = wide < plain
        self.reads_wide_from = READ_WIDTH if faster else None
        if not faster:  # its context's keys and values are not kept for nothing
            self._reader = None
        self.reading = (
            f"reads prompts of {READ_WIDTH}+ new tokens with flash attention"
            if faster
            else "reads prompts plainly"
        ) + f" ({READ_WIDTH} tokens: {wide:.2f} s with it, {plain:.2f} s without, measured)"
        return self.reading


class LlamaCppRuntime(ModelRuntime):
    """One llama.cpp context of a `LlamaCppModel` over a prefix of one sequence.

    `keeps=False` (no cache asked for) clears the context before every pass,
    so that each pass reads the whole sequence, as torch does without a cache."""

    name = "llama.cpp"

    def __init__(self, model: LlamaCppModel, *, keeps: bool = True) -> None:
        self._model = model
        self._context, self._give_back = model.take_context(self)
        self._keeps = keeps
        self._llama_cpp = model._llama_cpp

    @property
    def model(self) -> LlamaCppModel:
        return self._model

    @property
    def length(self) -> int:
        """Tokens held for the next pass (none where every pass reads all again)."""
        return len(self._context.held) if self._keeps else 0

    def held(self) -> list[int]:
        """The tokens whose keys and values the context holds."""
        return list(self._context.held)

    def rollback_to(self, length: int) -> None:
        self._context.remove_from(max(length, 0))

    def sequence_state(self, start: int, count: int) -> tuple[Any, int]:
        """llama.cpp's state of positions start..count-1 (a buffer and its
        size), for a copy of the model to take (`drafters.llamacpp_state`):
        the positions are marked into the context's second sequence, whose
        state holds only them."""
        if not 0 <= start < count <= self.length:
            raise ValueError(f"positions {start}..{count - 1} are not among {self.length} held")
        return self._context.range_state(start, count)

    def key_values(self) -> LlamaCppRuntime:
        """This runtime: a llama.cpp copy takes its keys and values through
        `sequence_state` (a torch drafter takes none from it)."""
        return self

    def step_seconds(self) -> Mapping[int, float] | None:
        return self._model.step_seconds()

    def score(
        self,
        sequence: torch.Tensor,
        keep: int,
        vocab_size: int,
        *,
        features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        names: tuple[bytes, ...] = ()
        if features:
            if self._model.features_problem is not None:
                raise FeaturesUnavailable(
                    f"llama.cpp gives no hidden states here: {self._model.features_problem}"
                )
            names = feature_names(feature_layers, self._model.layers)
        if not self._keeps:
            self._context.clear()
        if names and self._context.tap is None:
            self._take_tapped_context()
        ids = sequence.tolist()
        start = self.length
        fed = ids[start:]
        if not fed:
            raise RuntimeError(
                f"the context holds {start} tokens but the sequence has {len(ids)}: nothing to feed"
            )
        if keep > len(fed):
            raise ValueError(f"logits of {keep} positions asked for, but only {len(fed)} are fed")
        if start + len(fed) > self._model.context:
            raise ValueError(
                f"{start + len(fed)} positions do not fit the context of {self._model.context}"
            )
        if not names and keep == 1 and self._keeps and self._model.reads_wide(len(fed)):
            logits = self._model.read_wide(self._context, fed, vocab_size)
            if logits is not None:
                return torch.from_numpy(logits).unsqueeze(0), None
        if not names:
            return self._feed(fed, start, keep, vocab_size, every_output=False), None
        tap = self._context.tap
        assert tap is not None
        tap.begin(names)
        try:  # every position an output, so that the last layer keeps all its rows
            logits = self._feed(fed, start, keep, vocab_size, every_output=True)
        finally:
            tap.end()
        return logits, torch.from_numpy(tap.take(len(fed)))

    def _feed(
        self, fed: list[int], start: int, keep: int, vocab_size: int, *, every_output: bool
    ) -> torch.Tensor:
        """Decode `fed` from position `start` in batches; the logits of its last
        `keep` positions (`every_output`: llama.cpp computes every position's)."""
        rows: list[np.ndarray] = []
        first_kept = len(fed) - keep
        for offset in range(0, len(fed), BATCH):
            wanted = first_kept - offset
            outputs = self._context.decode(
                fed[offset : offset + BATCH], start + offset, 0 if every_output else wanted
            )
            skipped = max(wanted, 0) if every_output else 0
            if outputs > skipped:
                pointer = self._llama_cpp.llama_get_logits(self._context.ctx)
                block = np.ctypeslib.as_array(pointer, shape=(outputs, self._model.width))
                rows.append(block[skipped:, :vocab_size].copy())
        return torch.from_numpy(np.concatenate(rows) if len(rows) > 1 else rows[0])

    def _take_tapped_context(self) -> None:
        """Move to a context with a feature tap, reading what this one held again."""
        held = list(self._context.held)
        self._give_back()
        self._context, self._give_back = self._model.take_context(self, tapped=True)
        for offset in range(0, len(held), BATCH):
            self._context.decode(held[offset : offset + BATCH], offset, BATCH)
