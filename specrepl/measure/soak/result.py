"""What a soak measured: counts, memory samples, mismatches, the verdict; and how
the process's resident memory is read.

Plain figures: this module knows nothing about models or sessions.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MIB", "Mismatch", "SoakResult", "resident_bytes"]

MIB = 2**20


@dataclass(frozen=True)
class Mismatch:
    """A live answer that a fresh session did not repeat.

    `what` is the generator whose tokens differ, "runs" (different generators
    ran, or one refused), "history" (the sessions ended with different
    histories) or "lossless" (greedy speculative tokens differ from the
    target's).
    """

    prompt_index: int
    prompt: str
    what: str
    settings: dict[str, Any]
    expected: list[int]
    got: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SoakResult:
    """What a soak saw: counts, memory samples and every mismatch.

    Memory figures are bytes. `rss_samples[i]` is the RSS after prompt i + 1;
    `rss_start` is before the first prompt. The growth figures are measured
    from the sample after the `warmup` first prompts, when the allocators have
    reached their working size; `growth_limit` is the most growth allowed.
    """

    prompts: int = 0
    compared: int = 0
    skipped: int = 0
    refusals: int = 0
    resets: int = 0
    warmup: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    rss_start: int = 0
    rss_samples: list[int] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    growth_limit: int | None = None

    @property
    def rss_after_warmup(self) -> int | None:
        if len(self.rss_samples) < max(self.warmup, 1):
            return None
        return self.rss_samples[self.warmup - 1] if self.warmup else self.rss_start

    @property
    def rss_end(self) -> int | None:
        return self.rss_samples[-1] if self.rss_samples else None

    @property
    def growth(self) -> int | None:
        """RSS at the end minus RSS after the warm-up (None if the warm-up did not end)."""
        start, end = self.rss_after_warmup, self.rss_end
        return None if start is None or end is None else end - start

    @property
    def max_growth(self) -> int | None:
        """The highest RSS after the warm-up, minus RSS after the warm-up."""
        start = self.rss_after_warmup
        if start is None:
            return None
        return max(self.rss_samples[self.warmup :], default=start) - start

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.interrupted

    @property
    def grew_too_much(self) -> bool:
        """The RSS grew more than `growth_limit` after the warm-up."""
        limit, growth = self.growth_limit, self.growth
        return limit is not None and growth is not None and growth > limit

    @property
    def passed(self) -> bool:
        """The verdict: every prompt answered, no mismatch, the memory within its limit."""
        return self.ok and not self.grew_too_much

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "compared": self.compared,
            "skipped": self.skipped,
            "refusals": self.refusals,
            "resets": self.resets,
            "warmup": self.warmup,
            "interrupted": self.interrupted,
            "seconds": self.seconds,
            "rss_start": self.rss_start,
            "rss_after_warmup": self.rss_after_warmup,
            "rss_end": self.rss_end,
            "growth": self.growth,
            "max_growth": self.max_growth,
            "rss_samples": self.rss_samples,
            "mismatches": [mismatch.to_dict() for mismatch in self.mismatches],
        }


def resident_bytes() -> int:
    """The process's resident set size now.

    Read from /proc/self/statm (Linux). Elsewhere the peak RSS from
    `getrusage` is the best the standard library offers: it can show growth
    but never a shrink. 0 where neither exists.
    """
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere
