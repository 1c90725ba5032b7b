"""Device housekeeping: reading a clock after the device's queued work, and memory.

CUDA and MPS run kernels asynchronously, so a timer read right after a model
call measures the launch, not the work. Every timing in specrepl (the
generation clock, the forward-width timings, bench's runs) synchronizes
through `synchronize`, so all of them treat every device the same way.

`release_memory` gives back what dropped tensors held: unreachable objects
are collected, a GPU's cached blocks freed, and on Linux with glibc the C
heap trimmed. A model's many small tensors live on that heap, which glibc
keeps after they are freed: dropping the embedded bfloat16 drafter (~257 MiB)
gave back 54 MiB of resident memory without the trim and 184 MiB with it
(2-core AMD EPYC).

`available_memory` says how much more memory the system could give (the
loader asks before it makes a second copy of a model's weights).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["available_memory", "release_memory", "synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on `device` is done; nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def available_memory() -> int | None:
    """Bytes of memory the system could give now without swapping: Linux's
    `MemAvailable` (free memory plus caches it can drop), else the free pages
    where the C library tells them; None where neither is known."""
    try:
        for line in Path("/proc/meminfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def release_memory() -> None:
    """Give back what dropped objects held: collect unreachable ones, free a GPU's
    cached blocks, and trim the C heap where glibc can (`malloc_trim`)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where there is none (macOS, musl, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None
