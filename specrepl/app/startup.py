"""Loading the model pair: in the foreground, or behind the REPL's prompt.

`open_session` loads the config's pair through the front door every entry
point uses (`chat.loading.load_config_pair`) and warms it up. `python infer.py` on
a terminal does not wait for it: it draws the prompt at once (torch and
transformers alone take seconds to import) and a `LoadingSession` runs
`open_session` in a background thread. Until the models are ready the REPL
works on the loading session's own settings: `/help`, `/gamma` and every
command that only changes a setting answer at once; a prompt, or a command
that needs the models, waits for them with the loading stage shown, and
Ctrl-C returns to the prompt. When the models arrive, the settings changed
meanwhile are applied to the real session through `ChatSession.update`, so
they are checked against the models exactly as if typed afterwards.

This module imports no model library when it is imported: `open_session`
imports them in the thread that calls it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specrepl.chat.answers import Change, Message
from specrepl.chat.loading import load_config_pair
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.signals import signals_held

if TYPE_CHECKING:
    from specrepl.chat.config import AppConfig
    from specrepl.chat.session import ChatSession

__all__ = [
    "LoadingSession",
    "ModelsArrived",
    "StartupFailed",
    "known_failure",
    "open_session",
]


class StartupFailed(Exception):
    """The models could not be loaded; the message says why."""


def open_session(
    config: AppConfig, progress: Callable[[str], None], *, retime_widths: bool = False
) -> ChatSession:
    """The config's pair, loaded and warmed up, in a session with the config's settings;
    `progress` is told each stage (`retime_widths`: time the forward widths again).

    Raises ModelLoadError, IncompatibleTokenizersError, HeadLoadError or SettingError.
    """
    # imported here, not at the top: this is what takes seconds, and on a terminal it
    # runs in the background while the prompt is already usable
    progress("importing torch and transformers…")
    with signals_held():  # a signal inside torch's initialisation would abort the process
        from specrepl.chat.session import ChatSession

    session = ChatSession(load_config_pair(config, progress), config.settings)
    progress("warming up…")
    session.warm_up(retime_widths=retime_widths, progress=progress)
    return session


def known_failure(error: BaseException) -> str | None:
    """The message of an error that says why the models cannot be used (a model
    that does not load, tokenizers that differ, a draft head for another target,
    a setting the models refuse); None for any other error."""
    from specrepl.engine.drafters.head_store import HeadLoadError
    from specrepl.models.compatibility import IncompatibleTokenizersError
    from specrepl.models.errors import ModelLoadError

    ours = (ModelLoadError, IncompatibleTokenizersError, HeadLoadError, SettingError)
    return str(error) if isinstance(error, ours) else None


@dataclass(frozen=True)
class ModelsArrived:
    """What `LoadingSession.settle` reports once, when the models have just arrived."""

    session: ChatSession
    seconds: float
    """From the start of loading to ready."""
    notices: tuple[str, ...]
    """Settings changed while loading that the models refused (each kept its old value)."""


class LoadingSession:
    """A chat session whose models load in a background thread.

    The REPL holds it in place of a `ChatSession`. Before the models arrive
    it has settings (changed by commands, checked as far as they can be
    without the models), an empty history and nothing to answer with; after
    `settle` has adopted the loaded session, every attribute is that
    session's. `settle` and everything else run on the REPL's thread; only
    `_load` runs on the loading thread, and it hands over through `_done`.
    """

    def __init__(
        self,
        config: AppConfig,
        *,
        retime_widths: bool = False,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._config = config
        self._retime_widths = retime_widths
        self._has_drafter = config.drafter is not None
        settings = config.settings
        self._initial = settings if self._has_drafter else settings.without_drafter_model()
        self._settings = self._initial
        self._on_change = on_change or (lambda: None)
        self._loaded: ChatSession | None = None
        self._done = threading.Event()
        self._started = 0.0
        self._seconds = 0.0
        self.session: ChatSession | None = None
        """The loaded session, once `settle` has adopted it."""
        self.stage = "starting"
        """The loading thread's latest progress message."""
        self.failure: str | None = None
        """Why the models could not be loaded, once the loading thread has failed."""

    # -- the loading thread ----------------------------------------------------

    def start(self) -> LoadingSession:
        self._started = time.monotonic()
        threading.Thread(target=self._load, name="specrepl-load", daemon=True).start()
        return self

    def set_on_change(self, on_change: Callable[[], None]) -> None:
        """Called from the loading thread at each stage and at the end (e.g. a redraw)."""
        self._on_change = on_change

    def _progress(self, message: str) -> None:
        self.stage = message
        self._on_change()

    def _load(self) -> None:
        try:
            self._loaded = open_session(
                self._config, self._progress, retime_widths=self._retime_widths
            )
        except BaseException as error:  # reported on the REPL's thread by `settle`
            self.failure = known_failure(error) or (
                f"loading the models failed: {type(error).__name__}: {error}"
            )
        finally:
            self._seconds = time.monotonic() - self._started
            self._done.set()
            self._on_change()

    # -- the REPL's thread -----------------------------------------------------

    @property
    def finished(self) -> bool:
        """The loading thread is done, well or not (`settle` says which)."""
        return self._done.is_set()

    @property
    def ready(self) -> bool:
        """The models are loaded and adopted: the session can answer."""
        return self.session is not None

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the loading thread; True when it is done.
        Ctrl-C interrupts the wait (the loading goes on)."""
        return self._done.wait(timeout)

    def settle(self) -> ModelsArrived | None:
        """Adopt the loaded session if the loading thread has finished: once, returning
        what arrived; None when still loading or already adopted.

        Raises StartupFailed when the models could not be loaded.
        """
        if self.session is not None or not self._done.is_set():
            return None
        if self.failure is not None:
            raise StartupFailed(self.failure)
        session = self._loaded
        assert session is not None
        changed = {
            name: getattr(self._settings, name)
            for name in Settings.names()
            if getattr(self._settings, name) != getattr(self._initial, name)
        }
        notices: list[str] = []
        try:
            session.update(**changed)
        except SettingError as error:  # keep what can be kept, one by one; say what cannot
            notices.append(f"the settings changed while loading were refused: {error}")
            for name, value in changed.items():
                try:
                    session.update(**{name: value})
                except SettingError as refusal:
                    notices.append(f"{name} = {value!r} was not kept: {refusal}")
        self.session = session
        return ModelsArrived(session, self._seconds, tuple(notices))

    # -- what commands and the toolbar use before the models arrive -------------

    @property
    def settings(self) -> Settings:
        return self.session.settings if self.session is not None else self._settings

    @property
    def history(self) -> list[Message]:
        return self.session.history if self.session is not None else []

    def update(self, **changes: Any) -> list[Change]:
        """As `ChatSession.update`; before the models arrive, the checks that need
        them (a draft head's target) are made when they arrive (see `settle`)."""
        if self.session is not None:
            return self.session.update(**changes)
        updated = self._settings.updated(**changes)
        updated.check_drafter_model(self._has_drafter)
        old, self._settings = self._settings, updated
        return [Change(name, getattr(old, name), getattr(updated, name)) for name in changes]

    def reset(self) -> int:
        """As `ChatSession.reset`: the number of messages cleared (none before the models)."""
        return self.session.reset() if self.session is not None else 0

    def kept_caches(self) -> dict[str, int]:
        return self.session.kept_caches() if self.session is not None else {}

    def __getattr__(self, name: str) -> Any:
        """Everything else is the loaded session's (its pair, `answer`, `/widths`...)."""
        session = self.__dict__.get("session")
        if session is None:
            raise AttributeError(f"{name!r} needs the models, which are still loading")
        return getattr(session, name)
