"""What a slash command returns: one dataclass per kind of outcome.

A handler changes the session and returns one of these; the renderer draws
each by its type (`render.repl.Renderer.show`), so a new kind of outcome is a
new dataclass here, in the `CommandResult` union (registry.py) and a view
there. `/help`'s result, which lists the registry's commands, is declared with
them in registry.py.

Plain data: this module knows nothing about the terminal or the models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specrepl.chat.settings import Settings

if TYPE_CHECKING:
    from specrepl.chat.answers import Change
    from specrepl.engine.widths import WidthPlan
    from specrepl.models.pair import ModelPair

__all__ = [
    "SAMPLING_SETTINGS",
    "ClearScreen",
    "CommandFailed",
    "HistoryCleared",
    "Quit",
    "SettingsChanged",
    "ShowDraftSource",
    "ShowModels",
    "ShowSettings",
    "ShowWidths",
]

SAMPLING_SETTINGS = ("processor", "temperature", "top_k", "top_p")
"""The logits processor's settings: `/processor` shows them, and a change to one
is shown with the processor it makes."""


@dataclass(frozen=True)
class SettingsChanged:
    """Settings a command changed (or set to the value they had)."""

    changes: tuple[Change, ...]
    settings: Settings


@dataclass(frozen=True)
class ShowSettings:
    """Every setting, for `/config` (or a subset, for a bare query like `/system`)."""

    settings: Settings
    names: tuple[str, ...]
    kept: Mapping[str, int] | None = None
    """For `/config`: the tokens each generator's cache kept from the last turn."""


@dataclass(frozen=True)
class ShowModels:
    pair: ModelPair
    head: dict[str, Any] | None = None
    """The draft head in use, if any: its head.json plus "path"."""
    runtime: str | None = None
    """What runs the drafter model and why, once chosen (`ChatSession.runtime_summary`)."""
    target_runtime: str | None = None
    """What runs the target and why, once chosen (`ChatTarget.summary`)."""


@dataclass(frozen=True)
class ShowDraftSource:
    """What drafts behind a hybrid's prompt lookup, and why (`/draft_source`)."""

    verdict: str | None
    """The head or the model, with the timing that chose it; None when the
    settings ask for no choice (not a hybrid with head "auto")."""
    drafter: str
    """What the settings ask for: `hybrid, head auto` or `model, head none`."""
    hint: str
    """The command that makes a hybrid choose by timing."""


@dataclass(frozen=True)
class ShowWidths:
    """The forward-width plan of each model (`/widths`), by role."""

    plans: Mapping[str, WidthPlan | None]
    measured: bool
    """True when they were measured just now (`/widths retime`)."""
    device: str


@dataclass(frozen=True)
class HistoryCleared:
    turns: int


@dataclass(frozen=True)
class ClearScreen:
    pass


@dataclass(frozen=True)
class Quit:
    pass


@dataclass(frozen=True)
class CommandFailed:
    """The command changed nothing: `message` says why, `usage` gives the valid form."""

    message: str
    usage: str | None = None
