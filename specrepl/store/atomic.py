"""Files written whole or not at all.

Every file specrepl keeps (model markers, width plans, draft heads, training
checkpoints, benchmark and soak reports) is written to a temporary file next
to its destination and renamed over it, so a reader, a crash, Ctrl-C or
SIGTERM never leaves half of one behind, and the temporary file is removed
whatever happens. A file that still does not read (a disk full before the
rename, a copy cut short by hand) is described by `unreadable` in the one
line that says it is made again.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["temporary_name", "unreadable", "write_atomically", "write_text_atomically"]


def temporary_name(path: Path) -> Path:
    """The hidden name next to `path` that a write goes to first (one per process)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Call `write` on a temporary file and rename it to `path`; on any failure
    or interruption the temporary file is removed and `path` is unchanged."""
    temporary = temporary_name(path)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomically(path: Path, text: str) -> None:
    """`path.write_text(text)` (UTF-8), written whole or not at all."""
    write_atomically(path, lambda file: file.write_text(text, encoding="utf-8"))


def unreadable(error: BaseException) -> str:
    """Why a file did not read, in a few words: the error's kind and first line."""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0][:120]}" if lines else type(error).__name__
