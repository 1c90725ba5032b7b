"""How the process ends on Ctrl-C and SIGTERM, the same in every entry point.

Ctrl-C raises `KeyboardInterrupt` (Python's default) and SIGTERM, inside
`signals_unwind`, raises `Terminated`. Both unwind the stack like an
exception, so every `with` block on the way restores what it changed (the
terminal's echo and raw mode, rich's live panels, temporary files) before the
entry point prints one line and exits with the status a shell reports for the
signal: 130 and 143. An exception lost on the way is raised again: one that
lands in a finalizer at once (`signals_unwind`), one that C code clears at
the next step of a generation (`raise_lost_signal`) or, for Ctrl-C, within
half a second while the models load (`ctrl_c_insists`). The other exit
statuses every entry point shares are named here too (0, 1, 2).

Only the standard library is imported here: the launcher uses this module
before torch and transformers are imported.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "SignalMark",
    "Terminated",
    "ctrl_c_insists",
    "raise_lost_signal",
    "signals_held",
    "signals_received",
    "signals_unwind",
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


_interrupts = 0
"""How many Ctrl-Cs the handler of `signals_unwind` has received."""
_terminating = False
"""Whether SIGTERM came within the innermost `signals_unwind` block."""


class _Unwinding:
    """The handlers `signals_unwind` puts in force for one block."""

    def __init__(self, previous_hook: Callable[[sys.UnraisableHookArgs], object]) -> None:
        self.fired = False  # Terminated raised: later SIGTERMs are ignored while it unwinds
        self.previous_hook = previous_hook

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        global _terminating
        _terminating = True
        if not self.fired:
            self.fired = True
            raise Terminated

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        global _interrupts
        _interrupts += 1
        raise KeyboardInterrupt

    def on_unraisable(self, unraisable: sys.UnraisableHookArgs) -> None:
        lost = unraisable.exc_type
        if lost is not None and issubclass(lost, Terminated):
            self.fired = False
            _deliver_again(signal.SIGTERM)
        elif lost is not None and issubclass(lost, KeyboardInterrupt):
            _deliver_again(signal.SIGINT)
        else:
            self.previous_hook(unraisable)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """Within the block, Ctrl-C raises `KeyboardInterrupt` (as Python's default
    handler does, where that is the one in force) and the first SIGTERM raises
    `Terminated` in the main thread (later ones are ignored while it unwinds).
    The previous handlers are put back afterwards. Does nothing outside the
    main thread, where Python cannot set signal handlers; a Ctrl-C ignored (a
    background job) stays ignored.

    An exception that Python cannot raise is not lost either. A signal's
    handler runs between two bytecodes of whatever Python code runs at that
    moment, and where that is a finalizer (`__del__`, a weakref callback: the
    `regex` package's compiled groups have one, run during the warm-up),
    Python prints the exception as "Exception ignored in" and goes on. Here
    such an exception is not printed but delivered again to the main thread,
    SIGTERM as if it were the first. Where C code clears it without a word,
    `raise_lost_signal` raises it at the next step of a generation.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _terminating
    outer_terminating = _terminating
    handlers = _Unwinding(sys.unraisablehook)
    previous_sigterm = signal.signal(signal.SIGTERM, handlers.on_sigterm)
    previous_sigint = signal.getsignal(signal.SIGINT)
    if previous_sigint is signal.default_int_handler:
        signal.signal(signal.SIGINT, handlers.on_sigint)
    sys.unraisablehook = handlers.on_unraisable
    try:
        yield
    finally:
        sys.unraisablehook = handlers.previous_hook
        # None: the previous handler was not set from Python; the default is the best guess
        restored = signal.SIG_DFL if previous_sigterm is None else previous_sigterm
        signal.signal(signal.SIGTERM, restored)
        if previous_sigint is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_sigint)
        _terminating = outer_terminating


def _deliver_again(signum: int) -> None:
    """Run `signum`'s handler in the main thread again, from another thread a moment
    later: from this one it would run at once, in the same finalizer or hook."""
    again = threading.Timer(0.01, _thread.interrupt_main, args=(signum,))
    again.daemon = True
    with contextlib.suppress(RuntimeError):  # no new thread while the interpreter ends
        again.start()


SignalMark = int
"""The Ctrl-Cs received so far (`signals_received`)."""


def signals_received() -> SignalMark:
    """A mark to pass to `raise_lost_signal` before a long loop."""
    return _interrupts


def raise_lost_signal(mark: SignalMark) -> None:
    """Raise `Terminated` if SIGTERM came within the `signals_unwind` block, or
    `KeyboardInterrupt` if Ctrl-C came since `mark`, for the loop that calls
    this is still running.

    For the safe points of long loops (a generation's steps), should C code
    that clears the errors of the Python it calls have lost the exception (see
    `ctrl_c_insists`). A signal whose exception was not lost has ended the
    loop before it reaches its next safe point, so this raises nothing twice.
    Knows only of the signals that `signals_unwind`'s handlers received.
    """
    if _terminating:
        raise Terminated
    if _interrupts > mark:
        raise KeyboardInterrupt


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
