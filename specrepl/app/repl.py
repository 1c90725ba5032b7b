"""The read-eval-print loop: read a line, run a command or answer a prompt, draw it.

Thin on purpose: lines come from a `LineReader` (prompt_toolkit on a terminal,
plain lines from a pipe), commands go to the registry, prompts to the
`ChatSession`, and everything that is shown goes through the `Renderer`.
Ctrl-C at the prompt clears the line; Ctrl-C while generating or drawing
returns to the prompt (and says whether the session changed), also when a
second Ctrl-C lands while the first one is being reported. Ctrl-D or `/quit`
ends the loop; any other error is shown and the loop goes on. While the loop
runs, SIGTERM unwinds it like an exception, so that the terminal is restored
(echo, raw mode, live panels) before the process exits with status 143.

This module does not print, does not parse command arguments and knows
nothing about models or how tokens are generated.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.input import Input
from prompt_toolkit.output import Output

from specrepl.app.commands.registry import REGISTRY, CommandRegistry
from specrepl.app.commands.results import Quit
from specrepl.app.render.repl import Renderer, loading_line, settings_line
from specrepl.app.startup import LoadingSession, StartupFailed
from specrepl.engine.signals import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
    Terminated,
    signals_unwind,
)
from specrepl.store.paths import history_file

if TYPE_CHECKING:
    from specrepl.chat.session import ChatSession

__all__ = [
    "PROMPT",
    "LineReader",
    "PipeReader",
    "RegistryCompleter",
    "TerminalReader",
    "handle_line",
    "make_reader",
    "run",
]

PROMPT = "› "


class LineReader(Protocol):
    """Where lines come from. `read` raises EOFError at the end and
    KeyboardInterrupt when Ctrl-C is pressed at the prompt; `busy` wraps the
    time spent answering."""

    interactive: bool

    def read(self) -> str: ...

    def busy(self) -> AbstractContextManager[None]: ...

    def wake(self) -> None:
        """Called from the loading thread when the models' state changed."""
        ...


@contextlib.contextmanager
def _no_echo(stream: TextIO) -> Iterator[None]:
    """Stop the terminal from echoing keys (and `^C`) while output is being redrawn.

    An echoed `^C` or typed-ahead text moves the cursor under rich's live
    panel, which then redraws one line off. Keys typed meanwhile are still
    read by the next prompt. Does nothing when `stream` is not a terminal.
    """
    try:
        import termios
    except ImportError:  # not a POSIX terminal
        yield
        return
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd)
    except (termios.error, OSError, ValueError, io.UnsupportedOperation):
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ECHOCTL)
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


class RegistryCompleter(Completer):
    """Completes command names and their fixed arguments, from the registry."""

    def __init__(self, registry: CommandRegistry) -> None:
        self.registry = registry

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterator[Completion]:
        word, options = self.registry.completions(document.text_before_cursor)
        for option in options:
            yield Completion(option, start_position=-len(word))


def _history(path: Path | None) -> History:
    """A history file readable by its owner only; in memory if it cannot be made."""
    if path is None:
        return InMemoryHistory()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.touch(mode=0o600, exist_ok=True)
        if path.stat().st_mode & 0o077:  # made by something else, or before this rule
            path.chmod(0o600)
    except OSError:
        return InMemoryHistory()
    return FileHistory(str(path))


class TerminalReader:
    """prompt_toolkit input: history, auto-suggest, completion, a settings toolbar."""

    interactive = True

    def __init__(
        self,
        session: ChatSession | LoadingSession,
        registry: CommandRegistry = REGISTRY,
        *,
        history_path: Path | None = None,
        input: Input | None = None,
        output: Output | None = None,
        stdin: TextIO | None = None,
    ) -> None:
        self.stdin = stdin or sys.stdin
        self.session = session
        self.prompt_session: PromptSession[str] = PromptSession(
            history=_history(history_path),
            auto_suggest=AutoSuggestFromHistory(),
            completer=RegistryCompleter(registry),
            complete_while_typing=True,
            bottom_toolbar=self._toolbar,
            input=input,
            output=output,
        )

    def _toolbar(self) -> str:
        session = self.session
        if isinstance(session, LoadingSession) and not session.finished:
            return loading_line(session.stage) + settings_line(session.settings)
        return settings_line(session.settings)

    def read(self) -> str:
        return self.prompt_session.prompt(PROMPT, pre_run=self._soon_leave_if_failed)

    def busy(self) -> AbstractContextManager[None]:
        return _no_echo(self.stdin)

    def wake(self) -> None:
        """Redraw the toolbar, or leave the prompt if the models failed to load
        (`read` raises StartupFailed). Safe to call from any thread."""
        session = self.session
        if isinstance(session, LoadingSession) and session.failure is not None:
            self._soon_leave_if_failed()
        else:
            self.prompt_session.app.invalidate()

    def _soon_leave_if_failed(self) -> None:
        """On the prompt's event loop: end the prompt with StartupFailed if the models
        failed. Called when a prompt starts and by `wake`, so a failure is never missed."""
        app = self.prompt_session.app
        loop = app.loop
        if app.is_running and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._leave_if_failed)

    def _leave_if_failed(self) -> None:
        app, session = self.prompt_session.app, self.session
        failure = session.failure if isinstance(session, LoadingSession) else None
        if failure is not None and app.is_running and app.future and not app.future.done():
            app.exit(exception=StartupFailed(failure))


class PipeReader:
    """Plain lines from a stream that is not a terminal, echoed so the output reads
    like a transcript."""

    interactive = False

    def __init__(self, stream: TextIO, renderer: Renderer) -> None:
        self.stream = stream
        self.renderer = renderer

    def busy(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wake(self) -> None:
        pass  # nothing is drawn between lines

    def read(self) -> str:
        line = self.stream.readline()
        if not line:
            raise EOFError
        line = line.rstrip("\r\n")
        self.renderer.echo(PROMPT, line)
        return line


def make_reader(
    session: ChatSession | LoadingSession,
    renderer: Renderer,
    registry: CommandRegistry = REGISTRY,
    *,
    stdin: TextIO | None = None,
) -> LineReader:
    """prompt_toolkit on a terminal, plain lines otherwise."""
    stdin = stdin or sys.stdin
    if stdin.isatty():
        return TerminalReader(session, registry, history_path=history_file(), stdin=stdin)
    return PipeReader(stdin, renderer)


def handle_line(
    line: str, session: ChatSession, renderer: Renderer, registry: CommandRegistry = REGISTRY
) -> bool:
    """Run one command or answer one prompt; False when the session should end."""
    if registry.is_command(line):
        result = registry.dispatch(session, line)
        renderer.show(result)
        return not isinstance(result, Quit)
    prompt = line.lstrip()[1:] if line.lstrip().startswith("//") else line
    with renderer.stream() as on_event:
        answer = session.answer(prompt, on_event)
    renderer.answer(answer)
    return True


def _await_models(
    session: ChatSession | LoadingSession, renderer: Renderer, line: str, registry: CommandRegistry
) -> bool:
    """Before a line that needs the models, wait for them; False when Ctrl-C gave
    up the line (the models go on loading)."""
    if isinstance(session, LoadingSession) and not session.ready:
        if registry.needs_models(line) and not session.finished:
            try:
                renderer.wait_for_models(session)
            except KeyboardInterrupt:
                renderer.stopped_waiting()
                return False
        arrived = session.settle()  # raises StartupFailed if the models cannot be loaded
        if arrived is not None:
            renderer.models_arrived(arrived)
    return True


def _turn(
    session: ChatSession | LoadingSession,
    renderer: Renderer,
    reader: LineReader,
    registry: CommandRegistry,
) -> bool:
    """Read and handle one line; False at the end of the input or after `/quit`."""
    try:
        line = reader.read()
    except KeyboardInterrupt:
        return True
    except EOFError:
        return False
    history, settings = list(session.history), session.settings
    try:
        with reader.busy():
            if not _await_models(session, renderer, line, registry):
                return True
            return handle_line(line, session, renderer, registry)
    except KeyboardInterrupt:
        # e.g. while the summary was drawn: the answer may already be in the history
        renderer.interrupted(session.history != history or session.settings != settings)
    except StartupFailed:
        raise
    except Exception as error:  # the loop outlives any one failure
        renderer.error(f"{type(error).__name__}: {error}")
    return True


def run(
    session: ChatSession | LoadingSession,
    renderer: Renderer,
    reader: LineReader,
    registry: CommandRegistry = REGISTRY,
) -> int:
    """The loop; returns the exit status: 0, `EXIT_FAILED` when the models of a
    `LoadingSession` cannot be loaded, or `EXIT_TERMINATED` after SIGTERM.

    Ctrl-C during the welcome or the goodbye is left to the caller.
    """
    with signals_unwind():
        try:
            renderer.welcome(reader.interactive)
            if isinstance(session, LoadingSession):
                renderer.models_loading()
            while True:
                try:
                    if not _turn(session, renderer, reader, registry):
                        break
                except KeyboardInterrupt:
                    continue  # a second Ctrl-C while the first one was being reported
            renderer.goodbye()
        except StartupFailed as error:
            renderer.fatal(str(error))
            return EXIT_FAILED
        except Terminated:
            renderer.terminated()
            return EXIT_TERMINATED
    return EXIT_OK
