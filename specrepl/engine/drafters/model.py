"""The model drafter: a causal LM (smaller, or a cheaper copy of the target) over a draft runtime.

`ModelDrafter` is the one drafter that runs a model, whatever runs it: a
`draft_runtime.DraftRuntime` (torch: `TorchDraftRuntime`; llama.cpp:
`llamacpp.LlamaCppDraftRuntime`) feeds it tokens and gives the logits after
the last. Everything else is the drafter's own and the same in every runtime:
which tokens the runtime holds (`draft_view.DraftView`), how much of a long
unseen stretch it reads (`window`), and, for a copy of the target, when it
takes the target's keys and values instead of reading (an
`draft_runtime.Importer`, weighed against the measured cost of a read) and
how much of a long chat it holds (`held_window`, where the importer can move
positions). `is_copy_of` says whether a model holds the target's weights;
`as_drafter` wraps a bare model passed to the library API.

This module knows nothing of the other kinds of drafter, of llama.cpp, of how
runtimes are chosen or of settings.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.drafters.base import Draft, Drafter, collect_draft, next_draft
from specrepl.engine.drafters.draft_runtime import (
    DraftRuntime,
    Importer,
    TorchDraftRuntime,
    TorchImporter,
)
from specrepl.engine.drafters.draft_view import SINK_TOKENS, DraftView, Handover
from specrepl.engine.drafters.head_store import target_fingerprint
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer
from specrepl.engine.tuning import Tuning

__all__ = ["ModelDrafter", "as_drafter", "is_copy_of"]

NO_HANDOVER = Handover(0, 0, 0)


def is_copy_of(model: PreTrainedModel, target: PreTrainedModel) -> bool:
    """Whether `model` holds the target's own weights (in any precision: the
    same fingerprint) on one device, so that it can take the target's keys and
    values (see `ModelDrafter`'s `copy_of_target`)."""
    devices = set(getattr(model, "hf_device_map", {}).values())
    return len(devices) <= 1 and target_fingerprint(model) == target_fingerprint(target)


class ModelDrafter(Drafter):
    """Drafts with a model over a `DraftRuntime` (a transformers model is run in torch).

    Each `propose` brings the runtime to the sequence (keeping what it already
    holds, feeding the rest in one pass), then drafts up to k tokens, feeding
    each but the last back. `update` cuts back to the tokens verification
    kept. With `keep_between_prompts` a new generation keeps what it shares
    with the last one (a chat); otherwise it starts empty. `use_cache` and
    `tuning` are for a transformers model (`TorchDraftRuntime`; without a
    cache every pass reads the whole sequence again).

    `window` bounds one read: of a longer unseen stretch only the last
    `window` tokens are read (`DraftView`, after the sequence's first
    `SINK_TOKENS`), so a pasted document costs the drafter a short read while
    the target reads all of it (the output does not change: the target
    verifies). None reads everything. Several drafters may share one runtime:
    each checks its view against what the runtime says it holds.

    A copy of the target (`copy_of_target` with a transformers model and a
    cache: `TorchImporter`; or an `importer` for another runtime) sees
    everything and reads almost nothing: it asks for the target's cache
    (`uses_target_cache`), and before drafting after an unseen stretch it
    takes the target's keys and values for it, where that is expected to cost
    less than reading it (`import_pays`: the importer's measured seconds per
    position against `read_seconds_per_token`, the batched read timed when
    the runtime was chosen and after every read; None: always). Where the
    importer appends, only the positions after those it holds are written (a
    chat's new turn), else the whole sequence. It then reads only the last
    token. The read window does not apply; `held_window` (default: the
    importer's own, for one that `windows`) bounds instead what the copy
    holds, so that attention over a long chat does not make every draft
    dear: a handover that would leave it holding more keeps the sequence's
    first `SINK_TOKENS` and the last `held_window` positions, where the
    target holds them, letting the oldest it held go (the window slides on)
    or, past a long unseen stretch, taking the window anew. The first step
    of a generation is the target's own prompt pass, so a copy has the
    target's keys and values before it drafts.
    """

    def __init__(
        self,
        runtime: DraftRuntime | PreTrainedModel,
        *,
        use_cache: bool = True,
        tuning: Tuning | None = None,
        name: str = "model",
        window: int | None = None,
        keep_between_prompts: bool = False,
        copy_of_target: bool = False,
        importer: Importer | None = None,
        read_seconds_per_token: float | None = None,
        held_window: int | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        if isinstance(runtime, PreTrainedModel):
            runtime = TorchDraftRuntime(runtime, tuning=tuning, use_cache=use_cache)
            if copy_of_target and importer is None and use_cache:
                importer = TorchImporter(runtime)
        self.runtime = runtime
        self.importer = importer
        self.read_seconds_per_token = read_seconds_per_token
        self.uses_target_cache = importer is not None
        self.uses_target_features = False
        self._target_cache: Any = None  # the target's, between `update` and the next draft
        self.window = None if importer is not None else window
        if importer is None or not importer.windows:
            held_window = None
        elif held_window is None:
            held_window = getattr(importer, "held_window", None)  # measured at its probe
        self.held_window = held_window
        self.name = name
        self.width = runtime.width
        self.vocab_size = self.width
        self.context = runtime.context
        self.keep_between_prompts = keep_between_prompts
        self.view = DraftView()
        self._last_read: tuple[torch.Tensor | None, list[int]] = (None, [])
        self.allowed: torch.Tensor | None = None
        """Where set, the only ids a draft may hold (a drafter with another
        tokenizer samples among the tokens both vocabularies share)."""

    @property
    def model(self) -> Any:
        """What the runtime runs (a transformers model, a llama.cpp binding)."""
        return self.runtime.model

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.vocab_size = min(vocab_size, self.width)
        if not self.keep_between_prompts:
            self.forget()

    def forget(self) -> None:
        self._last_read = (None, [])
        self.runtime.forget()
        self.view = DraftView()
        self._target_cache = None

    def held(self) -> list[int]:
        """The tokens the runtime holds keys and values for."""
        return self.runtime.held()

    def _sync(self, ids: list[int]) -> None:
        """Cut the view to what the runtime still holds (another drafter may
        have used it) and to what `ids` still agrees with, the last token
        excepted (it is fed again for its logits)."""
        held = self.runtime.held()
        mine = self.view.tokens
        same = min(len(held), len(mine))
        if held[:same] != mine[:same]:
            same = next(i for i, (a, b) in enumerate(zip(held, mine, strict=False)) if a != b)
        self.view.cut_view(min(same, self.view.agreeing(ids)))
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
        self.runtime.cut(len(self.view.tokens))
        read = 0
        if not self.view.tokens and start > 0:
            sink = ids[: min(SINK_TOKENS, start)]
            self.runtime.feed(sink)
            self.view.extend(0, sink)
            read += len(sink)
        fresh = ids[start:]
        self.runtime.feed(fresh)
        self.view.extend(start, fresh)
        return read + len(fresh)

    def _room(self, ids: list[int], k: int) -> int:
        """Drafts that fit: the runtime reads the view plus k - 1 of its own drafts."""
        if not ids:
            return 0
        if self.context is None:
            return max(k, 0)
        unread = len(ids) - self._plan(ids)
        return max(0, min(k, self.context - (len(self.view.tokens) + unread) + 1))

    def _importable(self, ids: list[int]) -> Handover:
        """Which positions of `ids` to take from the target's cache before
        drafting (`Handover`; count 0: read instead). Everything but the last
        token, where the target's cache holds it, the stretch holds at least
        the importer's `fewest_positions`, and the write is expected to cost
        less than the read. Where the importer appends and the drafter holds a prefix of
        `ids` (or, with `held_window`, any view), only what follows it is
        written. With `held_window`, a handover that would leave the copy
        holding more than the window keeps the sequence's first
        `SINK_TOKENS` and its last `held_window` positions (`_windowed`)."""
        if self.importer is None or self._target_cache is None:
            return NO_HANDOVER
        count = min(self.importer.available(self._target_cache), len(ids) - 1)
        covered = self.view.covered
        unseen = count - covered
        if unseen < self.importer.fewest_positions:
            return NO_HANDOVER
        if self.held_window is not None:
            held = len(self.view.tokens)
            if held + unseen > SINK_TOKENS + self.held_window:
                return self._windowed(count, unseen)
            start, keep = covered, held
        else:
            prefix = self.view.spans[:1] == [(0, covered)]
            start = covered if self.importer.appends and prefix else 0
            keep = start
        if not self.import_pays(count - start, unseen, append=start > 0):
            return NO_HANDOVER
        return Handover(start, count, keep)

    def _windowed(self, count: int, unseen: int) -> Handover:
        """The handover that leaves the copy holding the sequence's first
        `SINK_TOKENS` and the target's last `held_window` of `count`
        positions: where the copy holds the sinks and, after them, a
        stretch that reaches into the new window, it lets that stretch's
        older positions go and takes only what follows it; else it keeps the
        sinks (where held) and takes the whole window."""
        assert self.held_window is not None
        start = max(SINK_TOKENS, count - self.held_window)
        spans = self.view.spans
        first = spans[0] if spans else (0, 0)
        keep = SINK_TOKENS if first[0] == 0 and first[1] >= SINK_TOKENS else 0
        recent = None  # the stretch held after the sinks
        if keep and len(spans) == 1:
            recent = (SINK_TOKENS, first[1])
        elif keep and len(spans) == 2 and first == (0, SINK_TOKENS):
            recent = spans[1]
        if recent is not None and recent[0] <= start <= recent[1]:
            if not self.import_pays(count - recent[1], unseen, append=True):
                return NO_HANDOVER
            return Handover(recent[1], count, SINK_TOKENS + recent[1] - start, start - recent[0])
        written = count - start + (SINK_TOKENS - keep)
        if not self.import_pays(written, unseen, append=keep > 0):
            return NO_HANDOVER
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

    def _host_ids(self, sequence: torch.Tensor) -> list[int]:
        """`sequence` as host integers, read from its device once a step (the
        loop hands `offers` and `propose` the same tensor, never changed in place)."""
        seen, ids = self._last_read
        if seen is not sequence or len(ids) != sequence.shape[0]:
            ids = sequence.tolist()
            self._last_read = (sequence, ids)
        return ids

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        ids = self._host_ids(sequence)
        self._sync(ids)
        start = max(self._plan(ids), self._importable(ids)[1])
        return [Offer(self.name, self._room(ids, k), len(ids) - start)]

    def _import(self, ids: list[int]) -> tuple[int, float]:
        """Take the target's keys and values where that pays (`_importable`);
        returns the positions written and the seconds taken."""
        start, count, keep, drop = self._importable(ids)
        if count <= 0:
            return 0, 0.0
        importer = self.importer
        assert importer is not None
        if not importer.windows:
            return self._import_prefix(ids, start, count)
        written, seconds = 0, 0.0
        try:
            if drop:  # the window slides on: its oldest positions go
                importer.drop(SINK_TOKENS, drop)
                self.view.drop(SINK_TOKENS, drop)
            if 0 == keep < start:  # the first handover of a window: the sinks first
                keep = min(SINK_TOKENS, start)
                seconds += importer.write(self._target_cache, keep, ids)
                written += keep
                self.view = DraftView()
                self.view.extend(0, ids[:keep])
            seconds += importer.append(self._target_cache, start, count, ids, held=keep)
        except RuntimeError:  # the runtime refused: it holds its first `keep`, read the rest
            keep = min(keep, len(self.runtime.held()))
            self.view.cut_view(keep)
            self.runtime.cut(keep)
            return 0, 0.0
        self.view.cut_view(keep)
        self.view.extend(start, ids[start:count])
        return written + count - start, seconds

    def _import_prefix(self, ids: list[int], start: int, count: int) -> tuple[int, float]:
        """`_import` for an importer that writes the sequence's prefix only."""
        assert self.importer is not None
        try:
            if start > 0:
                seconds = self.importer.append(self._target_cache, start, count, ids)
            else:
                seconds = self.importer.write(self._target_cache, count, ids)
        except RuntimeError:  # the runtime refused: it holds the first `start`, read the rest
            self.view.cut_view(start)
            self.runtime.cut(start)
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
        ids = self._host_ids(sequence)
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
            logits = self.runtime.last_logits(self.vocab_size, sequence.device)
            token = self._next(logits, processor, generator, min_confidence, laws)
            if token is None:
                break
            tokens.append(token)
            if index + 1 < k:
                value = int(token)  # read to feed it back: one read a draft
                if value in self.end_tokens:
                    break  # nothing after the answer's end is kept
                self.runtime.feed([value])
                self.view.extend(len(ids) + index, [value])
        return replace(
            collect_draft(tokens, laws, sequence),
            read_seconds=read_seconds,
            read_tokens=read,
            import_seconds=import_seconds,
            imported_tokens=imported,
        )

    def _next(
        self,
        logits: torch.Tensor,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float,
        laws: list[torch.Tensor],
    ) -> torch.Tensor | None:
        """The next draft from `logits` (`next_draft`), among `allowed` where set."""
        if self.allowed is None:
            return next_draft(logits, processor, generator, min_confidence, laws)
        allowed = self.allowed.to(logits.device)
        allowed = allowed[allowed < logits.shape[-1]]
        return next_draft(
            logits[allowed], processor, generator, min_confidence, laws,
            token_ids=allowed, vocab_size=int(logits.shape[-1]),
        )  # fmt: skip

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: Any = None,
    ) -> None:
        self.view.cut_view(self.view.held_before(valid_length))
        self.runtime.cut(len(self.view.tokens))
        # read at the next `propose`, before the target's next forward changes it
        self._target_cache = target_cache if self.importer is not None else None


def as_drafter(drafter: Drafter | PreTrainedModel, *, use_cache: bool = True) -> Drafter:
    """Wrap a bare model as a ModelDrafter; pass Drafter objects through."""
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter, use_cache=use_cache)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(
        f"a drafter must be a transformers causal LM or a Drafter, got {type(drafter).__name__}"
    )
