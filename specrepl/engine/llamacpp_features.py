"""The hidden states of a llama.cpp pass, read while llama.cpp computes them.

llama.cpp's C API hands out a pass's logits (and, in its embedding mode, the
final normed states of the output positions), not what its decoder layers
output, which a draft head reads: the final hidden state and, for an EAGLE-3
head, the outputs of some earlier layers (`drafters/head.py`). Its scheduler
can call back on every tensor of the graph it computes (`cb_eval` in a
context's parameters): asked about a tensor by name, the callback says whether
it wants it; once a wanted tensor is computed it is called again and copies
the values out before the memory serves another tensor.

`FeatureTap` is that callback for one context. llama.cpp's graphs name decoder
layer i's output `l_out-<i>` (from 0) and the last layer's output after the
final norm, the input of the output layer, `result_norm`; `feature_names` maps
transformers' hidden-state indices to them (index i, 1 <= i < layers, is
`l_out-<i-1>`; the final state is `result_norm`). A pass that wants features
asks llama.cpp for the output of every position it feeds, so that the last
layer keeps all its rows.

A tap calls into Python for every tensor of every pass of its context, so
only contexts that serve a feature-reading drafter have one.

This module knows nothing of drafting, of the runtime's contexts or of torch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["FeatureTap", "FeaturesUnreadable", "feature_names", "tap_problem"]

FINAL = b"result_norm"

_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "ggml_get_name": (ctypes.c_char_p, [ctypes.c_void_p]),
    "ggml_nelements": (ctypes.c_int64, [ctypes.c_void_p]),
    "ggml_nrows": (ctypes.c_int64, [ctypes.c_void_p]),
    "ggml_nbytes": (ctypes.c_size_t, [ctypes.c_void_p]),
    "ggml_is_contiguous": (ctypes.c_bool, [ctypes.c_void_p]),
    "ggml_backend_tensor_get": (
        None,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
    ),
}


class FeaturesUnreadable(RuntimeError):
    """llama.cpp's pass did not give the hidden states asked for (why, in words)."""


def feature_names(feature_layers: Sequence[int], layers: int) -> tuple[bytes, ...]:
    """llama.cpp's names of the tensors that hold transformers' hidden states
    `feature_layers` (1 <= i < `layers`) and then the final one."""
    names = []
    for index in feature_layers:
        if not 1 <= int(index) < layers:
            raise ValueError(
                f"hidden state {index}: a model of {layers} layers gives 1 to {layers - 1}"
                " before its final one"
            )
        names.append(f"l_out-{int(index) - 1}".encode())
    return (*names, FINAL)


def _ggml_functions(llama_cpp: Any) -> dict[str, Any]:
    """ggml's functions the tap calls, found through llama.cpp's library (which
    loads ggml's); raises `FeaturesUnreadable` when one is missing."""
    library = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    callback_type = getattr(llama_cpp, "ggml_backend_sched_eval_callback", None)
    if library is None or callback_type is None:
        raise FeaturesUnreadable("this llama-cpp-python has no evaluation callback")
    functions = {}
    for name, (result, arguments) in _SIGNATURES.items():
        try:
            function = getattr(library, name)
        except AttributeError:
            raise FeaturesUnreadable(f"llama.cpp's library has no {name}") from None
        function.restype, function.argtypes = result, arguments
        functions[name] = function
    return functions


def tap_problem(llama_cpp: Any) -> str | None:
    """Why no tap can be made with this llama-cpp-python, or None."""
    try:
        _ggml_functions(llama_cpp)
    except FeaturesUnreadable as error:
        return str(error)
    return None


class FeatureTap:
    """The evaluation callback of one llama.cpp context (see the module docstring).

    `begin(names)` before a pass, `end()` after it, then `take(rows)`: the
    wanted tensors' rows of every decode call since `begin`, side by side in the order of
    `names`, as one float32 array (rows, width x len(names)). Between passes it
    wants nothing and answers at once."""

    def __init__(self, llama_cpp: Any) -> None:
        ggml = _ggml_functions(llama_cpp)
        self._name = ggml["ggml_get_name"]
        self._elements = ggml["ggml_nelements"]
        self._rows = ggml["ggml_nrows"]
        self._bytes = ggml["ggml_nbytes"]
        self._contiguous = ggml["ggml_is_contiguous"]
        self._read = ggml["ggml_backend_tensor_get"]
        self._names: tuple[bytes, ...] = ()
        self._wanted: frozenset[bytes] = frozenset()
        self._parts: dict[bytes, list[np.ndarray]] = {}
        self._error: str | None = None
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._called)

    def begin(self, names: Sequence[bytes]) -> None:
        self._names = tuple(names)
        self._wanted = frozenset(self._names)
        self._parts = {name: [] for name in self._names}
        self._error = None

    def end(self) -> None:
        self._wanted = frozenset()

    def take(self, rows: int) -> np.ndarray:
        """The rows read since `begin` (see the class docstring); raises
        `FeaturesUnreadable` where a tensor was missing, of another type, or
        of another number of rows than the `rows` fed."""
        if self._error is not None:
            raise FeaturesUnreadable(self._error)
        blocks = []
        for name in self._names:
            parts = self._parts.get(name) or []
            if not parts:
                raise FeaturesUnreadable(f"llama.cpp's pass computed no {name.decode()}")
            block = np.concatenate(parts) if len(parts) > 1 else parts[0]
            if block.shape[0] != rows:
                raise FeaturesUnreadable(
                    f"{name.decode()} had {block.shape[0]} rows for {rows} positions fed"
                )
            blocks.append(block)
        self._parts = {}
        return np.concatenate(blocks, axis=1) if len(blocks) > 1 else blocks[0]

    def _called(self, tensor: int, ask: bool, _user_data: int) -> bool:
        # Asked: whether this tensor is wanted. Told (ask false): it is computed;
        # False there would stop the pass, so every path returns True.
        if not self._wanted:
            return False
        name = b"?"
        try:
            name = self._name(tensor)
            if ask:
                return name in self._wanted
            if name in self._wanted:
                self._copy(tensor, name)
        except Exception as error:  # a callback must not raise into C
            self._error = f"reading {name!r}: {error}"
        return True

    def _copy(self, tensor: int, name: bytes) -> None:
        elements, rows = int(self._elements(tensor)), int(self._rows(tensor))
        if int(self._bytes(tensor)) != 4 * elements or not self._contiguous(tensor):
            self._error = f"{name.decode()} is not a contiguous float32 tensor"
            return
        values = np.empty(elements, dtype=np.float32)
        self._read(tensor, values.ctypes.data, 0, 4 * elements)
        self._parts[name].append(values.reshape(rows, elements // max(rows, 1)))
