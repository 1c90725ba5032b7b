"""Long prompts read by llama.cpp with flash attention, for a target whose steps run without it.

A llama.cpp target keeps float32 keys and values without flash attention:
only there does a pass over k + 1 tokens give the logits of k + 1 one-token
passes closely enough for verification (docs/runtimes.md). Flash attention
reads a long stretch of new tokens faster on a CPU, which is what a long
prompt is. `WideReader` is a second context of the same loaded model, with
flash attention and float32 keys and values: a stretch is read there after
the target context's held positions are moved in, and the new positions'
keys and values are moved back, through llama.cpp's sequence-state calls
(the second sequence of each context holds what moves, as in
`drafters/llamacpp_state`). Flash attention keeps a position's values in one
row, the plain context one value dimension in a row, so values are
transposed on the way (`transposed_values`).

A read this way gives other rounding than a plain one, so whether a stretch
is read wide must not depend on which run reads it: the runtime reads wide
only a stretch whose logits are asked at its last position alone (a prompt,
the same tokens after the same held ones in the speculative run and in the
target alone), never a verification. `time_reading` measures whether it
pays on this machine.

This module knows nothing about drafting, acceptance or settings.
"""

from __future__ import annotations

import ctypes
import statistics
import struct
import time
from typing import Any

import numpy as np

__all__ = ["READ_WIDTH", "WideReader", "time_reading", "transposed_values"]

READ_WIDTH = 256
"""New tokens a read is timed over (`time_reading`), and the fewest read wide."""

_CELLS_AT = 12
"""Byte offset of the cell count in a sequence state (after magic, sequence, streams)."""
_CELL_RECORD = 12
"""Bytes of one cell's record in the state of one sequence: position, 1, sequence."""
_FLOAT32 = 0
"""ggml's type id of float32."""


def transposed_values(state: np.ndarray, *, to_transposed: bool) -> np.ndarray:
    """A copy of llama.cpp's state of one sequence (bytes, float32 keys and
    values) with each layer's values laid out the other way: one value
    dimension a row (`to_transposed`, a context without flash attention) or
    one position a row. ValueError for a state this cannot read."""
    data = bytes(state)
    (cells,) = struct.unpack_from("<I", data, _CELLS_AT)
    offset = 16 + _CELL_RECORD * cells
    transposed, layers = struct.unpack_from("<II", data, offset)
    if bool(transposed) == to_transposed:
        raise ValueError("the values are already laid out that way")
    out = np.frombuffer(data, dtype=np.uint8).copy()
    struct.pack_into("<I", out, offset, int(to_transposed))
    offset += 8
    for _ in range(layers):  # keys: type, bytes a row, the rows
        key_type, row = struct.unpack_from("<iQ", data, offset)
        if key_type != _FLOAT32:
            raise ValueError(f"keys of ggml type {key_type}, not float32")
        offset += 12 + row * cells
    for _ in range(layers):
        if transposed:  # type, bytes an element, dimensions; a row per dimension
            value_type, element, width = struct.unpack_from("<iII", data, offset)
        else:  # type, bytes a row; a row per position
            value_type, row = struct.unpack_from("<iQ", data, offset)
            element, width = 4, row // 4
        if value_type != _FLOAT32 or element != 4:
            raise ValueError(f"values of ggml type {value_type}, not float32")
        count = width * cells
        values = np.frombuffer(data, dtype=np.float32, count=count, offset=offset + 12)
        shape = (width, cells) if transposed else (cells, width)
        into = out[offset + 12 : offset + 12 + 4 * count].view(np.float32)
        into[:] = values.reshape(shape).T.reshape(-1)
        if to_transposed:
            struct.pack_into("<iII", out, offset, value_type, 4, width)
        else:
            struct.pack_into("<iQ", out, offset, value_type, 4 * width)
        offset += 12 + 4 * count
    if offset != len(data):
        raise ValueError(f"{len(data) - offset} bytes of the state left unread")
    return out


def _range_state(context: Any, start: int, count: int) -> np.ndarray:
    """The state of `context`'s positions start..count-1, as bytes."""
    buffer, size = context.range_state(start, count)
    return np.frombuffer(buffer, dtype=np.uint8, count=size)


def _set_state(llama_cpp: Any, ctx: Any, state: np.ndarray, sequence: int) -> None:
    pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
    read = llama_cpp.llama_state_seq_set_data(ctx, pointer, state.size, sequence)
    if read != state.size:
        raise RuntimeError(f"llama.cpp took {read} of {state.size} bytes of keys and values")


class WideReader:
    """A flash-attention context over a loaded model, reading stretches for
    another context of it (`target`: a `llamacpp_runtime._Context`, whose
    sequence 0 holds its positions and sequence 1 is scratch; `context` is
    one with flash attention)."""

    def __init__(self, llama_cpp: Any, context: Any) -> None:
        self._llama_cpp = llama_cpp
        self.context = context

    def read(self, target: Any, tokens: list[int], width: int) -> np.ndarray:
        """Read `tokens` after what `target` holds; returns the logits of the
        last of them (the first `width` entries) and leaves `target` holding
        them too. RuntimeError where llama.cpp refuses a move (`target` then
        holds what it held)."""
        llama_cpp, reader = self._llama_cpp, self.context
        start = len(target.held)
        reader.clear()
        try:
            if start:
                held = _range_state(target, 0, start)
                _set_state(llama_cpp, reader.ctx, transposed_values(held, to_transposed=False), 0)
                reader.held = list(target.held)
            batch = reader.batch_size
            for offset in range(0, len(tokens), batch):
                chunk = tokens[offset : offset + batch]
                last = len(chunk) - 1 if offset + batch >= len(tokens) else len(chunk)
                reader.decode(chunk, start + offset, last)
            pointer = llama_cpp.llama_get_logits_ith(reader.ctx, -1)
            logits = np.ctypeslib.as_array(pointer, shape=(width,)).copy()
            self._move_back(target, start, start + len(tokens))
        finally:
            reader.clear()
        target.held.extend(tokens)
        return logits

    def _move_back(self, target: Any, start: int, end: int) -> None:
        """The reader's positions start..end-1 into `target`'s sequence 0."""
        llama_cpp = self._llama_cpp
        new = transposed_values(_range_state(self.context, start, end), to_transposed=True)
        try:
            _set_state(llama_cpp, target.ctx, new, 1)
        except RuntimeError:
            llama_cpp.llama_memory_seq_rm(target.memory, 1, -1, -1)
            raise
        llama_cpp.llama_memory_seq_cp(target.memory, 1, 0, -1, -1)
        llama_cpp.llama_memory_seq_rm(target.memory, 1, -1, -1)


def time_reading(plain: Any, wide: Any, *, rounds: int = 2) -> tuple[float, float]:
    """Median seconds of one read plainly (`plain()`) and wide (`wide()`),
    alternated by round after one of each unmeasured: each callable reads the
    same stretch once and undoes it."""
    plain()
    wide()
    times: dict[str, list[float]] = {"plain": [], "wide": []}
    for _ in range(rounds):
        for name, read in (("plain", plain), ("wide", wide)):
            started = time.perf_counter()
            read()
            times[name].append(time.perf_counter() - started)
    return statistics.median(times["plain"]), statistics.median(times["wide"])
