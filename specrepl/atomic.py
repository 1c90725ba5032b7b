"""Files written whole or not at all.

Every file specrepl keeps (model markers, width plans, draft heads, training
checkpoints, benchmark and soak reports) is written to a temporary file next
to its destination and renamed over it, so a reader, a crash, Ctrl-C or
SIGTERM never leaves half of one behind, and the temporary file is removed
whatever happens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["temporary_name", "write_atomically", "write_text_atomically"]


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
