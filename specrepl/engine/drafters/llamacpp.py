"""The drafter model run by llama.cpp on its own GGUF file, where that is cheaper.

A drafter only pays when one of its tokens costs a small share of a target
step. The embedded pair's drafter is a copy of the target (SmolLM2-135M has no
smaller sibling), and on a CPU torch runs that copy in bfloat16 at about 0.55
to 0.67 of a float32 target step: too dear to go far past 1.3x. The same
weights ship as a 4-bit GGUF file, and llama.cpp's kernels for it (8-bit
activations against 4-bit blocks) decode a token several times faster than
torch does, while agreeing with the float32 target on most greedy tokens. So
a drafter model that was loaded from a GGUF file can draft in llama.cpp,
while the target verifies in torch as before: the output is still exactly the
target's (the drafts' laws q are llama.cpp's softmax, as for any drafter).

`LlamaCppDrafter` implements the `Drafter` interface over llama.cpp's own KV
cache: the tokens it holds are the binding's record of what it evaluated, so
a rollback is a truncation and a chat's next turn re-uses the common prefix.
A prompt pass is compute-bound in llama.cpp as in torch, so a long unseen
stretch (a pasted document) is read only in part: `window` bounds one read
and `DraftView` keeps the spans the cache holds. Whether llama.cpp runs the
drafter at all, and the default window, are decided by measurement in
`runtime.py`; this module knows nothing of that choice or of settings.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import torch

from specrepl.engine.drafters.base import Draft, Drafter, collect_draft, next_draft
from specrepl.engine.drafters.llamacpp_kv import KvImporter
from specrepl.engine.drafters.llamacpp_state import StateImporter
from specrepl.engine.llamacpp import import_llamacpp
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["SINK_TOKENS", "DraftView", "Handover", "LlamaCppDrafter"]

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


class Handover(NamedTuple):
    """A handover of the target's keys and values: its positions start..count-1
    written after the first `keep` positions the copy holds."""

    start: int
    count: int
    keep: int


class LlamaCppDrafter(Drafter):
    """Drafts with a `llama_cpp.Llama` holding the drafter model's GGUF file.

    Each `propose` brings llama.cpp's state to the sequence (keeping what it
    already holds, feeding the rest in one batch), then drafts up to k tokens,
    feeding each but the last back. `update` cuts back to the tokens
    verification kept. With `keep_between_prompts` a new generation keeps
    what it shares with the last one (a chat); otherwise it starts empty.

    `window` bounds one read: of a longer unseen stretch only the last
    `window` tokens are read (`DraftView`), so a pasted document costs the
    drafter a short read while the target reads all of it (the output does not
    change: the target verifies). None reads everything. Several drafters may
    share one `Llama`: each checks its view against the binding's own record
    of what it holds.

    With an `importer` (the drafter is a copy of the target: `llamacpp_kv`
    for a torch target, `llamacpp_state` for a llama.cpp one)
    the drafter sees everything and reads almost nothing: it asks for the
    target's cache (`uses_target_cache`), and before drafting after an
    unseen stretch it takes the target's keys and values for it, where that
    is expected to cost less than reading it (`import_pays`: the importer's
    measured seconds per position against `read_seconds_per_token`, the
    batched read timed when the runtime was chosen and after every read).
    Where the importer appends, only the positions after those it holds are
    written (a chat's new turn), else the whole sequence. It then reads only
    the last token. The read window does not apply; `held_window` (default,
    for a llama.cpp target: `StateImporter.held_window`, measured) bounds instead
    what the copy holds: a handover that would leave it holding more than
    twice that keeps the first `SINK_TOKENS` and takes the last
    `held_window` positions after them, so that attention over a long chat
    does not make every draft dear.
    """

    def __init__(
        self,
        llama: Any,
        *,
        keep_between_prompts: bool = False,
        name: str = "model",
        window: int | None = None,
        importer: KvImporter | StateImporter | None = None,
        read_seconds_per_token: float | None = None,
        held_window: int | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        self._llama_cpp = import_llamacpp()
        self.importer = importer
        self.read_seconds_per_token = read_seconds_per_token
        self.uses_target_cache = importer is not None
        self._target_cache: Any = None  # the target's, between `update` and the next forward
        if importer is not None:
            window = None
        self.llama = llama
        self.name = name
        self.width = int(llama.n_vocab())
        self.vocab_size = self.width
        # the binding records tokens in an array of the context asked for, which
        # llama.cpp itself may round up
        self.context = min(int(llama.n_ctx()), len(llama.input_ids))
        self.keep_between_prompts = keep_between_prompts
        self.window = window
        if not isinstance(importer, StateImporter):
            held_window = None
        elif held_window is None:
            held_window = importer.held_window  # measured when the importer was probed
        self.held_window = held_window
        self.uses_target_features = False
        self.view = DraftView()

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.vocab_size = min(vocab_size, self.width)
        if not self.keep_between_prompts:
            self.forget()

    def forget(self) -> None:
        self.llama.n_tokens = 0  # the next evaluation drops every cached position
        self.view = DraftView()
        self._target_cache = None

    def held(self) -> list[int]:
        """The tokens llama.cpp holds keys and values for."""
        return [int(t) for t in self.llama.input_ids[: self.llama.n_tokens]]

    def _sync(self, ids: list[int]) -> None:
        """Cut the view to what llama.cpp still holds (another drafter may have
        used it) and to what `ids` still agrees with, the last token excepted
        (it is fed again for its logits)."""
        binding = self.llama.input_ids[: self.llama.n_tokens]
        mine = np.asarray(self.view.tokens[: len(binding)], dtype=binding.dtype)
        differ = np.flatnonzero(binding[: mine.shape[0]] != mine)
        held = int(differ[0]) if differ.size else mine.shape[0]
        self.view.cut_view(min(held, self.view.agreeing(ids)))
        self.view.cut_view(self.view.held_before(len(ids) - 1))

    def _plan(self, ids: list[int]) -> int:
        """Where the next read starts in `ids` (after `_sync`)."""
        start = self.view.covered
        if self.window is not None and len(ids) - start > self.window:
            start = len(ids) - self.window  # skip to the stretch's last `window` tokens
        return start

    def _read(self, ids: list[int]) -> int:
        """Hold the view of `ids`, with the logits after its last token; returns
        how many tokens were read. A view that skips part of the text keeps the
        sequence's first `SINK_TOKENS` tokens (the chat's start, where attention
        pools, as in StreamingLLM)."""
        self._sync(ids)
        start = self._plan(ids)
        self.llama.n_tokens = len(self.view.tokens)  # `eval` removes every position from here
        read = 0
        if not self.view.tokens and start > 0:
            sink = ids[: min(SINK_TOKENS, start)]
            self.llama.eval(sink)
            self.view.extend(0, sink)
            read += len(sink)
        fresh = ids[start:]
        self.llama.eval(fresh)
        self.view.extend(start, fresh)
        return read + len(fresh)

    def _logits(self, device: torch.device) -> torch.Tensor:
        pointer = self._llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        row = np.ctypeslib.as_array(pointer, shape=(self.width,))
        return torch.from_numpy(row[: self.vocab_size].copy()).to(device)

    def _room(self, ids: list[int], k: int) -> int:
        """Drafts that fit: llama.cpp reads the view plus k - 1 of its own drafts."""
        if not ids:
            return 0
        unread = len(ids) - self._plan(ids)
        return max(0, min(k, self.context - (len(self.view.tokens) + unread) + 1))

    def _importable(self, ids: list[int]) -> Handover:
        """Which positions of `ids` to take from the target's cache before
        drafting (`Handover`; count 0: read instead). Everything but the last
        token, where the target's cache holds it, the stretch is longer than the
        usual one or two tokens, and the write is expected to cost less than
        the read. Where the importer appends and the drafter holds a prefix of
        `ids` (or, with `held_window`, any view), only what follows it is
        written. With `held_window`, a handover that would leave the copy
        holding more than twice the window keeps the sequence's first
        `SINK_TOKENS` and takes its last `held_window` positions after them."""
        if self.importer is None or self._target_cache is None:
            return Handover(0, 0, 0)
        count = min(self.importer.available(self._target_cache), len(ids) - 1)
        covered = self.view.covered
        unseen = count - covered
        if unseen <= 2:
            return Handover(0, 0, 0)
        if self.held_window is not None:
            held = len(self.view.tokens)
            if held + unseen > SINK_TOKENS + 2 * self.held_window:
                start = max(SINK_TOKENS, count - self.held_window)
                first = self.view.spans[0] if self.view.spans else (0, 0)
                keep = SINK_TOKENS if first[0] == 0 and first[1] >= SINK_TOKENS else 0
                written = count - start + (SINK_TOKENS - keep)
                pays = self.import_pays(written, unseen, append=keep > 0)
                return Handover(start, count, keep) if pays else Handover(0, 0, 0)
            start, keep = covered, held
        else:
            prefix = self.view.spans[:1] == [(0, covered)]
            start = covered if self.importer.appends and prefix else 0
            keep = start
        if not self.import_pays(count - start, unseen, append=start > 0):
            return Handover(0, 0, 0)
        return Handover(start, count, keep)

    def import_pays(self, written: int, unseen: int, *, append: bool = False) -> bool:
        """Whether writing `written` positions (`append`: after those held) is
        expected to cost less than reading the `unseen` the drafter lacks
        (measured costs)."""
        if self.importer is None:
            return False
        if self.read_seconds_per_token is None:
            return True
        cost = self.importer.estimate_append(written) if append else self.importer.estimate(written)
        return cost < unseen * self.read_seconds_per_token

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        ids = sequence.tolist()
        self._sync(ids)
        start = max(self._plan(ids), self._importable(ids)[1])
        return [Offer(self.name, self._room(ids, k), len(ids) - start)]

    def _import(self, ids: list[int]) -> tuple[int, float]:
        """Take the target's keys and values where that pays (`_importable`);
        returns the positions written and the seconds taken."""
        start, count, keep = self._importable(ids)
        if count <= 0:
            return 0, 0.0
        importer = self.importer
        assert importer is not None
        if not isinstance(importer, StateImporter):
            return self._import_prefix(ids, start, count)
        written, seconds = 0, 0.0
        try:
            if 0 == keep < start:  # the first handover of a window: the sinks first
                keep = min(SINK_TOKENS, start)
                seconds += importer.write(self._target_cache, keep, ids)
                written += keep
                self.view = DraftView()
                self.view.extend(0, ids[:keep])
            seconds += importer.append(self._target_cache, start, count, ids, held=keep)
        except RuntimeError:  # llama.cpp refused: it holds its first `keep`, read the rest
            keep = min(keep, self.llama.n_tokens)
            self.view.cut_view(keep)
            self.llama.n_tokens = keep
            return 0, 0.0
        self.view.cut_view(keep)
        self.view.extend(start, ids[start:count])
        return written + count - start, seconds

    def _import_prefix(self, ids: list[int], start: int, count: int) -> tuple[int, float]:
        """`_import` for an importer that writes the sequence's prefix only."""
        assert self.importer is not None and not isinstance(self.importer, StateImporter)
        try:
            if start > 0:
                seconds = self.importer.append(self._target_cache, start, count, ids)
            else:
                seconds = self.importer.write(self._target_cache, count, ids)
        except RuntimeError:  # llama.cpp refused: it holds the first `start`, read the rest
            self.view.cut_view(start)
            self.llama.n_tokens = min(self.llama.n_tokens, start)
            return 0, 0.0
        self.view.cut_view(start)
        self.view.extend(start, ids[start:count])
        return count - start, seconds

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        ids = sequence.tolist()
        self._sync(ids)
        k = self._room(ids, k)
        if k <= 0:
            return Draft(sequence.new_empty(0), None)
        imported, import_seconds = self._import(ids)
        started = time.perf_counter()
        read = self._read(ids)
        read_seconds = time.perf_counter() - started
        if read > 2 and self.read_seconds_per_token is not None:
            per_token = read_seconds / read
            self.read_seconds_per_token = 0.7 * self.read_seconds_per_token + 0.3 * per_token
        tokens: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        for index in range(k):
            logits = self._logits(sequence.device)
            token = next_draft(logits, processor, generator, min_confidence, laws)
            if token is None:
                break
            tokens.append(token)
            if index + 1 < k:
                self.llama.eval([int(token)])
                self.view.extend(len(ids) + index, [int(token)])
        draft = collect_draft(tokens, laws, sequence)
        return replace(
            draft,
            read_seconds=read_seconds,
            read_tokens=read,
            import_seconds=import_seconds,
            imported_tokens=imported,
        )

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: Any = None,
    ) -> None:
        self.view.cut_view(self.view.held_before(valid_length))
        self.llama.n_tokens = min(self.llama.n_tokens, len(self.view.tokens))
        # read at the next `propose`, before the target's next forward changes it
        self._target_cache = target_cache if self.importer is not None else None
