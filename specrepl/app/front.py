"""The front door: from the command line to the loaded models, the same for every
entry point.

Every entry point (the REPL, `--prompt` and each subcommand) turns its flags
plus the config into the application config (`flags.app_config`) and loads its
models here, with their progress shown; a bad flag or config, models that
cannot be loaded and Ctrl-C each become one message and an exit status (2, 1,
130). `soak`, `replay` (measure/) and `distill` (train/) run below the
application: their `run(args, front)` gets a `Front`, which loads for them and
draws through its `view`, so that they neither print nor know the terminal.

Like cli.py, this module imports no model library when it is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import TYPE_CHECKING, Generic, TypeVar

from rich.console import Console

from specrepl.app.render.repl import Renderer
from specrepl.app.startup import known_failure, open_session
from specrepl.chat.config import AppConfig, ConfigError
from specrepl.chat.flags import app_config
from specrepl.chat.loading import load_config_pair
from specrepl.chat.settings import SettingError
from specrepl.engine.signals import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ctrl_c_insists

if TYPE_CHECKING:
    from specrepl.chat.session import ChatSession
    from specrepl.models.pair import ModelPair

__all__ = ["REPORT_WIDTH", "Front", "report_console"]

REPORT_WIDTH = 160
"""Columns of what is printed on stdout when it goes to a file or a pipe (a
terminal's own width is used, and so is $COLUMNS): wide enough that no table of
`bench`, `soak`, `replay`, `--prompt` or a piped REPL is folded or cut."""


def report_console() -> Console:
    """stdout: as wide as the terminal, or `REPORT_WIDTH` into a file or pipe."""
    fits = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, width=None if fits else REPORT_WIDTH)


ViewT = TypeVar("ViewT", bound=Renderer)


class Front(Generic[ViewT]):
    """The command line's `args` on their way to loaded models, drawn by `view`."""

    def __init__(self, args: argparse.Namespace, view: ViewT) -> None:
        self.args = args
        self._view = view

    @property
    def view(self) -> ViewT:
        return self._view

    def config(self) -> AppConfig | int:
        """The config with the flags applied, or EXIT_USAGE after a message naming
        what was wrong."""
        try:
            return app_config(self.args)
        except (ConfigError, SettingError, ValueError) as error:
            self.view.fatal(str(error))
            return EXIT_USAGE

    def start(self) -> tuple[AppConfig, ChatSession] | int:
        """The config and a warmed-up session on its models, or the exit status after
        a message: a bad config or flag, models that cannot load, or Ctrl-C."""
        config = self.config()
        if isinstance(config, int):
            return config
        try:
            retime = bool(getattr(self.args, "retime_widths", False))
            with ctrl_c_insists(), self.view.loading("Loading models") as progress:
                return config, open_session(config, progress, retime_widths=retime)
        except KeyboardInterrupt:
            return self.stopped("Interrupted while loading the models.")
        except Exception as error:
            if (status := self._known_failure(error)) is None:
                raise
            return status

    def load_target(self) -> ModelPair | int:
        """The config's target alone (no drafter, not warmed up), or the exit status
        after a message: a bad config or flag, a target that cannot load. Ctrl-C
        is left to the caller."""
        config = self.config()
        if isinstance(config, int):
            return config
        try:
            with self.view.loading("Loading the target") as progress:
                return load_config_pair(config, progress, with_drafter=False)
        except Exception as error:
            if (status := self._known_failure(error)) is None:
                raise
            return status

    def _known_failure(self, error: Exception) -> int | None:
        """EXIT_FAILED after the message of a known reason why the models cannot be
        used (see `startup.known_failure`); None for any other error."""
        message = known_failure(error)
        if message is None:
            return None
        self.view.fatal(message)
        return EXIT_FAILED

    def stopped(self, message: str) -> int:
        """Report Ctrl-C and return 130; a second Ctrl-C only cuts the message short."""
        with contextlib.suppress(KeyboardInterrupt):
            self.view.fatal(message)
        return EXIT_INTERRUPTED
