"""The target's keys and values handed to llama.cpp, for a drafter that is a copy of the target.

A drafter in llama.cpp reads every token it has not seen before it drafts: a
pasted document costs it a prompt pass (compute-bound, about as dear as the
target's own), and a window on what it reads leaves it blind to the document.
When the drafter is a copy of the target (the embedded default: the target
de-quantized from the same GGUF file), the target has already computed those
keys and values. `KvImporter` writes them into llama.cpp's cache through its
sequence-state API (`llama_state_seq_set_data`), converted to llama.cpp's
layout and precision, as the torch copy does with `kv_cache.copy_positions`.
The drafter then reads only the last token, for its logits.

The byte layout of a sequence state is llama.cpp's own, not a public format,
so nothing here is assumed: `probe_importer` has the running library write
the state of a short random sequence, checks every field this module relies
on (header, cell records, layer count, key and value types and widths, value
transposition), finds how the target orders the dimensions of a key
(transformers' Llama rotates dimension i with i + d/2, llama.cpp's llama-type
models 2i with 2i + 1; both orders are tried against llama.cpp's own keys),
and checks that llama.cpp, given the target's keys and values, predicts what
it predicts after reading for itself. Any mismatch gives no importer, with
the reason, and the drafter reads as before. The output never depends on
this: the target verifies every draft.

llama.cpp's call replaces the whole sequence it writes, so a write of the
positions 0..n-1 costs in proportion to n, however few of them are new. Where
the context holds a second sequence in the same cache (`open_gguf(...,
sequences=2)`), `KvImporter.append` writes only the new positions there and
joins them to the drafter's sequence (`llama_memory_seq_cp`, which marks
cells, copying nothing): a short turn after 8,000 tokens costs a few
positions instead of 8,000. The probe checks that too, the same way.

This module knows nothing about drafting, gamma policies or rendering.
"""

from __future__ import annotations

import ctypes
import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.drafters.draft_runtime import learn_append_cost
from specrepl.engine.forward import model_device
from specrepl.engine.kv_cache import cached_length, new_cache
from specrepl.engine.llamacpp import import_llamacpp, sequences

__all__ = ["KvImporter", "StateLayout", "cosine", "last_logits", "probe_importer"]

_MAGIC = 0xAF143CD8
"""The first four bytes of a llama.cpp sequence state (`io_magic` in llama-context.cpp)."""

_TYPES = {0: (np.float32, torch.float32), 1: (np.float16, torch.float16)}
"""ggml type ids this module can write: GGML_TYPE_F32 and GGML_TYPE_F16."""

PROBE_TOKENS = 16
MIN_AGREEMENT = 0.99
"""Least cosine similarity between llama.cpp's own keys (and values, and
next-token logits) and those taken from the target, on the probe."""


@dataclass(frozen=True)
class StateLayout:
    """What a sequence state of this llama.cpp holds, as read from one it wrote."""

    layers: int
    width: int
    """Keys (and values) per position and layer: kv heads x head size."""
    key_type: int
    value_type: int
    values_transposed: bool
    heads: int
    interleaved: bool
    """Keys pair dimensions 2i and 2i + 1 where the target pairs i and i + d/2."""


class LayoutError(ValueError):
    """A sequence state this module cannot read or write."""


class _StateReader:
    """Reads a sequence state front to back; LayoutError where it ends early."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def read(self, fmt: str) -> tuple[Any, ...]:
        """The next `struct` fields of format `fmt`."""
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise LayoutError("the state ends early")
        values = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return values

    def block(self, type_id: int, width: int, rows: int) -> np.ndarray:
        """The next `width` x `rows` elements of ggml type `type_id`, as float32 (flat)."""
        if type_id not in _TYPES:
            raise LayoutError(f"keys or values of ggml type {type_id} (only f32 and f16 are known)")
        dtype = _TYPES[type_id][0]
        count = width * rows
        if self.offset + count * np.dtype(dtype).itemsize > len(self.data):
            raise LayoutError("the state ends early")
        array = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.offset)
        self.offset += count * np.dtype(dtype).itemsize
        return array.astype(np.float32)

    def finish(self) -> None:
        if self.offset != len(self.data):
            raise LayoutError(f"{len(self.data) - self.offset} bytes left unread")


def _read_header(reader: _StateReader) -> tuple[int, bool, int]:
    """The header and cell records of one stream holding seq 0 only: returns
    the number of cells, whether values are transposed, and the layer count."""
    magic, seq, streams, cells = reader.read("<IiII")
    if magic != _MAGIC or seq != 0 or streams != 1 or cells == 0:
        raise LayoutError(
            f"unexpected header (magic {magic:#x}, seq {seq}, streams {streams}, cells {cells})"
        )
    for position in range(cells):
        pos, count, owner = reader.read("<iIi")
        if (pos, count, owner) != (position, 1, 0):
            raise LayoutError(f"unexpected cell record {(pos, count, owner)} at {position}")
    transposed, layers = reader.read("<II")
    return cells, bool(transposed), layers


def _read_keys(reader: _StateReader, cells: int) -> tuple[np.ndarray, int, int]:
    """One layer's keys (cells, width), their ggml type and width."""
    key_type, row = reader.read("<iQ")
    if key_type not in _TYPES or row % np.dtype(_TYPES[key_type][0]).itemsize:
        raise LayoutError(f"keys of ggml type {key_type}, {row} bytes a row")
    width = row // np.dtype(_TYPES[key_type][0]).itemsize
    return reader.block(key_type, width, cells).reshape(cells, width), key_type, width


def _read_values(reader: _StateReader, cells: int, transposed: bool) -> tuple[np.ndarray, int, int]:
    """One layer's values (cells, width), their ggml type and width."""
    if transposed:
        value_type, element, width = reader.read("<iII")
        if value_type not in _TYPES or element != np.dtype(_TYPES[value_type][0]).itemsize:
            raise LayoutError(f"values of ggml type {value_type}, {element} bytes an element")
        return reader.block(value_type, width, cells).reshape(width, cells).T, value_type, width
    value_type, row = reader.read("<iQ")
    if value_type not in _TYPES:
        raise LayoutError(f"values of ggml type {value_type}")
    width = row // np.dtype(_TYPES[value_type][0]).itemsize
    return reader.block(value_type, width, cells).reshape(cells, width), value_type, width


def _parse(data: bytes) -> tuple[StateLayout, np.ndarray, np.ndarray]:
    """The layout of one sequence state (one stream, seq 0, no cell extras)
    and its keys and values as float32 arrays (layers, cells, width); raises
    LayoutError for anything else."""
    reader = _StateReader(data)
    cells, transposed, layers = _read_header(reader)
    keys = [_read_keys(reader, cells) for _ in range(layers)]
    values = [_read_values(reader, cells, transposed) for _ in range(layers)]
    reader.finish()
    key_types = {key_type for _, key_type, _ in keys}
    value_types = {value_type for _, value_type, _ in values}
    widths = {width for _, _, width in keys + values}
    if len(key_types) != 1 or len(value_types) != 1 or len(widths) != 1:
        raise LayoutError("layers differ in type or width")
    layout = StateLayout(
        layers=layers,
        width=widths.pop(),
        key_type=key_types.pop(),
        value_type=value_types.pop(),
        values_transposed=transposed,
        heads=0,
        interleaved=False,
    )
    return layout, np.stack([array for array, _, _ in keys]), np.stack([a for a, _, _ in values])


def _export(llama: Any) -> bytes:
    """The sequence state llama.cpp holds for seq 0."""
    library = import_llamacpp()
    size = library.llama_state_seq_get_size(llama.ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    written = library.llama_state_seq_get_data(llama.ctx, buffer, size, 0)
    return bytes(buffer)[:written]


def last_logits(llama: Any) -> np.ndarray:
    """The logits llama.cpp holds for `llama`'s last position, as float32."""
    library = import_llamacpp()
    pointer = library.llama_get_logits_ith(llama.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(int(llama.n_vocab()),)).astype(np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float((a * b).sum()) / norm if norm else 0.0


def _stacked(cache: DynamicCache, count: int, part: str) -> torch.Tensor:
    """Keys or values of the first `count` positions, every layer: (layers, heads, count, d)."""
    tensors = [getattr(layer, part)[0, :, :count] for layer in cache.layers]
    return torch.stack(tensors).detach().to("cpu", torch.float32)


def _llama_keys(keys: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """(layers, heads, n, d) target keys -> (layers, n, heads * d) in llama.cpp's order."""
    layers, heads, n, d = keys.shape
    if interleaved:  # target dimension h * d/2 + i is llama.cpp's 2i + h
        keys = keys.reshape(layers, heads, n, 2, d // 2).transpose(-1, -2).reshape(keys.shape)
    return keys.permute(0, 2, 1, 3).reshape(layers, n, heads * d)


class KvImporter:
    """Writes a transformers cache's positions into llama.cpp's seq 0.

    `write` replaces the whole sequence with positions 0..count-1 (llama.cpp's
    sequence-state read replaces what it writes to), so its cost grows with
    the context; `append` (where `appends`: a scratch sequence in the same
    cache, checked by the probe) writes only positions start..count-1 and
    keeps the rest. Both are timed at every call (`seconds_per_position`, and
    `append_seconds` for an append's cost beyond its positions), so the
    drafter can weigh them against reading the unseen tokens itself."""

    windows = False  # positions are written where the target holds them, from the first
    fewest_positions = 3  # one or two cost a call more than a read in the drafting pass

    def __init__(
        self,
        llama: Any,
        layout: StateLayout,
        seconds_per_position: float,
        *,
        appends: bool = False,
        append_seconds: float = 0.0,
    ) -> None:
        self.llama = llama
        self.layout = layout
        self.seconds_per_position = seconds_per_position
        self.appends = appends
        self.append_seconds = append_seconds

    def available(self, cache: DynamicCache) -> int:
        """Positions the target's cache holds."""
        return cached_length(cache)

    def estimate(self, count: int) -> float:
        """Seconds a write of `count` positions is expected to take."""
        return count * self.seconds_per_position

    def estimate_append(self, positions: int) -> float:
        """Seconds an append of `positions` new positions is expected to take."""
        return self.append_seconds + positions * self.seconds_per_position

    def write(self, cache: DynamicCache, count: int, tokens: list[int]) -> float:
        """Make llama.cpp hold `tokens` (the first `count` of the sequence) with
        the keys and values `cache` holds for them; returns the seconds taken.
        Raises RuntimeError when llama.cpp refuses the state (its cache is
        then empty)."""
        self._check(cache, 0, count, tokens)
        started = time.perf_counter()
        self._set(cache, 0, count, 0)
        self.llama.input_ids[:count] = tokens[:count]
        self.llama.n_tokens = count
        seconds = time.perf_counter() - started
        self.seconds_per_position = 0.7 * self.seconds_per_position + 0.3 * seconds / count
        return seconds

    def append(self, cache: DynamicCache, start: int, count: int, tokens: list[int]) -> float:
        """Make llama.cpp hold `tokens[:count]`, keeping what it holds for the
        first `start` (which must be `tokens[:start]`) and taking positions
        start..count-1 from `cache`; returns the seconds taken. Raises
        RuntimeError when llama.cpp refuses the state (it then holds the first
        `start` tokens)."""
        if not self.appends:
            raise RuntimeError("this llama.cpp context has no scratch sequence")
        self._check(cache, start, count, tokens)
        if start == 0:
            return self.write(cache, count, tokens)
        started = time.perf_counter()
        library = import_llamacpp()
        memory = library.llama_get_memory(self.llama.ctx)
        library.llama_memory_seq_rm(memory, 0, start, -1)
        self.llama.n_tokens = start
        try:
            self._set(cache, start, count, 1)
        except RuntimeError:
            library.llama_memory_seq_rm(memory, 1, -1, -1)
            raise
        library.llama_memory_seq_cp(memory, 1, 0, -1, -1)  # marks the cells seq 0's too
        library.llama_memory_seq_rm(memory, 1, -1, -1)
        self.llama.input_ids[start:count] = tokens[start:count]
        self.llama.n_tokens = count
        seconds = time.perf_counter() - started
        learn_append_cost(self, count - start, seconds, long_stretch=PROBE_TOKENS)
        return seconds

    def _check(self, cache: DynamicCache, start: int, count: int, tokens: list[int]) -> None:
        if not 0 <= start < count or cached_length(cache) < count or len(tokens) < count:
            raise ValueError(
                f"cannot write positions {start}..{count - 1} from {cached_length(cache)} cached"
            )

    def _set(self, cache: DynamicCache, start: int, count: int, sequence: int) -> None:
        """Hand llama.cpp the state of positions start..count-1 for `sequence`
        (which it empties first); RuntimeError where it takes less than all."""
        state = self._state(cache, start, count)
        library = import_llamacpp()
        pointer = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
        read = library.llama_state_seq_set_data(self.llama.ctx, pointer, state.size, sequence)
        if read != state.size:
            if sequence == 0:
                self.llama.n_tokens = 0
            raise RuntimeError(f"llama.cpp took {read} of {state.size} bytes of keys and values")

    def _state(self, cache: DynamicCache, start: int, count: int) -> np.ndarray:
        """The sequence state of positions start..count-1, bytes laid out as
        `_parse` reads them; each layer's keys and values are converted in one
        strided copy straight into place."""
        layout = self.layout
        key_np, _ = _TYPES[layout.key_type]
        value_np, _ = _TYPES[layout.value_type]
        key_size, value_size = np.dtype(key_np).itemsize, np.dtype(value_np).itemsize
        n = count - start
        head = 16 + 12 * n + 8
        key_block = 12 + n * layout.width * key_size
        value_block = 12 + n * layout.width * value_size
        state = np.empty(head + layout.layers * (key_block + value_block), dtype=np.uint8)
        struct.pack_into("<IiII", state, 0, _MAGIC, 0, 1, n)
        cells = state[16 : 16 + 12 * n].view(np.int32).reshape(n, 3)
        cells[:, 0] = np.arange(start, count)
        cells[:, 1] = 1
        cells[:, 2] = 0
        struct.pack_into("<II", state, 16 + 12 * n, int(layout.values_transposed), layout.layers)
        offset = head
        for layer in cache.layers:
            keys = layer.keys[0, :, start:count].detach().to("cpu")  # (heads, n, d)
            heads, _, d = keys.shape
            if layout.interleaved:  # target dimension h * d/2 + i is llama.cpp's 2i + h
                keys = keys.reshape(heads, n, 2, d // 2).transpose(-1, -2)
            struct.pack_into("<iQ", state, offset, layout.key_type, layout.width * key_size)
            into = state[offset + 12 : offset + key_block].view(key_np)
            torch.from_numpy(into).view(n, heads, *keys.shape[2:]).copy_(keys.transpose(0, 1))
            offset += key_block
        for layer in cache.layers:
            values = layer.values[0, :, start:count].detach().to("cpu")  # (heads, n, d)
            heads, _, d = values.shape
            into = torch.from_numpy(state[offset + 12 : offset + value_block].view(value_np))
            if layout.values_transposed:  # one row per value dimension, across positions
                struct.pack_into("<iII", state, offset, layout.value_type, value_size, layout.width)
                into.view(heads, d, n).copy_(values.transpose(1, 2))
            else:
                struct.pack_into("<iQ", state, offset, layout.value_type, layout.width * value_size)
                into.view(n, heads, d).copy_(values.transpose(0, 1))
            offset += value_block
        return state


def _own_reading(
    llama: Any, tokens: list[int]
) -> tuple[np.ndarray, StateLayout, np.ndarray, np.ndarray]:
    """llama.cpp's own reading of `tokens`: its next-token logits, the layout
    of its sequence state and its keys and values (`_parse`); its cache is
    empty afterwards."""
    llama.n_tokens = 0
    llama.eval(tokens)
    own_logits = last_logits(llama)
    layout, own_keys, own_values = _parse(_export(llama))
    llama.n_tokens = 0
    return own_logits, layout, own_keys, own_values


def _target_cache(target: PreTrainedModel, tokens: list[int]) -> DynamicCache:
    """The target's cache after reading `tokens`."""
    device = model_device(target)
    cache = new_cache(target)
    with torch.no_grad():
        target(torch.tensor([tokens], device=device), past_key_values=cache, use_cache=True)
    return cache


def _matched_layout(
    layout: StateLayout,
    cache: DynamicCache,
    own_keys: np.ndarray,
    own_values: np.ndarray,
    heads: int,
) -> tuple[StateLayout | None, str]:
    """`layout` completed with the target's `heads` and the order of a key's
    dimensions under which the target's probe keys (in `cache`) agree with
    llama.cpp's own, or None with the reason when they do not agree."""
    if len(cache.layers) != layout.layers:
        return None, f"the target has {len(cache.layers)} layers, llama.cpp's model {layout.layers}"
    keys = _stacked(cache, PROBE_TOKENS, "keys")
    if keys.shape[1] * keys.shape[3] != layout.width:
        return None, "the target's keys and llama.cpp's differ in width"
    agreement = {
        interleaved: min(
            cosine(layer_keys.numpy(), own)
            for layer_keys, own in zip(_llama_keys(keys, interleaved), own_keys, strict=True)
        )
        for interleaved in (False, True)
    }
    interleaved = max(agreement, key=agreement.__getitem__)
    values = _stacked(cache, PROBE_TOKENS, "values")
    values = values.permute(0, 2, 1, 3).reshape(layout.layers, PROBE_TOKENS, layout.width)
    value_agreement = min(
        cosine(mine.numpy(), own) for mine, own in zip(values, own_values, strict=True)
    )
    if agreement[interleaved] < MIN_AGREEMENT or value_agreement < MIN_AGREEMENT:
        return None, (
            f"the target's keys and values are not llama.cpp's (cosine "
            f"{agreement[interleaved]:.3f} and {value_agreement:.3f}): not a copy"
        )
    return StateLayout(**{**layout.__dict__, "heads": heads, "interleaved": interleaved}), ""


def _timed_importer(
    llama: Any, layout: StateLayout, cache: DynamicCache, tokens: list[int]
) -> tuple[KvImporter, np.ndarray]:
    """An importer whose first write (all but the last probe token, timed) is
    followed by llama.cpp reading the last token: returns it and the logits."""
    importer = KvImporter(llama, layout, 0.0)
    seconds = importer.write(cache, PROBE_TOKENS - 1, tokens)
    importer.seconds_per_position = seconds / (PROBE_TOKENS - 1)
    llama.eval(tokens[-1:])
    return importer, last_logits(llama)


def _checked_appends(
    importer: KvImporter, cache: DynamicCache, tokens: list[int], own_logits: np.ndarray
) -> str:
    """Turn on `importer.appends` where the context has a scratch sequence and
    an append (the probe's first half written, the rest but the last token
    appended, timed) leaves llama.cpp predicting what it predicts after reading;
    returns how it writes, in words."""
    if sequences(importer.llama) < 2:
        return "the whole sequence at each write (one sequence in llama.cpp's cache)"
    half = PROBE_TOKENS // 2
    importer.write(cache, half, tokens)
    importer.appends = True
    try:
        seconds = importer.append(cache, half, PROBE_TOKENS - 1, tokens)
        importer.llama.eval(tokens[-1:])
        similarity = cosine(own_logits, last_logits(importer.llama))
    except RuntimeError as error:
        importer.appends = False
        return f"the whole sequence at each write (an append was refused: {error})"
    if similarity < MIN_AGREEMENT:
        importer.appends = False
        return f"the whole sequence at each write (an append predicted otherwise: {similarity:.3f})"
    written = PROBE_TOKENS - 1 - half
    importer.append_seconds = max(0.0, seconds - written * importer.seconds_per_position)
    return "new positions only"


def probe_importer(
    llama: Any, target: PreTrainedModel, *, seed: int = 0
) -> tuple[KvImporter | None, str]:
    """An importer for `llama` fed from `target`'s caches, or None, with the
    reason either way (see the module). Runs the target on `PROBE_TOKENS`
    random tokens and llama.cpp on the same (~0.1 s); llama.cpp's cache is
    empty afterwards."""
    library = import_llamacpp()
    if not hasattr(library, "llama_state_seq_set_data"):
        return None, "this llama-cpp-python has no sequence-state calls"
    config = target.config.get_text_config()
    heads = int(getattr(config, "num_key_value_heads", 0) or config.num_attention_heads)
    vocab = min(int(llama.n_vocab()), int(config.vocab_size))
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (PROBE_TOKENS,), generator=generator).tolist()
    try:
        own_logits, layout, own_keys, own_values = _own_reading(llama, tokens)
        cache = _target_cache(target, tokens)
        matched, reason = _matched_layout(layout, cache, own_keys, own_values, heads)
        if matched is None:
            return None, reason
        importer, taken_logits = _timed_importer(llama, matched, cache, tokens)
        similarity = cosine(own_logits, taken_logits)
        agrees = similarity >= MIN_AGREEMENT
        writes = _checked_appends(importer, cache, tokens, own_logits) if agrees else ""
    except LayoutError as error:
        return None, f"llama.cpp's sequence state is not one this version knows ({error})"
    except (RuntimeError, ValueError, OSError) as error:
        return None, f"llama.cpp refused the target's keys and values ({error})"
    finally:
        llama.n_tokens = 0
    if similarity < MIN_AGREEMENT:  # (random tokens: near ties make argmax a poor test)
        return None, f"llama.cpp predicts otherwise from the target's keys ({similarity:.3f})"
    return importer, (
        f"takes the target's keys and values (checked: cosine {similarity:.4f} on the probe), "
        f"{writes}"
    )
