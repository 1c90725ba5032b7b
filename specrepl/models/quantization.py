"""Quantized loading: bitsandbytes 8-bit and 4-bit weights, asked for by name.

`quantization_options` turns a spec's "8bit" or "4bit" into the options
`from_pretrained` takes (refused, saying what to install, without
bitsandbytes); `quantization_of` reads back what a loaded model holds. This
module knows nothing about where models come from.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.models.errors import ModelLoadError

__all__ = ["quantization_of", "quantization_options"]

# bitsandbytes logs a warning on import (CPU kernels) and on every 8-bit matmul.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def quantization_options(quantize: str | None, dtype: torch.dtype) -> dict[str, Any]:
    """The `from_pretrained` options that load weights quantized as `quantize`
    ("8bit", "4bit"; None: none), computing in `dtype`."""
    if quantize is None:
        return {}
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(
            f"{quantize} quantization needs bitsandbytes: pip install bitsandbytes"
        )
    from transformers import BitsAndBytesConfig

    if quantize == "8bit":
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}
    return {
        "quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
    }


def quantization_of(model: PreTrainedModel) -> str | None:
    """The quantization a loaded model holds: "8bit", "4bit" or None."""
    if getattr(model, "is_loaded_in_8bit", False):
        return "8bit"
    if getattr(model, "is_loaded_in_4bit", False):
        return "4bit"
    return None
