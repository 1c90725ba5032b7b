"""Ctrl-C and SIGTERM at every stage: loading, drafting, verifying, drawing, reading.

After any interruption the session must go on as if the interrupted prompt had
never been asked: history and settings unchanged, and the next answer token
for token what a fresh session gives. SIGTERM must end the REPL with status
143, "Terminated.", no traceback, the terminal restored and the prompt history
intact; those tests run `python infer.py` on tiny models saved to disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from prompt_toolkit.history import FileHistory
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from rich.console import Console

from specrepl.app import cli
from specrepl.app.render.answer import AnswerView
from specrepl.app.render.repl import Renderer
from specrepl.app.repl import PipeReader, TerminalReader, run
from specrepl.chat.answers import Answer, Message, RunFinished, RunStarted, RunStep
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.head_store import target_fingerprint
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.generation import (
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
)
from specrepl.engine.results import StepEvent
from specrepl.engine.signals import EXIT_TERMINATED, Terminated, signals_unwind
from specrepl.models import loading as models
from specrepl.models.pair import ModelPair
from specrepl.testing import interrupt_on_call, perturbed_copy, tiny_llama, tiny_tokenizer
from specrepl.train.shards import TokenData

ROOT = Path(__file__).resolve().parent.parent
PROMPT, NEXT_PROMPT = "w7 w8 w9", "w12 w13"
INTERRUPTED_NOTICE = "Interrupted; the session is unchanged."
KEPT_NOTICE = "Interrupted while drawing; the change to the session is kept."


def tokens(answer: Answer) -> dict[str, list[int]]:
    return {name: list(run.result.token_ids) for name, run in answer.runs.items()}


def fresh_answer(
    pair: ModelPair, settings: Settings, history: list[Message], prompt: str
) -> Answer:
    """`prompt` answered by a new session with these settings and history."""
    session = ChatSession(pair, settings)
    session.history = [dict(message) for message in history]
    return session.answer(prompt)


def recorded(**options: Any) -> tuple[Renderer, Console]:
    console = Console(file=io.StringIO(), width=100, record=True, **options)
    return Renderer(console, status_console=console), console


# -- start-up ------------------------------------------------------------------------------------


def test_a_swallowed_ctrl_c_is_raised_again_until_the_block_ends() -> None:
    from specrepl.engine.signals import ctrl_c_insists

    caught = 0
    with pytest.raises(KeyboardInterrupt), ctrl_c_insists(every=0.05):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            caught += 1  # swallowed, as C code that clears errors can
        time.sleep(5)  # not reached: raised again within 0.05 s
    assert caught == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    time.sleep(0.2)  # nothing raised after the block


def test_without_ctrl_c_the_block_changes_nothing() -> None:
    from specrepl.engine.signals import ctrl_c_insists

    with ctrl_c_insists(every=0.01):
        time.sleep(0.1)
    time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with ctrl_c_insists(every=0.01):  # an ignored Ctrl-C stays ignored (a background job)
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("stage", ["load_pair", "warm_up"])
@pytest.mark.parametrize(
    "argv",
    [[], ["--prompt", "w7"], ["--prompt", "w7", "--json"], ["soak", "--prompts", "3"]],
    ids=["repl", "one-shot", "json", "soak"],
)
def test_ctrl_c_while_loading_exits_130_without_a_traceback(
    stage: str,
    argv: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    pair: ModelPair,
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    if stage == "load_pair":
        monkeypatch.setattr(models, "load_pair", interrupted)
    else:
        monkeypatch.setattr(models, "load_pair", lambda *args, **kwargs: pair)
        monkeypatch.setattr(ChatSession, "warm_up", interrupted)
    monkeypatch.setattr(sys, "stdin", io.StringIO("w7\n"))
    assert cli.main(argv) == 130
    captured = capsys.readouterr()
    assert "Interrupted while loading the models." in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert "Goodbye" not in captured.out  # the REPL never started


def test_ctrl_c_in_the_repl_welcome_exits_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pair: ModelPair
) -> None:
    def interrupted(self: Renderer, interactive: bool) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "load_pair", lambda *args, **kwargs: pair)
    monkeypatch.setattr(Renderer, "welcome", interrupted)
    monkeypatch.setattr(sys, "stdin", io.StringIO("w7\n"))
    assert cli.main([]) == 130
    assert "Interrupted." in capsys.readouterr().err


# -- drafting and verification -------------------------------------------------------------------

MODES = {
    "speculative": {"speculative": True, "target_gen": False, "drafter_gen": False},
    "target": {"speculative": False, "target_gen": True, "drafter_gen": False},
    "drafter": {"speculative": False, "target_gen": False, "drafter_gen": True},
}
# (mode, the model whose forward pass is interrupted): drafting is the drafter's forward,
# verification the target's
STAGES = [
    ("speculative", "drafter"),
    ("speculative", "target"),
    ("target", "target"),
    ("drafter", "drafter"),
]


@contextmanager
def interrupted_forward(pair: ModelPair, model: str, part: str, call: int) -> Iterator[None]:
    """Ctrl-C in the `call`-th forward pass of the target or the drafter: after the
    whole model ran, or after its first layer only (its cache half updated)."""
    loaded = pair.target if model == "target" else pair.drafter
    assert loaded is not None
    module = loaded.model if part == "model" else loaded.model.model.layers[0]
    with interrupt_on_call(module, call):
        yield


@pytest.mark.parametrize("processor", ["greedy", "topk"])
@pytest.mark.parametrize("part", ["model", "layer"])
@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize(("mode", "model"), STAGES, ids=[f"{m}-{d}" for m, d in STAGES])
@pytest.mark.parametrize("call", [1, 3], ids=["prefill", "mid-run"])
def test_ctrl_c_in_a_forward_pass_leaves_the_session_as_it_was(
    pair: ModelPair, mode: str, model: str, use_cache: bool, part: str, processor: str, call: int
) -> None:
    settings = Settings(
        max_new_tokens=12,
        gamma=3,
        gamma_policy="fixed",
        processor=processor,
        temperature=0.8,
        top_k=5,
        use_cache=use_cache,
        seed=7,
        **MODES[mode],
    )
    session = ChatSession(pair, settings)
    session.answer("w10 w11")  # a turn of history before the interruption
    history, settings = list(session.history), session.settings
    expected = fresh_answer(pair, settings, history, PROMPT)

    with interrupted_forward(pair, model, part, call):
        answer = session.answer(PROMPT)

    assert answer.interrupted
    (run,) = answer.runs.values()
    assert run.result.stop_reason == "interrupted"
    full = tokens(expected)[run.generator]
    got = list(run.result.token_ids)
    assert len(got) < len(full)
    assert got == full[: len(got)]  # what was kept is the start of the uninterrupted answer
    assert session.history == history
    assert session.settings is settings
    # the same prompt again, then the next one: exactly what a fresh session gives
    assert tokens(session.answer(PROMPT)) == tokens(expected)
    expected_next = fresh_answer(pair, settings, session.history, NEXT_PROMPT)
    assert tokens(session.answer(NEXT_PROMPT)) == tokens(expected_next)


def test_ctrl_c_in_the_second_generator_keeps_the_first_run(pair: ModelPair) -> None:
    settings = Settings(max_new_tokens=12, gamma=3, gamma_policy="fixed", drafter_gen=True)
    session = ChatSession(pair, settings)
    expected = fresh_answer(pair, settings, [], PROMPT)
    speculative_steps = expected.runs["speculative"].result.steps
    # the target's first forward pass in its own run, after the speculative run's
    with interrupt_on_call(pair.target.model, speculative_steps + 1):
        answer = session.answer(PROMPT)
    assert list(answer.runs) == ["speculative", "target"]  # the drafter run is skipped
    assert not answer.runs["speculative"].interrupted
    assert tokens(answer)["speculative"] == tokens(expected)["speculative"]
    assert answer.runs["target"].interrupted
    assert answer.speedup is None
    assert session.history == []
    assert tokens(session.answer(PROMPT)) == tokens(expected)


def ngram_consistent(drafter: NgramDrafter) -> bool:
    """Each context's remembered best continuation has the highest count."""
    return all(
        drafter.best[context][0] == max(followers.values())
        and followers[drafter.best[context][1]] == drafter.best[context][0]
        for context, followers in drafter.counts.items()
    )


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
@pytest.mark.parametrize("kind", ["ngram", "lookup"])
def test_ctrl_c_with_a_model_free_drafter(pair: ModelPair, kind: str, use_cache: bool) -> None:
    settings = Settings(
        max_new_tokens=16, drafter_kind=kind, ngram_keep=True, gamma=4, use_cache=use_cache
    )
    session = ChatSession(pair, settings)
    for prompt in ("w10 w11", "w7 w8"):
        session.answer(prompt)
    history = list(session.history)
    with interrupt_on_call(pair.target.model, 3):
        answer = session.answer(PROMPT)
    assert answer.interrupted and session.history == history
    if kind == "ngram":
        kept = session.drafters._ngram
        assert isinstance(kept, NgramDrafter) and kept.counts  # the counts were kept
        assert ngram_consistent(kept)
    # greedy: the speculative answer is the target's, whatever the kept counts hold
    answer = session.answer(NEXT_PROMPT)
    assert tokens(answer)["speculative"] == tokens(answer)["target"]
    assert tokens(answer) == tokens(fresh_answer(pair, settings, history, NEXT_PROMPT))


# -- drawing and reading -------------------------------------------------------------------------


class InterruptingRenderer(Renderer):
    """Raises KeyboardInterrupt, as Ctrl-C would, at chosen points of the drawing.

    `at` maps a point ("started", "step", "finished", "summary", "notice") to
    how many of its next calls raise.
    """

    def __init__(self, console: Console, at: dict[str, int]) -> None:
        super().__init__(console, status_console=console)
        self.at = dict(at)

    def hit(self, point: str) -> None:
        if self.at.get(point, 0) > 0:
            self.at[point] -= 1
            raise KeyboardInterrupt

    def stream(self) -> AnswerView:
        renderer = self

        class View(AnswerView):
            def __call__(self, event: Any) -> None:
                if isinstance(event, RunStarted):
                    renderer.hit("started")
                elif isinstance(event, RunStep):
                    renderer.hit("step")
                elif isinstance(event, RunFinished):
                    renderer.hit("finished")
                super().__call__(event)

        return View(self.console)

    def answer(self, answer: Answer) -> None:
        self.hit("summary")
        super().answer(answer)

    def interrupted(self, changed: bool = False) -> None:
        self.hit("notice")
        super().interrupted(changed)


@pytest.mark.parametrize(
    ("at", "first_kept", "notice"),
    [
        ({"step": 1}, False, "Interrupted: the partial answer is not added"),
        ({"started": 1}, False, INTERRUPTED_NOTICE),
        ({"finished": 1}, False, INTERRUPTED_NOTICE),
        ({"summary": 1}, True, KEPT_NOTICE),
        # Ctrl-C twice: the second lands while the first is being reported
        ({"started": 1, "notice": 1}, False, None),
        ({"summary": 1, "notice": 1}, True, None),
        ({"step": 1, "summary": 1, "notice": 1}, False, None),
    ],
    ids=["step", "started", "finished", "summary", "twice", "summary-twice", "thrice"],
)
@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_ctrl_c_while_drawing_returns_to_the_prompt(
    pair: ModelPair, at: dict[str, int], first_kept: bool, notice: str | None, terminal: bool
) -> None:
    settings = Settings(max_new_tokens=12)
    session = ChatSession(pair, settings)
    stream = io.StringIO()
    console = Console(file=stream, width=100, record=True, force_terminal=terminal)
    renderer = InterruptingRenderer(console, at)
    lines = io.StringIO(f"{PROMPT}\n{NEXT_PROMPT}\n")
    assert run(session, renderer, PipeReader(lines, renderer)) == 0
    text = console.export_text()
    assert text.rstrip().endswith("Goodbye.")
    assert not any(renderer.at.values())  # every planned Ctrl-C happened
    if notice is not None:
        assert notice in text
    else:
        assert INTERRUPTED_NOTICE not in text and KEPT_NOTICE not in text
    # the session went on: the next prompt was answered as a fresh session would
    before = history_of(pair, settings, PROMPT) if first_kept else []
    assert session.history[: len(before)] == before
    expected = fresh_answer(pair, settings, before, NEXT_PROMPT)
    assert session.history[len(before) :] == [
        {"role": "user", "content": NEXT_PROMPT},
        {"role": "assistant", "content": expected.reply.text if expected.reply else ""},
    ]
    if terminal:  # every live panel was closed: the cursor is shown again
        raw = stream.getvalue()
        assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l") >= 0


def history_of(pair: ModelPair, settings: Settings, prompt: str) -> list[Message]:
    session = ChatSession(pair, settings)
    session.answer(prompt)
    return session.history


def test_ctrl_c_while_drawing_a_command_result_keeps_the_change(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings())
    console = Console(file=io.StringIO(), width=100, record=True)
    renderer = InterruptingRenderer(console, {})

    def show(result: Any) -> None:
        raise KeyboardInterrupt

    renderer.show = show  # type: ignore[method-assign]
    assert run(session, renderer, PipeReader(io.StringIO("/gamma 2\n/seed 4\n"), renderer)) == 0
    assert session.settings.gamma == 2 and session.settings.seed == 4
    assert console.export_text().count(KEPT_NOTICE) == 2


class FlakyLines(io.StringIO):
    """Lines whose first `failures` reads raise KeyboardInterrupt (Ctrl-C while reading)."""

    def __init__(self, text: str, failures: int) -> None:
        super().__init__(text)
        self.failures = failures

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        if self.failures:
            self.failures -= 1
            raise KeyboardInterrupt
        return super().readline(size)


def test_ctrl_c_while_reading_a_line_reads_the_next(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    renderer, console = recorded()
    assert run(session, renderer, PipeReader(FlakyLines(f"{PROMPT}\n", 2), renderer)) == 0
    assert [message["content"] for message in session.history[::2]] == [PROMPT]
    assert console.export_text().rstrip().endswith("Goodbye.")


def test_ctrl_c_at_the_terminal_prompt_and_while_answering(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    renderer, console = recorded()
    with create_pipe_input() as keys:
        reader = TerminalReader(session, input=keys, output=DummyOutput())
        keys.send_text("w30 abandoned\x03")  # Ctrl-C at the prompt: the line is dropped
        keys.send_text("\x03\x03")  # twice more, quickly
        keys.send_text(f"{PROMPT}\r{NEXT_PROMPT}\r\x04")
        with interrupt_on_call(pair.target.model, 2):
            assert run(session, renderer, reader) == 0
    assert [message["content"] for message in session.history[::2]] == [NEXT_PROMPT]
    text = console.export_text()
    assert "Interrupted: the partial answer is not added" in text
    assert "abandoned" not in text


def test_the_terminal_echo_comes_back_after_ctrl_c(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    renderer = InterruptingRenderer(Console(file=io.StringIO()), {"started": 1})
    master, slave = pty.openpty()
    try:
        with os.fdopen(slave, "r", closefd=False) as terminal, create_pipe_input() as keys:
            reader = TerminalReader(session, input=keys, output=DummyOutput(), stdin=terminal)
            keys.send_text(f"{PROMPT}\r\x04")
            echo_during: list[bool] = []
            original = session.answer

            def answer(prompt: str, on_event: Any = None) -> Answer:
                echo_during.append(bool(termios.tcgetattr(slave)[3] & termios.ECHO))
                return original(prompt, on_event)

            session.answer = answer  # type: ignore[method-assign]
            assert run(session, renderer, reader) == 0
        assert echo_during == [False]  # keys were not echoed while answering
        assert termios.tcgetattr(slave)[3] & termios.ECHO
    finally:
        os.close(master)
        os.close(slave)


# -- SIGTERM in process --------------------------------------------------------------------------


class TerminatingLines(io.StringIO):
    """Sends this process SIGTERM when line `at` (from 0) is read."""

    def __init__(self, text: str, at: int, signals: int = 1) -> None:
        super().__init__(text)
        self.at = at
        self.signals = signals
        self.reads = 0

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        if self.reads == self.at:
            for _ in range(self.signals):
                os.kill(os.getpid(), signal.SIGTERM)
        self.reads += 1
        return super().readline(size)


@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_while_waiting_for_a_line(pair: ModelPair, signals: int) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    renderer, console = recorded()
    previous = signal.getsignal(signal.SIGTERM)
    lines = TerminatingLines(f"{PROMPT}\n{NEXT_PROMPT}\n", at=1, signals=signals)
    assert run(session, renderer, PipeReader(lines, renderer)) == EXIT_TERMINATED == 143
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is put back
    text = console.export_text()
    assert text.count("Terminated.") == 1 and "Goodbye." not in text
    assert [message["content"] for message in session.history[::2]] == [PROMPT]


def test_sigterm_while_generating(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=12))
    renderer, console = recorded(force_terminal=True)
    steps = 0

    def on_step(module: torch.nn.Module, args: Any, output: Any) -> None:
        nonlocal steps
        steps += 1
        if steps == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    handle = pair.target.model.register_forward_hook(on_step)
    try:
        assert run(session, renderer, PipeReader(io.StringIO(f"{PROMPT}\n"), renderer)) == 143
    finally:
        handle.remove()
    assert session.history == []
    assert "Terminated." in console.export_text()


class SignalledInFinalizer:
    """Sends this process `sig` from its finalizer, where Python cannot raise: it
    prints the exception as "Exception ignored in" and goes on."""

    def __init__(self, sig: signal.Signals) -> None:
        self.sig = sig

    def __del__(self) -> None:
        signal.raise_signal(self.sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_that_lands_in_a_finalizer_is_raised_again(
    sig: signal.Signals, capfd: pytest.CaptureFixture[str]
) -> None:
    expected = Terminated if sig == signal.SIGTERM else KeyboardInterrupt
    started = time.monotonic()
    with pytest.raises(expected), signals_unwind():
        SignalledInFinalizer(sig)  # dropped at once: the signal comes inside its __del__
        while time.monotonic() < started + 10:
            time.sleep(0.001)
    assert time.monotonic() - started < 5  # raised again, not lost
    assert "Exception ignored" not in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert sys.unraisablehook is not None


@pytest.mark.parametrize("speculative", [False, True], ids=["target", "speculative"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_whose_exception_library_code_swallowed_still_stops_the_generation(
    pair: ModelPair, sig: signal.Signals, speculative: bool
) -> None:
    steps = 0

    def on_step(event: StepEvent) -> None:
        nonlocal steps
        steps += 1
        if steps == 3:
            # lost, as in C code that clears the errors of the Python it calls
            with contextlib.suppress(KeyboardInterrupt, Terminated):
                signal.raise_signal(sig)

    target = pair.target.model
    generate = (
        partial(speculative_generate, drafter=NgramDrafter(), target=target, gamma=3)
        if speculative
        else partial(autoregressive_generate, model=target)
    )
    expected = Terminated if sig == signal.SIGTERM else GenerationInterrupted
    with signals_unwind(), pytest.raises(expected) as raised:
        generate([2, 5, 7, 8], max_gen_len=400, on_step=on_step)
    assert steps == 3  # stopped at the step after the one that swallowed it
    if isinstance(raised.value, GenerationInterrupted):
        assert raised.value.result.stop_reason == "interrupted"
        assert raised.value.result.steps == 3
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with signals_unwind():  # a new generation does not see the signal of the last one
        assert len(generate([2, 5, 7, 8], max_gen_len=6).token_ids) == 6


# -- SIGINT and SIGTERM to `python infer.py` -----------------------------------------------------


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny target and drafter saved as local directories, and two configs: `tiny.toml`
    (short answers) and `endless.toml` (a target whose greedy answer never ends, with a
    context of a million positions, and the n-gram drafter)."""
    root = tmp_path_factory.mktemp("models")
    target = tiny_llama(32, seed=4)
    target.save_pretrained(root / "target")
    tiny_tokenizer(32).save_pretrained(root / "target")
    perturbed_copy(target, 0.3, seed=2).save_pretrained(root / "drafter")
    tiny_llama(32, seed=4, max_position_embeddings=1_000_000).save_pretrained(root / "endless")
    tiny_tokenizer(32).save_pretrained(root / "endless")
    (root / "tiny.toml").write_text(
        f'device = "cpu"\n[target]\nsource = "{root / "target"}"\n'
        f'[drafter]\nsource = "{root / "drafter"}"\n[generation]\nmax_new_tokens = 8\n'
    )
    (root / "endless.toml").write_text(
        f'device = "cpu"\n[target]\nsource = "{root / "endless"}"\n'
        f'[drafter]\nkind = "ngram"\n[generation]\nmax_new_tokens = 1000000\n'
    )
    return root


def child_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


class Output:
    """Collects a child's output from a file descriptor and waits for markers in it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.data = b""

    def wait_for(self, marker: str, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        while marker.encode() not in self.data:
            left = deadline - time.monotonic()
            if left <= 0 or self.read(min(left, 0.5)) is False:
                return False
        return True

    def read(self, timeout: float) -> bool | None:
        """Read what is there: True for some output, None for none within
        `timeout`, False once the writer is gone."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # a pty whose child has exited
            return False
        self.data += chunk
        return bool(chunk)

    def until_exit(self, child: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
        """Keep reading (a child blocked on a full terminal cannot exit) until it exits."""
        deadline = time.monotonic() + timeout
        while child.poll() is None and time.monotonic() < deadline:
            self.read(0.1)
        return child.wait(timeout=1)

    def drain(self) -> str:
        """Everything written until the writer has been quiet for 0.3 s."""
        while self.read(0.3):
            pass
        return self.data.decode(errors="replace")


def test_sigint_while_loading_in_a_real_process(models_dir: Path) -> None:
    # The stand-in loader runs Python between short sleeps, as a real one does between
    # its C calls. Should the child not end, SIGUSR1 makes it print every thread's stack
    # (faulthandler), so that the failure says where it was stuck.
    slow_loader = (
        "import faulthandler, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR1)\n"
        "import specrepl.app.cli as cli, specrepl.models.loading as models\n"
        "def load_pair(*args, **kwargs):\n"
        "    while True:\n"
        "        time.sleep(0.05)\n"
        "models.load_pair = load_pair\n"
        "raise SystemExit(cli.main(sys.argv[1:]))\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", slow_loader, "--config", str(models_dir / "tiny.toml")],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert child.stdout is not None
        out = Output(child.stdout.fileno())
        assert out.wait_for("Loading models"), out.data.decode(errors="replace")
        child.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            out.read(0.1)  # keep the pipe empty: a child blocked on writing cannot exit
        if child.poll() is None:
            # SigIgn, SigBlk, SigPnd: whether the child ignores, blocks or still holds SIGINT
            masks = [
                line
                for line in Path(f"/proc/{child.pid}/status").read_text().splitlines()
                if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
            ]
            child.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            pytest.fail(f"still running 60 s after SIGINT ({', '.join(masks)}):\n{out.drain()}")
        status = child.wait()
        text = out.drain()
    finally:
        child.kill()
        child.communicate()
    assert status == 130, text
    assert "Interrupted while loading the models." in text
    assert "Traceback" not in text


def test_sigterm_ends_the_piped_repl(models_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "infer.py", "--config", str(models_dir / "tiny.toml")],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        out, err = Output(child.stdout.fileno()), Output(child.stderr.fileno())
        child.stdin.write(f"{PROMPT}\n".encode())
        child.stdin.flush()
        assert out.wait_for("baseline")  # the answer's summary: now it waits for a line
        child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 60
        while child.poll() is None and time.monotonic() < deadline:
            out.read(0.05)  # both pipes kept empty: a child blocked on writing cannot exit
            err.read(0.05)
        stdout, stderr = out.drain(), err.drain()
        assert child.poll() == 143, f"still running 60 s after SIGTERM:\n{stdout}\n{stderr}"
    finally:
        child.kill()
        child.communicate()
    assert "Terminated." in stderr
    assert "Traceback" not in stdout + stderr
    assert "Goodbye." not in stdout


@contextmanager
def repl_on_a_terminal(
    config: Path, history: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Output, int]]:
    """`python infer.py` with a pseudo-terminal as stdin, stdout and stderr; yields
    the child, its output and the terminal (whose settings a test can read)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    child = subprocess.Popen(
        [sys.executable, "infer.py", "--config", str(config)],
        cwd=ROOT,
        env=child_env(SPECREPL_HISTORY=str(history), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1"),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    try:
        yield child, Output(master), slave
    finally:
        child.kill()
        child.wait()
        os.close(master)
        os.close(slave)


def assert_cooked(terminal: int) -> None:
    """The terminal is back in its ordinary mode: lines, echo, Ctrl-C as a signal."""
    flags = termios.tcgetattr(terminal)[3]
    assert flags & termios.ECHO and flags & termios.ICANON and flags & termios.ISIG


def test_sigterm_at_the_terminal_prompt_keeps_the_history(models_dir: Path, tmp_path: Path) -> None:
    history = tmp_path / "history"
    with repl_on_a_terminal(models_dir / "tiny.toml", history) as (child, out, terminal):
        assert out.wait_for("Ctrl-D quits")
        os.write(out.fd, f"{PROMPT}\r".encode())
        assert out.wait_for("baseline")
        os.write(out.fd, b"/gamma 3\r")
        assert out.wait_for("gamma: ")
        time.sleep(0.5)  # back at the prompt, in raw mode
        child.send_signal(signal.SIGTERM)
        assert out.until_exit(child) == 143
        text = out.drain()
        assert_cooked(terminal)
    assert "Terminated." in text and "Traceback" not in text
    assert list(FileHistory(str(history)).load_history_strings()) == ["/gamma 3", PROMPT]


def test_sigterm_while_generating_restores_the_terminal(models_dir: Path, tmp_path: Path) -> None:
    history = tmp_path / "history"
    history.write_text("\n# earlier\n+an older line\n")
    with repl_on_a_terminal(models_dir / "endless.toml", history) as (child, out, terminal):
        assert out.wait_for("Ctrl-D quits")
        os.write(out.fd, f"{PROMPT}\r".encode())
        assert out.wait_for("ngram drafter")  # the live panel is up: generating
        time.sleep(1.0)
        echo_while_generating = termios.tcgetattr(terminal)[3] & termios.ECHO
        child.send_signal(signal.SIGTERM)
        assert out.until_exit(child) == 143
        text = out.drain()
        assert not echo_while_generating
        assert_cooked(terminal)
    assert "Terminated." in text and "Traceback" not in text
    assert "baseline" not in text  # it was still generating
    assert list(FileHistory(str(history)).load_history_strings()) == [PROMPT, "an older line"]


# -- every entry point ends the same way: one line, 130 or 143, nothing half-written ------------

EXIT_FOR = {signal.SIGINT: 130, signal.SIGTERM: 143}
LINE_FOR = {signal.SIGINT: "Interrupted", signal.SIGTERM: "Terminated"}


def leftovers(*directories: Path) -> list[Path]:
    """Temporary files (`.NAME.PID.tmp`) or unfinished directories left behind."""
    found: list[Path] = []
    for directory in directories:
        if directory.exists():
            found += [p for p in directory.rglob("*") if p.name.endswith(".tmp")]
            found += [p for p in directory.rglob(".partial-*")]
    return found


def signalled(
    argv: list[str], sig: signal.Signals, marker: str | None, *, settle: float = 1.0, **env: str
) -> tuple[int, str]:
    """Run `python infer.py ARGV`, send `sig` once `marker` is on stdout or stderr
    (None: 0.5 s after the start, while torch is being imported) and `settle`
    seconds more; returns the exit status and everything it printed."""
    child = subprocess.Popen(
        [sys.executable, "infer.py", *argv],
        cwd=ROOT,
        env=child_env(**env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert child.stdout is not None
        out = Output(child.stdout.fileno())
        if marker is None:
            time.sleep(0.5)
        else:
            assert out.wait_for(marker), out.data.decode(errors="replace")
            time.sleep(settle)
        assert child.poll() is None, out.drain()  # still running when the signal comes
        child.send_signal(sig)
        try:
            status = out.until_exit(child, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 120 s after {sig.name}:\n{out.drain()[-4000:]}")
        return status, out.drain()
    finally:
        child.kill()
        child.communicate()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_torch_is_imported(models_dir: Path, sig: signal.Signals) -> None:
    argv = ["--config", str(models_dir / "tiny.toml"), "--prompt", "w7"]
    status, text = signalled(argv, sig, None)
    assert status == EXIT_FOR[sig], text
    assert LINE_FOR[sig] in text and "Traceback" not in text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_a_one_shot_answer(models_dir: Path, sig: signal.Signals) -> None:
    argv = ["--config", str(models_dir / "endless.toml"), "--prompt", PROMPT]
    status, text = signalled(argv, sig, "endless")  # the models table: now it generates
    assert status == EXIT_FOR[sig], text
    assert "Traceback" not in text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_bench(models_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["w7 w8 w9"]}\n')
    report = tmp_path / "out" / "bench.json"
    argv = [
        "bench", "--config", str(models_dir / "endless.toml"), "--prompts", str(prompts),
        "--max-new-tokens", "200000", "--warmup", "0", "--widths", "off", "--json", str(report),
    ]  # fmt: skip
    status, text = signalled(argv, sig, "bench 1 prompts")
    assert status == EXIT_FOR[sig], text
    assert "Traceback" not in text
    if sig == signal.SIGTERM:  # ends at once: no report, and no half of one
        assert "Terminated." in text and not report.exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_soak(models_dir: Path, tmp_path: Path, sig: signal.Signals) -> None:
    report = tmp_path / "soak.json"
    argv = ["soak", "--config", str(models_dir / "tiny.toml"), "--prompts", "100000",
            "--json", str(report)]  # fmt: skip
    status, text = signalled(argv, sig, "target", settle=2.0)
    assert status == EXIT_FOR[sig], text
    assert LINE_FOR[sig] in text and "Traceback" not in text
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_distill_keeps_a_resumable_work_directory(
    models_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    work, out = tmp_path / "work", tmp_path / "head"
    argv = [
        "--config", str(models_dir / "tiny.toml"), "distill", "--work", str(work),
        "--out", str(out), "--prompts", "400", "--data-tokens", "100000", "--minutes", "5",
    ]  # fmt: skip
    status, text = signalled(argv, sig, "work directory", settle=3.0)
    assert status == EXIT_FOR[sig], text
    assert LINE_FOR[sig] in text and "Traceback" not in text
    assert leftovers(tmp_path) == []
    assert not out.exists()  # no head was written half-trained


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_distill_data_keeps_every_whole_shard(
    models_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """Background data accumulation, stopped: the shards listed all read, and
    nothing half-written is left beside them."""
    data = tmp_path / "data"
    argv = [
        "--config", str(models_dir / "tiny.toml"), "distill", "--data", str(data),
        "--data-only", "--data-tokens", "100000000",
    ]  # fmt: skip
    status, text = signalled(argv, sig, "answer tokens: 1", settle=2.0)
    assert status == EXIT_FOR[sig], text
    assert LINE_FOR[sig] in text and "Traceback" not in text
    assert leftovers(tmp_path) == []
    opened = TokenData.open(
        data,
        name="target",
        fingerprint=target_fingerprint(tiny_llama(32, seed=4)),
        vocab_size=32,
    )
    damaged: list[str] = []
    records = list(opened.records(damaged.append))
    assert opened.shards and not damaged
    assert len(records) == sum(shard.records for shard in opened.shards)


def test_ctrl_c_while_the_arguments_are_read_ends_like_one_while_importing(
    monkeypatch, capsys
) -> None:
    """A Ctrl-C that lands after the command line was imported but before
    anything started (a slow start: CI saw it) ends with one line and 130."""

    def interrupted(argv: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "parse_arguments", interrupted)
    assert cli.main(["--prompt", "w7"]) == 130
    err = capsys.readouterr().err
    assert "Interrupted while starting." in err and "Traceback" not in err
