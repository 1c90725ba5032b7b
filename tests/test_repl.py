"""The REPL loop: a scripted prompt_toolkit session and a piped one, against tiny models."""

from __future__ import annotations

import io
import stat
from pathlib import Path
from typing import Any

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from specrepl.app.commands.registry import REGISTRY
from specrepl.app.render.repl import Renderer, settings_line
from specrepl.app.repl import (
    PipeReader,
    RegistryCompleter,
    TerminalReader,
    handle_line,
    make_reader,
    run,
)
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.models.pair import ModelPair
from specrepl.testing import interrupt_on_call


@pytest.fixture
def session(pair: ModelPair) -> ChatSession:
    return ChatSession(pair, Settings(max_new_tokens=12))


def recorded(**options: Any) -> tuple[Renderer, Console]:
    console = Console(file=io.StringIO(), width=100, record=True, **options)
    return Renderer(console), console


def test_scripted_terminal_session(session: ChatSession, tmp_path: Path) -> None:
    renderer, console = recorded()
    history = tmp_path / "state" / "history"
    with create_pipe_input() as pipe:
        reader = TerminalReader(session, history_path=history, input=pipe, output=DummyOutput())
        pipe.send_text("/gamma 3\r")
        pipe.send_text("w7 w8 w9\r")
        pipe.send_text("w30 this line is abandoned\x03")  # Ctrl-C at the prompt clears the line
        pipe.send_text("/processor topk 0.8 5\r")
        pipe.send_text("/gamma 99\r")
        pipe.send_text("/debug\r")
        pipe.send_text("w10 w11\r")
        pipe.send_text("\x04")  # Ctrl-D
        assert run(session, renderer, reader) == 0
    text = console.export_text()
    assert "gamma: 4 → 3" in text
    assert "sampling: topk(temperature=0.8, top_k=5)" in text
    assert "✗ gamma must be an integer >= 1 and <= 64, got 99" in text
    assert "usage: /gamma [N|fixed|heuristic|confidence|auto] [N]" in text
    assert "debug: off → on" in text
    assert text.count("model drafter · γ=3") == 2
    assert text.count("target only") == 2
    assert "baseline" in text
    assert "acceptance by draft position" in text  # debug after the second answer
    assert "abandoned" not in text
    assert text.rstrip().endswith("Goodbye.")
    assert session.settings.gamma == 3 and session.settings.debug
    assert [turn["content"] for turn in session.history[::2]] == ["w7 w8 w9", "w10 w11"]
    # the history file keeps what was entered, for the owner only
    saved = history.read_text()
    assert "/gamma 3" in saved and "w10 w11" in saved and "abandoned" not in saved
    assert stat.S_IMODE(history.stat().st_mode) == 0o600


def test_ctrl_c_while_generating_returns_to_the_prompt(
    session: ChatSession, pair: ModelPair
) -> None:
    renderer, console = recorded()
    with create_pipe_input() as pipe:
        reader = TerminalReader(session, input=pipe, output=DummyOutput())
        pipe.send_text("w7 w8 w9\r")
        pipe.send_text("/quit\r")
        with interrupt_on_call(pair.target.model, 3):
            assert run(session, renderer, reader) == 0
    text = console.export_text()
    assert "interrupted" in text
    assert "Interrupted: the partial answer is not added to the chat history." in text
    assert session.history == []
    assert "Goodbye." in text
    # the next prompt works as usual
    renderer, console = recorded()
    assert handle_line("w7 w8 w9", session, renderer)
    assert "interrupted" not in console.export_text()
    assert len(session.history) == 2


def test_piped_session_reads_plain_lines(session: ChatSession) -> None:
    renderer, console = recorded()
    stdin = io.StringIO("/gamma 3\nw7 w8 w9\n\n/length x\n/quit\nnever read\n")
    reader = make_reader(session, renderer, stdin=stdin)
    assert isinstance(reader, PipeReader)
    assert run(session, renderer, reader) == 0
    text = console.export_text()
    assert "› /gamma 3" in text and "gamma: 4 → 3" in text
    assert "› w7 w8 w9" in text
    assert "model drafter · γ=3" in text
    assert "Nothing to answer: the prompt is empty." in text
    assert "max_new_tokens must be an integer" in text
    assert "never read" not in text
    assert text.rstrip().endswith("Goodbye.")
    assert stdin.readline() == "never read\n"


def test_piped_session_ends_at_end_of_input(session: ChatSession) -> None:
    renderer, console = recorded()
    assert run(session, renderer, PipeReader(io.StringIO("/seed 5"), renderer)) == 0
    assert session.settings.seed == 5
    assert console.export_text().rstrip().endswith("Goodbye.")


def test_live_panels_on_a_terminal(session: ChatSession) -> None:
    renderer, console = recorded(force_terminal=True)
    assert handle_line("/debug on", session, renderer)
    assert handle_line("w7 w8 w9", session, renderer)
    text = console.export_text()
    answer = session.history[-1]["content"]
    assert answer.split()[0] in text
    assert "speedup" in text


def test_errors_are_shown_and_the_loop_goes_on(
    session: ChatSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer, console = recorded()
    answer = session.answer

    def failing(prompt: str, on_event: Any = None) -> Any:
        if prompt == "explode":
            raise RuntimeError("boom")
        return answer(prompt, on_event)

    monkeypatch.setattr(session, "answer", failing)
    stdin = io.StringIO("explode\nw7 w8\n")
    assert run(session, renderer, PipeReader(stdin, renderer)) == 0
    text = console.export_text()
    assert "RuntimeError: boom" in text
    assert len(session.history) == 2


def test_double_slash_sends_a_prompt(session: ChatSession) -> None:
    renderer, _ = recorded()
    session.update(chat=True)
    handle_line("//w7 w8", session, renderer)
    assert session.history[0]["content"] == "/w7 w8"


def test_completer_uses_the_registry(session: ChatSession) -> None:
    completer = RegistryCompleter(REGISTRY)
    found = list(completer.get_completions(Document("/ga"), CompleteEvent()))
    assert [(c.text, c.start_position) for c in found] == [("/gamma", -3)]
    found = list(completer.get_completions(Document("/processor nu"), CompleteEvent()))
    assert [(c.text, c.start_position) for c in found] == [("nucleus", -2)]


def test_toolbar_shows_the_live_settings(session: ChatSession) -> None:
    with create_pipe_input() as pipe:
        reader = TerminalReader(session, input=pipe, output=DummyOutput())
        toolbar = reader.prompt_session.bottom_toolbar
        assert callable(toolbar)
        assert "γ=auto≤4" in toolbar()
        session.update(gamma=2, processor="nucleus", drafter_gen=True, use_cache=False)
        line = toolbar()
    assert line == settings_line(session.settings)
    assert "γ=auto≤2" in line and "nucleus(temperature=1.0, top_p=0.9)" in line
    assert "drafter✓" in line and "cache off" in line and "chat on" in line


@pytest.mark.parametrize("debug", ["off", "on"])
def test_model_output_cannot_drive_the_terminal(
    session: ChatSession, monkeypatch: pytest.MonkeyPatch, debug: str
) -> None:
    """A model that writes escape sequences (clear screen, window title) is shown as text."""
    decode = session.tokenizer.decode

    def hostile(*args: Any, **kwargs: Any) -> str:
        return "\x1b[2J\x1b]0;owned\x07" + decode(*args, **kwargs) + "\x1b[31m"

    monkeypatch.setattr(session.tokenizer, "decode", hostile)
    renderer, console = recorded()  # no terminal: the console adds no escapes of its own
    assert handle_line(f"/debug {debug}", session, renderer)
    assert handle_line("w7 w8 w9", session, renderer)
    output = console.file.getvalue()
    assert "speedup" in output
    assert "\x1b" not in output and "\x07" not in output
