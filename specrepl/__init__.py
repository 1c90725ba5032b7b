"""specrepl: see, measure and use speculative decoding.

The public API keeps the names users of the original research code know:

    from specrepl import load_pair, speculative_generate, autoregressive_generate

The names are imported on first use, so that `import specrepl` (and the
launcher of `python infer.py`) does not wait for torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specrepl.chat.settings import Settings
    from specrepl.engine.drafters.base import Drafter
    from specrepl.engine.drafters.draft_head import DraftHead
    from specrepl.engine.drafters.head import HeadDrafter
    from specrepl.engine.drafters.head_store import load_head, resolve_head
    from specrepl.engine.drafters.model import ModelDrafter, is_copy_of
    from specrepl.engine.generation import (
        ContextTooLongError,
        GenerationInterrupted,
        autoregressive_generate,
        speculative_generate,
        stream_autoregressive,
        stream_speculative,
    )
    from specrepl.engine.processors import (
        GreedyProcessor,
        LogitsProcessor,
        MultinomialProcessor,
        NucleusProcessor,
        TopKNucleusProcessor,
        TopKProcessor,
        make_processor,
    )
    from specrepl.engine.prompt_cache import PromptCache
    from specrepl.engine.results import GenerationResult, StepEvent
    from specrepl.models.loading import load_pair
    from specrepl.models.pair import ModelPair

from specrepl.version import __version__ as __version__

_HOMES = {
    "engine.drafters.base": ("Drafter",),
    "engine.drafters.draft_head": ("DraftHead",),
    "engine.drafters.head": ("HeadDrafter",),
    "engine.drafters.head_store": ("load_head", "resolve_head"),
    "engine.drafters.model": ("ModelDrafter", "is_copy_of"),
    "engine.generation": (
        "ContextTooLongError",
        "GenerationInterrupted",
        "autoregressive_generate",
        "speculative_generate",
        "stream_autoregressive",
        "stream_speculative",
    ),
    "models.loading": ("load_pair",),
    "models.pair": ("ModelPair",),
    "engine.processors": (
        "GreedyProcessor",
        "LogitsProcessor",
        "MultinomialProcessor",
        "NucleusProcessor",
        "TopKNucleusProcessor",
        "TopKProcessor",
        "make_processor",
    ),
    "engine.prompt_cache": ("PromptCache",),
    "engine.results": ("GenerationResult", "StepEvent"),
    "chat.settings": ("Settings",),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "ContextTooLongError",
    "DraftHead",
    "Drafter",
    "GenerationInterrupted",
    "GenerationResult",
    "GreedyProcessor",
    "HeadDrafter",
    "LogitsProcessor",
    "ModelDrafter",
    "ModelPair",
    "MultinomialProcessor",
    "NucleusProcessor",
    "PromptCache",
    "Settings",
    "StepEvent",
    "TopKNucleusProcessor",
    "TopKProcessor",
    "autoregressive_generate",
    "is_copy_of",
    "load_head",
    "load_pair",
    "make_processor",
    "resolve_head",
    "speculative_generate",
    "stream_autoregressive",
    "stream_speculative",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'specrepl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
