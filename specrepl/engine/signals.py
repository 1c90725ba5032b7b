"""How the process ends on Ctrl-C and SIGTERM, the same in every entry point.

Ctrl-C raises `KeyboardInterrupt` (Python's default) and SIGTERM, inside
`sigterm_unwinds`, raises `Terminated`. Both unwind the stack like an
exception, so every `with` block on the way restores what it changed (the
terminal's echo and raw mode, rich's live panels, temporary files) before the
entry point prints one line and exits with the status a shell reports for the
signal: 130 and 143. The other exit statuses every entry point shares are
named here too (0, 1, 2).

Only the standard library is imported here: the launcher uses this module
before torch and transformers are imported.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "Terminated",
    "ctrl_c_insists",
    "signals_held",
    "sigterm_unwinds",
]

EXIT_OK = 0
EXIT_FAILED = 1
"""A model that cannot be loaded, a refusal, a failed check (soak, replay)."""
EXIT_USAGE = 2
"""A bad flag, config or input file."""

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""The status after Ctrl-C (130)."""

EXIT_TERMINATED = 128 + signal.SIGTERM
"""The status after SIGTERM: what a shell reports for a process that SIGTERM
killed (143), so that a script can tell it from an ordinary end (0)."""


class Terminated(SystemExit):
    """SIGTERM arrived.

    A `SystemExit` (status 143) so that neither `except Exception` nor
    `except KeyboardInterrupt` (which stops only the current generation in
    the REPL) swallows it and, should it escape, Python exits quietly with
    that status.
    """

    def __init__(self) -> None:
        super().__init__(EXIT_TERMINATED)


@contextlib.contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, the first SIGTERM raises `Terminated` in the main thread
    (later ones are ignored while it unwinds); the previous handler is put back
    afterwards. Does nothing outside the main thread, where Python cannot set
    signal handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: the previous handler was not set from Python; the default is the best guess
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while the block runs, and deliver the first one that
    came as soon as it ends, through the handler in force before.

    For importing torch and transformers: an exception raised in the middle of
    it can land inside torch's C++ initialisation, which aborts the process
    (SIGABRT, "terminate called after throwing an instance of ..."), or leave
    a module half-imported so that a later import fails. Held, the signal
    costs at most the rest of the import (a few seconds). Does nothing outside
    the main thread, which receives no signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    held = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, hold) for number in held}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        if received:
            signal.raise_signal(received[0])


@contextlib.contextmanager
def ctrl_c_insists(every: float = 0.5) -> Iterator[None]:
    """Within the block, Ctrl-C raises `KeyboardInterrupt` as before and, should
    library code swallow that exception, raises it again every `every` seconds
    until the block is left.

    For loading models, where a lost Ctrl-C leaves the user waiting. An
    exception raised by a signal lands on whatever Python code runs at that
    moment, and C code that clears errors from the Python it calls (CPython's
    `PyDict_GetItem` does so for a key's `__hash__` and `__eq__`, for one) loses
    it: a test that sends SIGINT to a real process loading the models saw this
    about once in 300 runs. Does nothing outside the main thread, or when
    SIGINT is not handled by Python (ignored, as in a background job, or left
    to the system).
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    received = threading.Event()
    left = threading.Event()
    lock = threading.Lock()

    def handler(signum: int, frame: FrameType | None) -> None:
        received.set()
        previous(signum, frame)  # Python's default raises KeyboardInterrupt

    def insist() -> None:
        while not left.wait(every):
            with lock:
                if left.is_set():
                    return
                if received.is_set():
                    _thread.interrupt_main()  # runs `handler` in the main thread again

    signal.signal(signal.SIGINT, handler)
    watcher = threading.Thread(target=insist, name="ctrl-c-insists", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            left.set()
        signal.signal(signal.SIGINT, previous)
