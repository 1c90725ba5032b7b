"""A llama.cpp target's keys and values handed to a llama.cpp copy of it.

`llamacpp_kv` hands a torch target's keys and values to the copy drafting in
llama.cpp. When the target itself runs in llama.cpp
(`engine.llamacpp_runtime`), its context already holds them in llama.cpp's
own layout, so `StateImporter` moves them from one context to the other
through llama.cpp's sequence-state API, unconverted. Both contexts keep
float32 keys and values (the target's must, for exactness) and two
sequences: the target marks the positions to hand over into its second
sequence (`llama_memory_seq_cp`, which copies nothing), the state of that
sequence holds only them, and the copy writes it into its own second
sequence and joins it to its first. A step then costs the new positions, not
the whole context.

The copy drafts in a context of its own (`StateImporter.llama`: the copy's
GGUF file opened again, float32 keys and values, two sequences), not in the
drafter runtime's, whose cache holds float16 keys and values. Every position
is written where the target holds it: a copy holding a window of a long chat
(its start, a gap, then its last positions) keeps the window's keys as the
target rotated them, and slides it on by letting its oldest positions go
(`drop`), so that no key is rotated again and nothing is written twice (a
move would make llama.cpp rotate every cell of the context at the next pass).
`probe_state_importer` checks on random tokens that the copy, after a
handover (whole, then appended), predicts what it predicts after reading for
itself; any failure gives no importer, with the reason, and the copy reads as
before. The probe also times handing over one, two and three positions
against reading them in the pass the copy runs anyway for the last token's
logits (`measure_fewest_positions`): where a wider pass costs more than the
handover, even the one drafted token a step that the copy has not read (all
drafts kept) is taken from the target. The output never depends on this: the
target verifies every draft.

This module knows nothing about drafting policies, torch targets or settings.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from specrepl.engine.drafters.draft_runtime import learn_append_cost
from specrepl.engine.drafters.llamacpp import held_positions
from specrepl.engine.drafters.llamacpp_kv import cosine, last_logits
from specrepl.engine.llamacpp import LlamaCppUnavailable, import_llamacpp, open_gguf

__all__ = [
    "SequenceStates",
    "StateImporter",
    "fewest_worth_handing_over",
    "probe_state_importer",
]

PROBE_TOKENS = 24
MIN_AGREEMENT = 0.99
"""Cosine between the copy's logits after a handover and after its own reading."""

HELD_PROBE = 2048
"""Positions the copy holds when the cost of its attention is timed."""

ATTENTION_SHARE = 0.5
"""A copy holding a long chat drafts with a window (`held_window`): it keeps
as many positions as make its attention cost this share of the rest of its
one-token step (both measured), so that a long context does not make its
drafts dear (docs/runtimes.md says how the share was chosen). Its attention
costs what the target's does (the same layers, heads and float32 keys and
values), while the rest is its cheap 4-bit pass."""

MIN_HELD_WINDOW = 256
"""The fewest positions a windowed copy holds (besides the chat's start)."""

SHORT_STRETCHES = 3
"""The longest stretch whose handover the probe times against reading it in
the drafting pass (beside the last token, which the copy reads anyway for its
logits). Past it the drafter's batched read rate decides (`import_pays`)."""

TIMING_REPEATS = 3
"""Timed passes (after one to warm up) of which the least is taken."""


class SequenceStates(Protocol):
    """What a target runtime gives the importer (`LlamaCppRuntime` does)."""

    @property
    def length(self) -> int: ...

    def sequence_state(self, start: int, count: int) -> tuple[Any, int]:
        """llama.cpp's state of positions start..count-1 (a buffer and its size)."""
        ...


class StateImporter:
    """Writes a llama.cpp target's keys and values into the copy's context `llama`.

    `write` makes the copy hold the first `count` positions; `append` keeps
    the first `start` it holds and adds start..count-1; `drop` lets held
    positions go. Writes are timed at every call (`seconds_per_position`,
    `append_seconds` beyond the positions) so that the drafter
    (`model.ModelDrafter`) can weigh a handover against a read. Where the
    copy's tokens sit is the binding's `llamacpp.held_positions` record,
    which its draft runtime feeds by.
    """

    appends = True
    windows = True
    """`append(..., held=)` can put the target's positions after a gap, and
    `drop` lets go of held ones: the copy can hold a window of a long chat."""
    fewest_positions = SHORT_STRETCHES + 1
    """Until `measure_fewest_positions` times them: no short stretch is handed over."""

    def __init__(self, llama: Any, *, seconds_per_position: float) -> None:
        self.llama = llama
        self.positions = held_positions(llama)
        self.seconds_per_position = seconds_per_position
        self.held_window: int | None = None
        """Positions a windowed copy holds (`measure_held_window`; None: all)."""
        self.append_seconds = 0.0
        self._library = import_llamacpp()
        self._memory = self._library.llama_get_memory(llama.ctx)

    def available(self, target: SequenceStates) -> int:
        """Positions the target holds."""
        return target.length

    def estimate(self, count: int) -> float:
        return count * self.seconds_per_position

    def estimate_append(self, positions: int) -> float:
        return self.append_seconds + positions * self.seconds_per_position

    def write(self, target: SequenceStates, count: int, tokens: list[int]) -> float:
        """Make the copy hold `tokens[:count]` from the target's keys and values."""
        self._check(target, 0, count, tokens)
        started = time.perf_counter()
        self.llama.n_tokens = 0
        self.positions.cut(0)
        self._library.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self._set(target, 0, count, 0)
        self.llama.input_ids[:count] = tokens[:count]
        self.llama.n_tokens = count
        seconds = time.perf_counter() - started
        if count >= PROBE_TOKENS:  # a few positions time the call more than the positions
            self.seconds_per_position = 0.7 * self.seconds_per_position + 0.3 * seconds / count
        return seconds

    def append(
        self,
        target: SequenceStates,
        start: int,
        count: int,
        tokens: list[int],
        *,
        held: int | None = None,
    ) -> float:
        """Keep the copy's first `held` positions (default `start`: the copy
        holds `tokens[:start]`) and add the target's start..count-1 after
        them, where the target holds them. Where `held` differs from `start`
        (a window: what the copy holds is not the sequence's prefix) a gap
        is left after the first `held`; a copy already holding a gap before
        them must continue it. RuntimeError where llama.cpp refuses the
        state (the copy then holds its first `held`)."""
        self._check(target, start, count, tokens)
        held = start if held is None else held
        if start == 0 and held == 0:
            return self.write(target, count, tokens)
        positions = self.positions
        positions.cut(held)
        if positions.skipped and positions.position(held) != start:
            raise ValueError(
                f"positions {start}.. cannot follow the {held} held: the copy holds a gap before"
            )
        started = time.perf_counter()
        library = self._library
        library.llama_memory_seq_rm(self._memory, 0, positions.position(held), -1)
        self.llama.n_tokens = held
        try:
            self._set(target, start, count, 1)
        except RuntimeError:
            library.llama_memory_seq_rm(self._memory, 1, -1, -1)
            raise
        library.llama_memory_seq_cp(self._memory, 1, 0, -1, -1)
        library.llama_memory_seq_rm(self._memory, 1, -1, -1)
        if not positions.skipped and start != held:  # a gap here (else the one before goes on)
            positions.gap_at, positions.skipped = held, start - held
        end = held + count - start
        self.llama.input_ids[held:end] = tokens[start:count]
        self.llama.n_tokens = end
        seconds = time.perf_counter() - started
        learn_append_cost(self, count - start, seconds, long_stretch=PROBE_TOKENS)
        return seconds

    def drop(self, after: int, count: int) -> None:
        """Let the copy's held positions `after`..`after + count - 1` go; those
        after them stay where they are (a window sliding on). A copy holding
        a gap must drop right after it."""
        positions, held = self.positions, self.llama.n_tokens
        if not 0 <= after <= after + count <= held:
            raise ValueError(f"cannot drop {count} of {held} held positions after {after}")
        if positions.skipped and positions.gap_at != after:
            raise ValueError(f"the copy holds a gap after {positions.gap_at}, not {after}")
        if count == 0:
            return
        first = positions.position(after)
        self._library.llama_memory_seq_rm(self._memory, 0, first, first + count)
        ids = self.llama.input_ids
        ids[after : held - count] = ids[after + count : held].copy()
        self.llama.n_tokens = held - count
        positions.gap_at, positions.skipped = after, positions.skipped + count

    def measure_held_window(self, target: SequenceStates, tokens: list[int]) -> str:
        """Time the copy's one-token step holding `PROBE_TOKENS` positions and
        holding `HELD_PROBE` (the target's `PROBE_TOKENS` written again and
        again at later positions: the cost of attention does not depend on
        what the keys hold), set `held_window` from the two, and say so."""
        short = self._pass_seconds(tokens[PROBE_TOKENS:], repeats=7)
        held = PROBE_TOKENS
        limit = min(HELD_PROBE, int(self.llama.n_ctx()) - 2 * PROBE_TOKENS)
        while held + PROBE_TOKENS <= limit:
            self._stack(target, held)
            held += PROBE_TOKENS
        long = self._pass_seconds(tokens[PROBE_TOKENS:], repeats=7)
        self.llama.n_tokens = 0
        self._library.llama_memory_seq_rm(self._memory, 0, -1, -1)
        if held < 4 * PROBE_TOKENS:
            return "holds the whole chat (its context is too short to time its attention)"
        per_position = (long - short) / (held - PROBE_TOKENS)
        rest = short - PROBE_TOKENS * per_position
        if per_position <= 0 or rest <= 0:
            return "holds the whole chat (its attention cost too little to time)"
        self.held_window = max(MIN_HELD_WINDOW, int(ATTENTION_SHARE * rest / per_position))
        return (
            f"holds the chat's start and its last {self.held_window} positions"
            f" (a step: {rest * 1e3:.1f} ms + {per_position * 1e6:.1f} us a held position)"
        )

    def measure_fewest_positions(self, target: SequenceStates, tokens: list[int]) -> str:
        """Time the copy's passes of 1 to `SHORT_STRETCHES` + 1 of `tokens`
        after what it holds and handovers of 1 to `SHORT_STRETCHES` of the
        target's positions there, set `fewest_positions`
        (`fewest_worth_handing_over`) and say so. The target holds at least
        `PROBE_TOKENS` of `tokens`."""
        held = PROBE_TOKENS - SHORT_STRETCHES
        self.write(target, held, tokens)
        reads = [
            self._pass_seconds(tokens[held : held + width])
            for width in range(1, SHORT_STRETCHES + 2)
        ]
        handovers = []
        for count in range(1, SHORT_STRETCHES + 1):
            times = [
                self.append(target, held, held + count, tokens) for _ in range(TIMING_REPEATS + 1)
            ]
            handovers.append(min(times[1:]))
        self.llama.n_tokens = 0
        self.positions.cut(0)
        self._library.llama_memory_seq_rm(self._memory, 0, -1, -1)
        self.fewest_positions = fewest_worth_handing_over(reads, handovers)
        if self.fewest_positions > SHORT_STRETCHES:
            return (
                f"reads stretches of up to {SHORT_STRETCHES} positions itself"
                f" (one beside the last token: {1e3 * (reads[1] - reads[0]):.1f} ms more,"
                f" handed over: {1e3 * handovers[0]:.1f} ms)"
            )
        shortest = self.fewest_positions
        return (
            f"takes even {shortest} position{'s' if shortest > 1 else ''} from the target"
            f" ({1e3 * handovers[shortest - 1]:.1f} ms, against"
            f" {1e3 * (reads[shortest] - reads[0]):.1f} ms to read beside the last token)"
        )

    def _pass_seconds(self, tokens: list[int], repeats: int = TIMING_REPEATS) -> float:
        """Seconds of one pass of `tokens` after what the copy holds: the
        least of `repeats` after one to warm up (it applies any moved
        positions), as other work on the machine only adds."""
        held = self.llama.n_tokens
        times = []
        for _ in range(repeats + 1):
            self.llama.n_tokens = held
            started = time.perf_counter()
            self.llama.eval(tokens)
            times.append(time.perf_counter() - started)
        self.llama.n_tokens = held
        return min(times[1:])

    def _stack(self, target: SequenceStates, held: int) -> None:
        """The target's first `PROBE_TOKENS` positions once more after the
        `held` the copy holds, moved there (llama.cpp rotates their keys): only
        to time attention over many positions, whatever they hold."""
        library = self._library
        library.llama_memory_seq_rm(self._memory, 0, held, -1)
        self._set(target, 0, PROBE_TOKENS, 1)
        library.llama_memory_seq_add(self._memory, 1, 0, PROBE_TOKENS, held)
        library.llama_memory_seq_cp(self._memory, 1, 0, -1, -1)
        library.llama_memory_seq_rm(self._memory, 1, -1, -1)
        self.llama.n_tokens = held + PROBE_TOKENS

    def _check(self, target: SequenceStates, start: int, count: int, tokens: list[int]) -> None:
        if not 0 <= start < count or target.length < count or len(tokens) < count:
            raise ValueError(
                f"cannot hand over positions {start}..{count - 1} from {target.length} held"
            )

    def _set(self, target: SequenceStates, start: int, count: int, sequence: int) -> None:
        state, size = target.sequence_state(start, count)
        read = self._library.llama_state_seq_set_data(self.llama.ctx, state, size, sequence)
        if read != size:
            if sequence == 0:
                self.llama.n_tokens = 0
            raise RuntimeError(f"llama.cpp took {read} of {size} bytes of keys and values")


def fewest_worth_handing_over(reads: list[float], handovers: list[float]) -> int:
    """The shortest stretch worth taking from the target: the least `count`
    whose handover (`handovers[count - 1]`, seconds) costs less than reading
    it beside the last token, in one pass of `count` + 1 tokens instead of
    one (`reads[width - 1]`: a pass of `width` tokens); `len(handovers)` + 1
    where none does."""
    for count, seconds in enumerate(handovers, start=1):
        if seconds < reads[count] - reads[0]:
            return count
    return len(handovers) + 1


def _held_window(importer: StateImporter, runtime: SequenceStates, tokens: list[int]) -> str:
    """`measure_held_window` after a fresh handover of the probe, and what it found."""
    importer.write(runtime, PROBE_TOKENS, tokens)
    try:
        return importer.measure_held_window(runtime, tokens)
    except RuntimeError as error:  # llama.cpp refused to move positions
        importer.held_window = None
        return f"holds the whole chat (a window could not be made: {error})"


def probe_state_importer(
    path: Path,
    target: Any,
    *,
    context_length: int,
    threads: int,
    seed: int = 0,
) -> tuple[StateImporter | None, str]:
    """An importer into a new context of the copy's GGUF file at `path`, fed
    by runtimes of the llama.cpp `target` (a `LlamaCppModel`), or None, with
    the reason either way (see the module)."""
    library = import_llamacpp()
    if not hasattr(library, "llama_state_seq_set_data"):
        return None, "this llama-cpp-python has no sequence-state calls"
    try:
        llama = open_gguf(
            path,
            context_length=context_length,
            threads=threads,
            sequences=2,
            type_k=library.GGML_TYPE_F32,
            type_v=library.GGML_TYPE_F32,
        )
    except LlamaCppUnavailable as error:
        return None, f"the copy's context for the target's keys and values cannot open ({error})"
    vocab = min(int(llama.n_vocab()), int(target.width))
    tokens = np.random.default_rng(seed).integers(0, vocab, PROBE_TOKENS + 1).tolist()
    runtime = target.open()
    try:
        runtime.score(torch.tensor(tokens[:PROBE_TOKENS]), 1, target.width)
        llama.n_tokens = 0
        llama.eval(tokens)
        own = last_logits(llama)
        importer = StateImporter(llama, seconds_per_position=0.0)
        seconds = importer.write(runtime, PROBE_TOKENS, tokens)
        importer.seconds_per_position = seconds / PROBE_TOKENS
        llama.eval(tokens[PROBE_TOKENS:])
        whole = cosine(own, last_logits(llama))
        half = PROBE_TOKENS // 2
        importer.write(runtime, half, tokens)
        seconds = importer.append(runtime, half, PROBE_TOKENS, tokens)
        beyond = seconds - (PROBE_TOKENS - half) * importer.seconds_per_position
        importer.append_seconds = max(0.0, beyond)
        llama.eval(tokens[PROBE_TOKENS:])
        appended = cosine(own, last_logits(llama))
        if min(whole, appended) < MIN_AGREEMENT:
            return None, (
                "the copy predicts otherwise from the llama.cpp target's keys and values"
                f" (cosine {min(whole, appended):.3f})"
            )
        shortest = importer.measure_fewest_positions(runtime, tokens)
        held = _held_window(importer, runtime, tokens)
    except (RuntimeError, ValueError, OSError) as error:
        return None, f"the copy refused the llama.cpp target's keys and values ({error})"
    finally:
        llama.n_tokens = 0
    return importer, (
        "takes the llama.cpp target's keys and values, new positions only"
        f" (checked: cosine {min(whole, appended):.4f} on the probe); {shortest}; {held}"
    )
