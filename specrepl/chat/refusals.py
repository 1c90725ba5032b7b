"""What a chat session says when it cannot answer as asked: its refusals and notices, in words.

`ChatSession.answer` refuses a prompt too long for a model's context and
abandons an answer whose run fails (`RUN_FAILURES`: the context overflows
while generating, a model's logits are unusable, memory runs out); a chat
too long for its context drops its oldest turns with a notice. Each message
names the numbers the user needs and what to do. Plain strings from plain
values: this module knows nothing of models, settings or the session.
"""

from __future__ import annotations

import torch

from specrepl.engine.generation import ContextTooLongError
from specrepl.engine.processors import UnusableLogitsError

__all__ = [
    "OUT_OF_MEMORY",
    "RESET_HINT",
    "RUN_FAILURES",
    "history_dropped",
    "prompt_too_long",
    "run_failure",
]

OUT_OF_MEMORY = (torch.cuda.OutOfMemoryError, MemoryError)
"""Raised when a device runs out of memory (`torch.OutOfMemoryError` in recent
releases is the first; older ones only have it under `torch.cuda`)."""

RUN_FAILURES = (ContextTooLongError, UnusableLogitsError, *OUT_OF_MEMORY)
"""What abandons a whole answer (`run_failure` says which)."""

RESET_HINT = " Use /reset to clear the chat history."
"""Added to a refusal for length when the chat has a history to clear."""


def run_failure(generator: str, error: BaseException, hint: str) -> str:
    """Why the `generator` run that failed with one of `RUN_FAILURES` abandoned the answer."""
    if isinstance(error, ContextTooLongError):
        return f"The prompt is too long: {error}.{hint}"
    if isinstance(error, UnusableLogitsError):
        return (
            f"The {generator} run was abandoned: {error}. Nothing was added to the chat"
            " history; loading the models in float32 (--dtype, --drafter-dtype) may"
            " avoid it."
        )
    return (
        f"Out of memory during the {generator} run ({_summary(error)}): the run was"
        " abandoned and nothing was added to the chat history; try a shorter"
        " /length or /reset."
    )


def prompt_too_long(tokens: int, role: str, context: int, hint: str) -> str:
    """The refusal for a prompt of `tokens` tokens that leaves the `role` model no room."""
    return (
        f"The prompt is too long: it has {tokens} tokens and the {role} model's"
        f" context is {context} tokens (a prompt may have at most {context - 1}).{hint}"
    )


def history_dropped(room: int, context: int | None, dropped: int, tokens: int) -> str:
    """The notice for a chat that dropped its oldest `dropped` turns to leave
    `room` new tokens in the `context`, leaving a prompt of `tokens` tokens."""
    turns = f"turn{'s' if dropped != 1 else ''}"
    return (
        f"the chat no longer leaves room for {room} new tokens in the "
        f"{context}-token context: its oldest {dropped} {turns} were dropped to free a "
        f"quarter of it for the next turns ({tokens} prompt tokens now; /reset clears the rest)"
    )


def _summary(error: BaseException, limit: int = 160) -> str:
    """The first line of an error's message, cut to `limit` characters."""
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"
