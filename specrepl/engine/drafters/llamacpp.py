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

A prompt pass is compute-bound in llama.cpp as in torch, so a long unseen
stretch (a pasted document) is read only in part: `window` bounds one read,
chosen by default from measured costs (`auto_window`), and `DraftView` keeps
the spans the cache holds.

`choose_runtime` decides, for `runtime = "auto"`, by timing one decoding step
of each on this machine (never by a constant): llama.cpp when it is installed,
the drafter came from a GGUF file, runs on the CPU, and its step measured
cheaper than torch's. `LlamaCppDrafter` implements the `Drafter` protocol
over llama.cpp's own KV cache: the tokens it holds are the binding's record
of what it evaluated, so a rollback is a truncation and a chat's next turn
re-uses the common prefix.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from specrepl.engine.drafters.kinds import Draft, Drafter, collect_draft, next_draft
from specrepl.engine.drafters.llamacpp_kv import KvImporter, probe_importer
from specrepl.engine.drafters.options import DRAFTER_RUNTIMES, DrafterOptions
from specrepl.engine.kv_cache import cached_length
from specrepl.engine.llamacpp import LlamaCppUnavailable, import_llamacpp, open_gguf
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer
from specrepl.engine.widths import measure_widths, one_token_step

__all__ = [
    "MAX_CONTEXT",
    "DraftView",
    "LlamaCppDrafter",
    "RuntimeChoice",
    "auto_window",
    "choose_drafter_runtime",
    "choose_runtime",
    "llama_costs",
]

MAX_CONTEXT = 16384
"""The most tokens llama.cpp's cache holds (its keys and values are allocated
up front); past that the llama.cpp drafter drafts nothing, as any drafter at
its context's end, and the target goes on alone."""


READ_BUDGET_STEPS = 4.0
"""With an automatic window, one catch-up read of the llama.cpp drafter may cost
at most this many one-token target steps (measured costs on both sides): a
pasted document then delays drafting by about as much as four tokens of the
target, whatever the machine, while the target reads all of it."""

MIN_WINDOW = 32
"""The fewest unseen tokens an automatic window lets the drafter read at once."""

SINK_TOKENS = 4
"""Tokens from the sequence's start a windowed view always holds."""


def auto_window(target_step_seconds: float, read_seconds_per_token: float) -> int:
    """The most unseen tokens one read may take: `READ_BUDGET_STEPS` target steps'
    worth at the drafter's measured batched read cost, at least `MIN_WINDOW`."""
    if read_seconds_per_token <= 0:
        return MIN_WINDOW
    return max(MIN_WINDOW, int(READ_BUDGET_STEPS * target_step_seconds / read_seconds_per_token))


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

    With an `importer` (the drafter is a copy of the target, `llamacpp_kv`)
    the drafter sees everything and reads almost nothing: it asks for the
    target's cache (`uses_target_cache`), and before drafting after an
    unseen stretch it takes the target's keys and values for it, where that
    is expected to cost less than reading it (`import_pays`: the importer's
    measured seconds per position against `read_seconds_per_token`, the
    batched read timed when the runtime was chosen and after every read).
    It then reads only the last token. No window applies.
    """

    def __init__(
        self,
        llama: Any,
        *,
        keep_between_prompts: bool = False,
        name: str = "model",
        window: int | None = None,
        importer: KvImporter | None = None,
        read_seconds_per_token: float | None = None,
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

    def _importable(self, ids: list[int]) -> int:
        """How many leading tokens of `ids` to take from the target's cache
        before drafting (0: read instead). Everything but the last token, where
        the target's cache holds it, the stretch is longer than the usual
        one or two tokens, and the write is expected to cost less than the read."""
        if self.importer is None or self._target_cache is None:
            return 0
        count = min(cached_length(self._target_cache), len(ids) - 1)
        unseen = count - self.view.covered
        if unseen <= 2 or not self.import_pays(count, unseen):
            return 0
        return count

    def import_pays(self, count: int, unseen: int) -> bool:
        """Whether writing `count` positions is expected to cost less than
        reading the `unseen` of them the drafter lacks (measured costs)."""
        if self.importer is None:
            return False
        if self.read_seconds_per_token is None:
            return True
        return self.importer.estimate(count) < unseen * self.read_seconds_per_token

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        ids = sequence.tolist()
        self._sync(ids)
        start = max(self._plan(ids), self._importable(ids))
        return [Offer(self.name, self._room(ids, k), len(ids) - start)]

    def _import(self, ids: list[int]) -> tuple[int, float]:
        """Take the target's keys and values where that pays (`_importable`);
        returns the positions written and the seconds taken."""
        count = self._importable(ids)
        if count <= 0:
            return 0, 0.0
        assert self.importer is not None
        try:
            seconds = self.importer.write(self._target_cache, count, ids)
        except RuntimeError:  # llama.cpp refused: its cache is empty, read instead
            self.view = DraftView()
            return 0, 0.0
        self.view = DraftView()
        self.view.extend(0, ids[:count])
        return count, seconds

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


def llama_costs(
    llama: Any, *, context: int = 64, repeats: int = 5, seed: int = 0
) -> tuple[float, float]:
    """Median seconds of one decoding step after `context` tokens in llama.cpp
    (as `widths.measure_widths` times torch: the first repeat warms up), and
    seconds per token of reading `context` tokens in one batch. The state is
    emptied afterwards."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, int(llama.n_vocab()), (context + 1,), generator=generator).tolist()
    reads = []
    for _ in range(2):  # the first read warms up
        llama.n_tokens = 0
        start = time.perf_counter()
        llama.eval(tokens[:context])
        reads.append(time.perf_counter() - start)
    times = []
    for repeat in range(repeats + 1):
        llama.n_tokens = context
        start = time.perf_counter()
        llama.eval(tokens[context:])
        if repeat:
            times.append(time.perf_counter() - start)
    llama.n_tokens = 0
    return statistics.median(times), reads[-1] / context


@dataclass(frozen=True)
class RuntimeChoice:
    """What runs the drafter model: llama.cpp (`llama` set) or torch, and why."""

    llama: Any | None
    reason: str
    seconds: dict[str, float] = field(default_factory=dict)
    """Measured seconds of one drafting step, by runtime ("torch", "llamacpp"), and
    of reading one token in a batch in llama.cpp ("llamacpp_read")."""
    imports: dict[int, tuple[KvImporter | None, str]] = field(default_factory=dict, compare=False)
    """`probe_importer`'s verdict per target (by id): filled by `importer`."""

    @property
    def runtime(self) -> str:
        return "torch" if self.llama is None else "llamacpp"

    def describe(self) -> str:
        taken = f"; {self.import_reason}" if self.import_reason else ""
        return f"{'llama.cpp' if self.llama is not None else 'torch'}: {self.reason}{taken}"

    def model_drafter(
        self,
        options: DrafterOptions,
        target: PreTrainedModel | None = None,
        *,
        keep_between_prompts: bool = False,
        copy_of_target: bool = False,
    ) -> LlamaCppDrafter | None:
        """The drafter over llama.cpp to use in place of torch's (`build_drafter`'s
        `model_runtime`), or None when torch drafts: what every entry point (the
        REPL's session, bench) builds from the same drafter `options`.

        When the drafter is a copy of `target` (`copy_of_target`, with the
        cache on) and `probe_importer` accepts this llama.cpp, it takes the
        target's keys and values instead of reading (`LlamaCppDrafter`).
        Otherwise `options.window` > 0 bounds each read to that many tokens,
        and 0 chooses the bound from measured costs (`auto_window`: the
        target's one-token step against llama.cpp's batched read), or reads
        everything when the target's step is not known."""
        if self.llama is None:
            return None
        importer = None
        if copy_of_target and target is not None:
            importer = self.importer(target)
        step = None if target is None else one_token_step(target)
        return LlamaCppDrafter(
            self.llama,
            keep_between_prompts=keep_between_prompts,
            window=self.read_window(options.window, step),
            importer=importer,
            read_seconds_per_token=self.seconds.get("llamacpp_read"),
        )

    def importer(self, target: PreTrainedModel) -> KvImporter | None:
        """The importer of `target`'s keys and values, probed once per target."""
        key = id(target)
        if key not in self.imports:
            self.imports[key] = probe_importer(self.llama, target)
        return self.imports[key][0]

    @property
    def import_reason(self) -> str | None:
        """Whether the drafter takes the target's keys and values, and why (once probed)."""
        return next((reason for _, reason in self.imports.values()), None)

    def read_window(self, window: int, target_step_seconds: float | None) -> int | None:
        """The bound on one read of the llama.cpp drafter (None: none; see `model_drafter`)."""
        if window > 0:
            return window
        read = self.seconds.get("llamacpp_read")
        if target_step_seconds is None or read is None:
            return None
        return auto_window(target_step_seconds, read)


def choose_runtime(
    requested: str,
    model: PreTrainedModel,
    gguf: Path | None,
    *,
    threads: int | None = None,
) -> RuntimeChoice:
    """Where the drafter `model` (loaded from the GGUF file `gguf`, or None)
    drafts: "torch"; "llamacpp" (raises LlamaCppUnavailable saying why it
    cannot); or "auto": llama.cpp when it can run here, the model is on the
    CPU, and one decoding step measured cheaper there than in torch (both
    timed now, ~0.5 s once), else torch, with the reason."""
    if requested not in DRAFTER_RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(DRAFTER_RUNTIMES)}, got {requested!r}")
    if requested == "torch":
        return RuntimeChoice(None, "asked for")
    context = min(
        int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or MAX_CONTEXT),
        MAX_CONTEXT,
    )
    threads = threads or torch.get_num_threads()
    if requested == "llamacpp":
        llama = open_gguf(gguf, context_length=context, threads=threads)
        step, read = llama_costs(llama)
        return RuntimeChoice(llama, "asked for", {"llamacpp": step, "llamacpp_read": read})
    device = next(model.parameters()).device
    if device.type != "cpu":
        return RuntimeChoice(None, f"the drafter runs on {device.type}; llama.cpp here on the CPU")
    try:
        llama = open_gguf(gguf, context_length=context, threads=threads)
    except LlamaCppUnavailable as error:
        return RuntimeChoice(None, str(error))
    step, read = llama_costs(llama)
    seconds = {"llamacpp": step, "llamacpp_read": read, "torch": measure_widths(model, 1)[1]}
    ratio = seconds["llamacpp"] / seconds["torch"]
    if ratio < 1:
        return RuntimeChoice(llama, f"a step costs {ratio:.2f} of torch's, measured", seconds)
    return RuntimeChoice(None, f"llama.cpp's step measured {ratio:.2f}x torch's", seconds)


def choose_drafter_runtime(
    options: DrafterOptions, model: PreTrainedModel | None, gguf: Path | None
) -> RuntimeChoice | None:
    """What runs the drafter model for the drafter `options` describe (None
    when no model drafts): `choose_runtime` with `options.runtime`."""
    if not options.needs_model or model is None:
        return None
    return choose_runtime(options.runtime, model, gguf)
