"""What `soak` and `replay` get from the command line that runs them, and share.

Their `run(args, front)` is the whole command: it checks its own flags, asks
`front.start()` for the config and a warmed-up session (the application's front
door: flags plus config, the models loaded with their progress shown, a failure
already reported as an exit status), measures, draws through `front.view` and
writes its `--json` file. The application (app/front.py) gives the front and
its renderer, so measure/ neither prints nor knows the terminal.

`config_block` is the "config" object of every `--json` file but bench's: the
settings (one `Settings`) plus the command's own few fields.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from specrepl.engine.signals import EXIT_FAILED
from specrepl.store.atomic import write_text_atomically

if TYPE_CHECKING:
    from specrepl.chat.config import AppConfig
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings
    from specrepl.models.pair import ModelPair

__all__ = ["MeasureFront", "MeasureView", "config_block", "write_report"]


class MeasureView(Protocol):
    """What every measuring command draws (app's renderers have it)."""

    def fatal(self, message: str) -> None:
        """An error that ends the command."""
        ...

    def loaded(
        self, pair: ModelPair, head: dict[str, Any] | None = None, runtime: str | None = None
    ) -> None:
        """The loaded models, as start-up shows them."""
        ...

    def progress(self, what: str, total: int) -> AbstractContextManager[Callable[[int, int], None]]:
        """Progress while measuring: yields `advance(done, total)`."""
        ...


ViewT = TypeVar("ViewT", bound=MeasureView, covariant=True)


class MeasureFront(Protocol[ViewT]):
    """The command line's side of a measuring command (app/front.py's `Front`)."""

    @property
    def view(self) -> ViewT: ...

    def start(self) -> tuple[AppConfig, ChatSession] | int:
        """The config and a warmed-up session on its models, or the exit status
        after the message (a bad flag or config, models that cannot load, Ctrl-C)."""
        ...

    def stopped(self, message: str) -> int:
        """Say that Ctrl-C ended the command; the exit status to return (130)."""
        ...


def config_block(
    config: AppConfig, pair: ModelPair, settings: Settings, **extra: Any
) -> dict[str, Any]:
    """The "config" object of every `--json` file but bench's (which has its own
    options): the settings, the config file, the device, the models, how the
    drafter's vocabulary relates to the target's, and `extra`."""
    return {
        **settings.as_dict(),
        "config_file": None if config.path is None else str(config.path),
        "device": str(pair.device),
        "target": pair.target.to_dict(),
        "drafter": pair.drafter.to_dict() if pair.drafter else None,
        "tokenizers": None if pair.vocabulary is None else pair.vocabulary.as_json(),
        **extra,
    }


def write_report(view: MeasureView, path: str, text: str) -> int | None:
    """Write the `--json` file whole or not at all; None when written, else the
    exit status after the message."""
    try:
        write_text_atomically(Path(path), text)
    except OSError as error:
        view.fatal(f"--json: cannot write {path}: {error}")
        return EXIT_FAILED
    return None
