"""One writer at a time: an exclusive lock on a small file in a directory.

A process that appends to a directory which another process could append to
at the same time (a `distill --data` directory's shards and manifest, a
training checkpoint) holds this lock while it writes. Two writers would
otherwise both take the next shard's name, and the manifest written last
would forget the other's shard.

The operating system drops the lock when its process ends, however it ends,
so a crash or a kill never leaves a directory locked. The lock file says who
holds it (what, process id, host, since when), for the message a second
writer gets; it is left in place (removing it could let a third process lock
a file the first no longer sees).

It knows nothing of what the directory holds or of the terminal.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

__all__ = ["Busy", "held_exclusively"]


class Busy(RuntimeError):
    """Another process holds the lock; the message says who and what to do."""


@contextmanager
def held_exclusively(path: Path, purpose: str) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created, with its folder, if absent)
    for the `with` block; Busy at once, without waiting, if another process
    holds it. `purpose` (e.g. "distill writing answers") is recorded in the
    file for that process's message."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+", encoding="utf-8")
    try:
        if not _try_lock(handle):
            raise Busy(_busy_message(path, _holder(handle)))
        handle.seek(0)
        handle.truncate()
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        handle.write(
            f"{purpose} (process {os.getpid()} on {socket.gethostname()}, since {since})\n"
        )
        handle.flush()
        yield
    finally:
        handle.close()  # closing the file releases the lock


def _busy_message(path: Path, holder: str) -> str:
    who = holder or "another process"
    return (
        f"{path.parent} is in use: {who}. Wait for it to end or stop it"
        f" (its progress is kept), then run this again"
    )


def _holder(handle: IO[str]) -> str:
    try:
        handle.seek(0)
        return handle.read().strip()
    except OSError:  # Windows refuses to read a locked region
        return ""


if sys.platform == "win32":
    import msvcrt

    def _try_lock(handle: IO[str]) -> bool:
        try:
            handle.seek(0)
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

else:
    import fcntl

    def _try_lock(handle: IO[str]) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
