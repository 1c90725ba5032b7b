"""A float32 GGUF file written from a quantized one, so llama.cpp runs the exact weights torch runs.

transformers de-quantizes a GGUF file to float32 when it loads it, so a
target loaded from a 4-bit file is, in torch, the float32 model those 4-bit
blocks decode to. For llama.cpp to run that same model (the same greedy text,
and the fastest plain run of it on a CPU) it needs those float32 weights in
a GGUF file: `float32_gguf` writes one from the quantized file's own
tensors, every metadata field copied, once per file, under the cache root
(`<cache>/gguf-f32/`, keyed by the source file's fingerprint), written under a
temporary name and renamed into place. A file already in float32 or float16
(or bfloat16) is its own answer.

This module knows nothing about llama.cpp, decoding or the terminal.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

from specrepl.store.paths import fingerprint, float32_copies_dir

__all__ = ["FLOAT_TYPES", "float32_gguf", "is_float32_copy"]

FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
FORMAT = 1


def _float_file(reader: GGUFReader) -> bool:
    return all(tensor.tensor_type.name in FLOAT_TYPES for tensor in reader.tensors)


def is_float32_copy(path: Path) -> bool:
    """Whether `path` is a float32 file this module wrote."""
    return path.is_file() and path.name.endswith(f"-f32-v{FORMAT}.gguf")


def float32_gguf(path: Path, *, cache_dir: Path | None = None) -> Path:
    """A GGUF file with `path`'s metadata and its tensors de-quantized to
    float32 (`path` itself when its tensors are all float already)."""
    reader = GGUFReader(str(path))
    if _float_file(reader):
        return path
    folder = cache_dir or float32_copies_dir()
    out = folder / f"{path.stem}-{fingerprint(path)[:16]}-f32-v{FORMAT}.gguf"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=".partial-", suffix=".gguf", dir=folder)
    os.close(handle)
    try:
        _write_float32(reader, Path(partial))
        os.replace(partial, out)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return out


def _write_float32(reader: GGUFReader, out: Path) -> None:
    fields = reader.fields
    architecture = str(fields["general.architecture"].contents())
    writer = GGUFWriter(str(out), architecture)
    for name, field in fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes the header and the architecture itself
        if name == "general.file_type":
            writer.add_uint32(name, 0)  # all float32
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), kind)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
        writer.add_tensor(tensor.name, values, raw_dtype=GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
