"""The one error a model load raises, and how a cause is put in one line.

A `ModelLoadError` carries a message a user can act on (what went wrong and
what to do), so that no traceback is needed. This module knows nothing about
torch, transformers or where models come from.
"""

from __future__ import annotations

__all__ = ["ModelLoadError", "first_line"]


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do, no traceback needed."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
