"""The process entry point of `python infer.py` and the `specrepl` script.

It runs before torch and transformers are imported (that takes seconds), so
that Ctrl-C or SIGTERM at any moment, the import included, ends the process
the same way: one line on stderr, no traceback, status 130 or 143 (see
signals.py). Only the standard library is imported until `cli` is.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from specrepl.engine.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, signals_unwind

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Import the command line and run it; returns the exit status."""
    with signals_unwind():
        try:
            from specrepl.app.cli import main as cli_main
        except KeyboardInterrupt:
            sys.stderr.write("Interrupted while starting.\n")
            return EXIT_INTERRUPTED
        except Terminated:
            sys.stderr.write("Terminated while starting.\n")
            return EXIT_TERMINATED
        return cli_main(argv)
