"""Which device and dtype a model is loaded in, from the names a user gives.

"auto" picks what this machine has (cuda, then mps, then the CPU; bfloat16 on
CUDA, else float32); an explicit name must exist here, or a `ModelLoadError`
says what to use instead. This module knows nothing about loading a model.
"""

from __future__ import annotations

import torch

from specrepl.models.errors import ModelLoadError
from specrepl.models.specs import DTYPE_NAMES

__all__ = ["dtype_name", "resolve_device", "resolve_dtype"]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_device(name: str = "auto") -> torch.device:
    """The device to load on: "auto" picks cuda, then mps, then cpu.

    An explicit name ("cpu", "cuda", "cuda:1", "mps") must exist on this machine.
    """
    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    expected = "expected auto, cpu, cuda, cuda:N or mps"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ModelLoadError(f"unknown device {name!r}: {expected}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {name!r} asked for, but CUDA is not available here "
                f"(torch {torch.__version__}): use --device cpu or --device auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ModelLoadError(
                f"device {name!r} asked for, but this machine has {count} CUDA device(s): "
                f"use cuda:0 to cuda:{count - 1}"
            )
        return device
    if device.type == "mps":
        if not _mps_available():
            raise ModelLoadError(
                f"device {name!r} asked for, but MPS is not available here: use --device cpu"
            )
        return device
    raise ModelLoadError(f"unsupported device {name!r}: {expected}")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype for a name: "auto" is bfloat16 on CUDA (float16 without bf16), else float32."""
    key = name.strip().lower()
    if key == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if key not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPE_NAMES)}")
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as a user writes it: "float32", not "torch.float32"."""
    return str(dtype).removeprefix("torch.")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())
