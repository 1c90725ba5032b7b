"""A prompt at once: the REPL's first screen imports no model library, and a
`LoadingSession` loads the models behind the prompt (startup.py)."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from specrepl.app import cli, startup
from specrepl.app.render.repl import Renderer
from specrepl.app.repl import TerminalReader, run
from specrepl.app.startup import LoadingSession
from specrepl.chat.config import load_config
from specrepl.chat.flags import app_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def config_file(tiny_config_file: Path) -> Path:
    return tiny_config_file


def recorded() -> tuple[Renderer, Console, Console]:
    console = Console(file=io.StringIO(), width=100, record=True)
    status = Console(file=io.StringIO(), width=100, record=True)
    return Renderer(console, status_console=status), console, status


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold the loading thread until the test opens the gate (or the test ends)."""
    opened = threading.Event()
    real = startup.open_session

    def held(*args: Any, **kwargs: Any) -> Any:
        opened.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(startup, "open_session", held)
    yield opened
    opened.set()


def test_the_first_screen_imports_no_model_library() -> None:
    """What the prompt needs (parser, config, settings, commands, renderer, reader,
    the loading session) is imported and built without torch or transformers."""
    code = (
        "import sys\n"
        "from prompt_toolkit.input import create_pipe_input\n"
        "from prompt_toolkit.output import DummyOutput\n"
        "from specrepl.app import cli, repl\n"
        "from specrepl.chat.flags import app_config\n"
        "from specrepl.app.commands.registry import REGISTRY\n"
        "from specrepl.app.startup import LoadingSession\n"
        "args = cli.parse_arguments(['--gamma', '3', '--processor', 'topk'])\n"
        "session = LoadingSession(app_config(args))\n"
        "with create_pipe_input() as keys:\n"
        "    reader = repl.TerminalReader(session, input=keys, output=DummyOutput())\n"
        "    print(reader._toolbar())\n"
        "REGISTRY.dispatch(session, '/gamma 5')\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules)\n"
        "print('heavy:', heavy)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    assert "heavy: []" in completed.stdout
    assert "loading models: starting" in completed.stdout and "γ=3 " in completed.stdout


def test_a_subcommand_still_parses_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = cli.parse_arguments(["--gamma", "2", "bench", "--limit", "1"])
    assert args.subcommand == "bench" and args.limit == 1 and args.gamma == ("fixed", 2)
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_arguments(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--limit" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.parse_arguments(["--no-such-flag"])
    assert exit_info.value.code == 2


def test_commands_run_while_loading_and_a_prompt_waits(
    config_file: Path, gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer, console, _ = recorded()
    session = LoadingSession(load_config(config_file)).start()
    seen_while_loading: list[tuple[bool, int]] = []

    def wait_for_models(waiting: LoadingSession) -> None:
        seen_while_loading.append((waiting.ready, waiting.settings.gamma))
        gate.set()  # the prompt is waiting: let the models load now
        while not waiting.wait(0.05):
            pass

    monkeypatch.setattr(renderer, "wait_for_models", wait_for_models)
    with create_pipe_input() as keys:
        reader = TerminalReader(session, input=keys, output=DummyOutput())
        session.set_on_change(reader.wake)
        keys.send_text("/gamma 3\r")
        keys.send_text("/help\r")
        keys.send_text("w7 w8 w9\r")
        keys.send_text("\x04")
        assert run(session, renderer, reader) == 0
    text = console.export_text()
    assert "The models are loading" in text
    assert seen_while_loading == [(False, 3)]  # /gamma was done before the models came
    assert text.index("gamma: 4 → 3") < text.index("/quit") < text.index("Models ready after")
    assert "model drafter · γ=3" in text and "baseline" in text
    assert session.ready and session.settings.gamma == 3
    assert [turn["content"] for turn in session.history[::2]] == ["w7 w8 w9"]


def test_ctrl_c_while_waiting_gives_up_the_line_only(
    config_file: Path, gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer, console, _ = recorded()
    session = LoadingSession(load_config(config_file)).start()
    waits = []

    def wait_for_models(waiting: LoadingSession) -> None:
        waits.append(1)
        if len(waits) == 1:
            raise KeyboardInterrupt
        gate.set()
        while not waiting.wait(0.05):
            pass

    monkeypatch.setattr(renderer, "wait_for_models", wait_for_models)
    with create_pipe_input() as keys:
        reader = TerminalReader(session, input=keys, output=DummyOutput())
        keys.send_text("w1 w2\r")
        keys.send_text("w7 w8 w9\r")
        keys.send_text("/quit\r")
        assert run(session, renderer, reader) == 0
    text = console.export_text()
    assert "Stopped waiting: that line was not run" in text
    assert len(waits) == 2
    assert [turn["content"] for turn in session.history[::2]] == ["w7 w8 w9"]


def test_settings_the_models_refuse_are_named_when_they_arrive(
    config_file: Path, gate: threading.Event
) -> None:
    config = load_config(config_file)
    session = LoadingSession(config).start()
    session.update(drafter_gen=True, top_k=7)
    session.update(drafter_kind="head", drafter_head=str(config_file.parent / "no-head"))
    assert session.settle() is None  # still loading
    gate.set()
    assert session.wait(60)
    arrived = session.settle()
    assert arrived is not None and session.ready
    assert session.settings.drafter_gen and session.settings.top_k == 7
    assert "no-head" in arrived.notices[0]  # why the changes together were refused
    assert any(n.startswith("drafter_kind = 'head' was not kept") for n in arrived.notices)
    assert session.settle() is None  # reported once


def test_a_pair_with_no_drafter_refuses_what_needs_one_before_loading(
    config_file: Path, gate: threading.Event
) -> None:
    from dataclasses import replace

    from specrepl.chat.settings import SettingError

    config = replace(load_config(config_file), drafter=None)
    session = LoadingSession(config)
    assert not session.settings.drafter_gen
    with pytest.raises(SettingError, match="needs a drafter model"):
        session.update(drafter_gen=True)
    assert not session.settings.drafter_gen


def test_models_that_cannot_load_end_the_waiting_prompt(config_file: Path, tmp_path: Path) -> None:
    """The prompt is left as soon as the loading fails, with the reason and status 1."""
    nowhere = str(tmp_path / "nowhere")
    args = cli.parse_arguments(["--config", str(config_file), "--target", nowhere])
    renderer, console, status = recorded()
    session = LoadingSession(app_config(args))
    with create_pipe_input() as keys:
        reader = TerminalReader(session, input=keys, output=DummyOutput())
        session.set_on_change(reader.wake)
        # no key is ever typed; a watchdog ends the prompt should the wake-up not come
        watchdog = threading.Timer(60, lambda: keys.send_text("\x04"))
        watchdog.start()
        try:
            session.start()
            assert run(session, renderer, reader) == 1
        finally:
            watchdog.cancel()
    shown = status.export_text()
    assert "✗ no such model directory" in shown and "nowhere" in shown
    assert "Goodbye" not in console.export_text()


def _read_until(fd: int, mark: str, seen: bytearray, deadline: float) -> str:
    """Read the terminal until `mark` appears; the screen so far, without escapes."""
    while True:
        text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", seen.decode(errors="replace"))
        if mark in text:
            return text
        left = deadline - time.monotonic()
        assert left > 0, f"{mark!r} did not appear; the screen ends with {text[-400:]!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"the process ended before {mark!r}: {text[-400:]!r}"
            seen.extend(chunk)


@pytest.mark.embedded
def test_the_prompt_comes_before_the_embedded_models(embedded_cache_dir: str) -> None:
    """On a real terminal: /help is answered while the models load, then a prompt
    is answered by both generators, and /quit ends the process with status 0."""
    master, slave = pty.openpty()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "SPECREPL_CACHE_DIR": embedded_cache_dir,
        "SPECREPL_HISTORY": os.devnull,
        "PROMPT_TOOLKIT_NO_CPR": "1",
        "COLUMNS": "120",
        "TERM": "xterm",
    }
    process = subprocess.Popen(
        [sys.executable, "infer.py", "--max-new-tokens", "8"],
        cwd=ROOT, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
    )  # fmt: skip
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + 300
    try:
        _read_until(master, "›", seen, deadline)
        os.write(master, b"/help\r")
        screen = _read_until(master, "/quit", seen, deadline)
        assert "The models are loading" in screen and "Models ready" not in screen
        os.write(master, b"What is 2 + 2?\r")
        screen = _read_until(master, "baseline", seen, deadline)
        assert "Models ready after" in screen and "target only" in screen
        os.write(master, b"/quit\r")
        _read_until(master, "Goodbye.", seen, deadline)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
