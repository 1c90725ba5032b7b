"""Model specs: which model to load, in which dtype, quantized or not.

A `ModelSpec` names a model by its source and keeps the dtype and the
quantization as the names a user writes (`DTYPE_NAMES`, `QUANTIZE_NAMES`):
config files and flags build specs, and the loader (`loading.py`) resolves
them. This module imports neither torch nor transformers, so that reading a
config or parsing flags does not wait for them; it knows nothing about
loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specrepl.models.placing import (
    DeviceMap,
    MaxMemory,
    parse_device_map,
    parse_max_memory,
)

__all__ = ["DTYPE_NAMES", "QUANTIZE_NAMES", "ModelSpec"]

DTYPE_NAMES = ("auto", "float32", "fp32", "float16", "fp16", "bfloat16", "bf16")
QUANTIZE_NAMES = ("none", "8bit", "4bit")


@dataclass(frozen=True)
class ModelSpec:
    """One model to load: where from, in which dtype, quantized or not.

    `source` is "embedded", a path to a `.gguf` file, a local model directory
    or a Hugging Face hub id. `quantize` is None, "8bit" or "4bit" ("none" is
    accepted and stored as None).

    `device_map`, `max_memory` and `offload_folder` say where its parts may
    go (`placing.py`, in any form it reads; kept in its canonical form). None
    and (): the whole model on the pair's device. Memory caps or an offload
    folder without a device map mean the map `auto`.
    """

    source: str
    dtype: str = "auto"
    quantize: str | None = None
    device_map: DeviceMap | Any = None
    max_memory: MaxMemory | Any = ()
    offload_folder: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source must be a non-empty string, got {self.source!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        quantize = None if self.quantize == "none" else self.quantize
        if quantize not in (None, "8bit", "4bit"):
            raise ValueError(
                f"quantize must be one of {', '.join(QUANTIZE_NAMES)}, got {self.quantize!r}"
            )
        object.__setattr__(self, "source", self.source.strip())
        object.__setattr__(self, "quantize", quantize)
        device_map = parse_device_map(self.device_map)
        max_memory = parse_max_memory(self.max_memory or None)
        folder = self.offload_folder
        if folder is not None and (not isinstance(folder, str) or not folder.strip()):
            raise ValueError(f"offload_folder must be a non-empty path, got {folder!r}")
        if device_map is None and (max_memory or folder is not None):
            device_map = "auto"
        if device_map is not None and quantize is not None:
            raise ValueError(
                f"a device map with quantize {quantize} is not supported: quantize none to "
                "place a model's parts, or no device map to quantize it"
            )
        object.__setattr__(self, "device_map", device_map)
        object.__setattr__(self, "max_memory", max_memory)

    @property
    def placed(self) -> bool:
        """Whether transformers and accelerate place the model's parts (a device
        map was given), rather than loading it whole on the pair's device."""
        return self.device_map is not None
