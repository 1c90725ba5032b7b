"""specrepl: see, measure and use speculative decoding.

The public API keeps the names users of the original research code know:

    from specrepl import load_pair, speculative_generate, autoregressive_generate
"""

from __future__ import annotations

from .draft_head import DraftHead, load_head, resolve_head
from .drafters import Drafter, HeadDrafter, ModelDrafter
from .generation import (
    ContextTooLongError,
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
    stream_autoregressive,
    stream_speculative,
)
from .models import ModelPair, load_pair
from .processors import (
    GreedyProcessor,
    LogitsProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
    make_processor,
)
from .results import GenerationResult, StepEvent
from .settings import Settings

__version__ = "0.1.0"

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
    "Settings",
    "StepEvent",
    "TopKNucleusProcessor",
    "TopKProcessor",
    "autoregressive_generate",
    "load_head",
    "load_pair",
    "make_processor",
    "resolve_head",
    "speculative_generate",
    "stream_autoregressive",
    "stream_speculative",
]
