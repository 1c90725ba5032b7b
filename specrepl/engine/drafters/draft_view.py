"""Which tokens of the sequence a model drafter's runtime holds, and a handover's plan.

A model drafter does not always hold the sequence's prefix: a window on what
it reads skips most of a pasted document, and a copy of the target holding a
long chat keeps its start and its last positions. `DraftView` records which
sequence positions the runtime's keys and values stand for; `Handover` is the
plan of one handover of the target's keys and values.

This module knows nothing about runtimes, drafting or settings.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["SINK_TOKENS", "DraftView", "Handover"]

SINK_TOKENS = 4
"""Tokens from the sequence's start a windowed view always holds."""


class DraftView:
    """Which tokens of the sequence the drafter's cache holds.

    A windowed drafter does not read every token: after a long unseen stretch
    (a pasted document) it reads only the stretch's last `window` tokens. Its
    cache then holds spans of the sequence laid end to end at consecutive
    positions (StreamingLLM-like: the start of the chat, then recent text);
    the keys and values of a span depend only on the spans before it, so the
    tokens skipped in between may change without harm. Without a window the
    view is the sequence's prefix, one span.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []  # [start, end) in the sequence
        self.tokens: list[int] = []  # what the cache holds, in order

    @property
    def covered(self) -> int:
        """Sequence positions up to which the view accounts for the text."""
        return self.spans[-1][1] if self.spans else 0

    def cut_view(self, length: int) -> None:
        """Keep the first `length` held tokens."""
        kept: list[tuple[int, int]] = []
        left = length
        for start, end in self.spans:
            if left <= 0:
                break
            take = min(end - start, left)
            kept.append((start, start + take))
            left -= take
        self.spans = kept
        del self.tokens[length:]

    def held_before(self, position: int) -> int:
        """How many held tokens come from sequence positions before `position`."""
        count = 0
        for start, end in self.spans:
            if start >= position:
                break
            count += min(end, position) - start
        return count

    def agreeing(self, ids: list[int]) -> int:
        """Held tokens (from the first) whose sequence positions still hold them in `ids`."""
        count = 0
        for start, end in self.spans:
            for position in range(start, end):
                if position >= len(ids) or ids[position] != self.tokens[count]:
                    return count
                count += 1
        return count

    def extend(self, start: int, tokens: list[int]) -> None:
        """The cache read `tokens`, found at sequence positions from `start`."""
        if not tokens:
            return
        if self.spans and self.spans[-1][1] == start:
            self.spans[-1] = (self.spans[-1][0], start + len(tokens))
        else:
            self.spans.append((start, start + len(tokens)))
        self.tokens.extend(tokens)

    def drop(self, after: int, count: int) -> None:
        """The cache no longer holds its tokens `after`..`after + count - 1`
        (a window sliding on: the oldest of its recent positions)."""
        if not 0 <= after <= after + count <= len(self.tokens):
            raise ValueError(f"cannot drop {count} of {len(self.tokens)} held tokens after {after}")
        kept: list[tuple[int, int]] = []
        index = 0  # of the span's first held token
        for start, end in self.spans:
            first = min(max(after - index, 0), end - start)  # this span's held before the drop
            last = min(max(after + count - index, 0), end - start)  # ... and after it
            for piece in ((start, start + first), (start + last, end)):
                if piece[0] == piece[1]:
                    continue
                if kept and kept[-1][1] == piece[0]:
                    kept[-1] = (kept[-1][0], piece[1])
                else:
                    kept.append(piece)
            index += end - start
        self.spans = kept
        del self.tokens[after : after + count]


class Handover(NamedTuple):
    """A handover of the target's keys and values: its positions start..count-1
    written after the first `keep` positions the copy holds, once the `drop`
    held after its first `SINK_TOKENS` are let go (a window sliding on; what
    follows them stays where it is)."""

    start: int
    count: int
    keep: int
    drop: int = 0
