"""What runs the drafter model: torch, llama.cpp on its GGUF file, or torch over a static cache.

`choose_runtime` decides, for `runtime = "auto"`, by timing one decoding step
of each candidate on this machine (never by a constant): on a CPU,
llama.cpp when it is installed, the drafter came from a GGUF file and its
step measured cheaper than torch's; on a GPU, the static runtime
(`static_runtime`, compiled) when its step measured cheaper than the eager
one. The `RuntimeChoice` it returns builds the model drafter over llama.cpp
(`llamacpp.llamacpp_drafter`) or the static runtime for the drafter
builder, with the bound on one read chosen from measured costs
(`auto_window`) and, for a copy of the target in llama.cpp, the importer of
the target's keys and values (`llamacpp_kv`, `llamacpp_state`).

This module knows nothing of settings or of the other kinds of drafter.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.drafters.draft_runtime import TorchDraftRuntime
from specrepl.engine.drafters.llamacpp import llamacpp_drafter
from specrepl.engine.drafters.llamacpp_kv import KvImporter, probe_importer
from specrepl.engine.drafters.llamacpp_state import StateImporter, probe_state_importer
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.options import DRAFTER_RUNTIMES, DrafterOptions
from specrepl.engine.llamacpp import LlamaCppUnavailable, open_gguf
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.static_runtime import StaticRuntimeRefused, StaticTorchModel
from specrepl.engine.widths import measure_widths

__all__ = [
    "MAX_CONTEXT",
    "MIN_WINDOW",
    "RuntimeChoice",
    "auto_window",
    "choose_drafter_runtime",
    "choose_runtime",
    "llama_costs",
    "static_or_eager",
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


def auto_window(target_step_seconds: float, read_seconds_per_token: float) -> int:
    """The most unseen tokens one read may take: `READ_BUDGET_STEPS` target steps'
    worth at the drafter's measured batched read cost, at least `MIN_WINDOW`."""
    if read_seconds_per_token <= 0:
        return MIN_WINDOW
    return max(MIN_WINDOW, int(READ_BUDGET_STEPS * target_step_seconds / read_seconds_per_token))


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
    """What runs the drafter model: llama.cpp (`llama` set), torch over a static
    cache (`static` set), or torch eagerly, and why."""

    llama: Any | None
    reason: str
    seconds: dict[str, float] = field(default_factory=dict)
    """Measured seconds of one drafting step, by runtime ("torch", "llamacpp",
    "static"), and of reading one token in a batch in llama.cpp ("llamacpp_read")."""
    static: StaticTorchModel | None = field(default=None, compare=False)
    imports: dict[int, tuple[KvImporter | StateImporter | None, str]] = field(
        default_factory=dict, compare=False
    )
    """`probe_importer`'s or `probe_state_importer`'s verdict per target (by
    id): filled by `importer` and `state_importer`."""

    @property
    def runtime(self) -> str:
        if self.static is not None:
            return "static"
        return "torch" if self.llama is None else "llamacpp"

    def describe(self) -> str:
        taken = f"; {self.import_reason}" if self.import_reason else ""
        name = {"llamacpp": "llama.cpp", "torch": "torch"}.get(self.runtime)
        if self.static is not None:
            name = f"torch, static cache{', compiled' if self.static.compiled else ''}"
        return f"{name}: {self.reason}{taken}"

    def model_drafter(
        self,
        options: DrafterOptions,
        target: PreTrainedModel | None = None,
        *,
        keep_between_prompts: bool = False,
        copy_of_target: bool = False,
        target_step_seconds: float | None = None,
        target_runnable: RunnableModel | None = None,
    ) -> ModelDrafter | None:
        """The drafter over llama.cpp to use in place of torch's, or None when
        torch drafts (`builder.build_drafter` asks, for every entry point).

        When the drafter is a copy of `target` (`copy_of_target`, with the
        cache on) and `probe_importer` accepts this llama.cpp, it takes the
        target's keys and values instead of reading (`llamacpp_drafter`). Where
        the target verifies in llama.cpp (`target_runnable`, a
        `LlamaCppModel`), the copy takes them from the target's context
        instead, drafting in a context of its own (`probe_state_importer`);
        another target that hands no keys and values leaves it reading.
        Otherwise `options.window` > 0 bounds each read to that many tokens,
        and 0 chooses the bound from measured costs (`auto_window`: the
        target's measured one-token step, `target_step_seconds`, against
        llama.cpp's batched read), or reads everything when the target's step
        is not known. Over a static runtime (`static`) the model drafts there,
        reading what it has not seen (it takes no keys and values)."""
        if self.static is not None:
            return ModelDrafter(
                TorchDraftRuntime(self.static),
                window=options.window or None,
                keep_between_prompts=keep_between_prompts,
            )
        if self.llama is None:
            return None
        importer: KvImporter | StateImporter | None = None
        llama = self.llama
        if copy_of_target and isinstance(target_runnable, LlamaCppModel):
            importer = self.state_importer(target_runnable)
            llama = llama if importer is None else importer.llama
        elif (
            copy_of_target
            and target is not None
            and (target_runnable is None or target_runnable.gives_key_values)
        ):
            importer = self.importer(target)
        return llamacpp_drafter(
            llama,
            keep_between_prompts=keep_between_prompts,
            window=self.read_window(options.window, target_step_seconds),
            importer=importer,
            read_seconds_per_token=self.seconds.get("llamacpp_read"),
        )

    def importer(self, target: PreTrainedModel) -> KvImporter | None:
        """The importer of `target`'s keys and values, probed once per target."""
        key = id(target)
        if key not in self.imports:
            self.imports[key] = probe_importer(self.llama, target)
        found = self.imports[key][0]
        return found if isinstance(found, KvImporter) else None

    def state_importer(self, target: LlamaCppModel) -> StateImporter | None:
        """The importer from runtimes of the llama.cpp `target`, probed once per target."""
        assert self.llama is not None
        key = id(target)
        if key not in self.imports:
            self.imports[key] = probe_state_importer(
                Path(self.llama.model_path),
                target,
                context_length=int(self.llama.n_ctx()),
                threads=int(self.llama.context_params.n_threads),
            )
        found = self.imports[key][0]
        return found if isinstance(found, StateImporter) else None

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
    context_length: int | None = None,
) -> RuntimeChoice:
    """Where the drafter `model` (loaded from the GGUF file `gguf`, or None)
    drafts: "torch"; "llamacpp" (raises LlamaCppUnavailable saying why it
    cannot); "static" (torch over a static cache of `context_length`
    positions, compiled on a GPU; raises StaticRuntimeRefused saying why it
    cannot); or "auto": on a CPU, llama.cpp when it can run here and one
    decoding step measured cheaper there than in torch (both timed now,
    ~0.5 s once); on a GPU, the static runtime, compiled, when its step
    measured cheaper than the eager one; else torch, with the reason."""
    if requested not in DRAFTER_RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(DRAFTER_RUNTIMES)}, got {requested!r}")
    if requested == "torch":
        return RuntimeChoice(None, "asked for")
    if requested == "static":
        static = StaticTorchModel(model, max_length=context_length)
        static.warm_up()
        step = static.one_token_seconds()
        reason = f"asked for, warmed up in {static.warm_up_seconds:.1f} s"
        return RuntimeChoice(None, reason, {} if step is None else {"static": step}, static)
    context = min(
        int(getattr(model.config.get_text_config(), "max_position_embeddings", 0) or MAX_CONTEXT),
        MAX_CONTEXT,
    )
    threads = threads or torch.get_num_threads()
    if requested == "llamacpp":
        llama = open_gguf(gguf, context_length=context, threads=threads, sequences=2)
        step, read = llama_costs(llama)
        return RuntimeChoice(llama, "asked for", {"llamacpp": step, "llamacpp_read": read})
    device = next(model.parameters()).device
    if device.type == "cuda":
        return static_or_eager(model, context_length)
    if device.type != "cpu":
        return RuntimeChoice(None, f"the drafter runs on {device.type}; llama.cpp here on the CPU")
    try:
        llama = open_gguf(gguf, context_length=context, threads=threads, sequences=2)
    except LlamaCppUnavailable as error:
        return RuntimeChoice(None, str(error))
    step, read = llama_costs(llama)
    seconds = {"llamacpp": step, "llamacpp_read": read, "torch": measure_widths(model, 1)[1]}
    ratio = seconds["llamacpp"] / seconds["torch"]
    if ratio < 1:
        return RuntimeChoice(llama, f"a step costs {ratio:.2f} of torch's, measured", seconds)
    return RuntimeChoice(None, f"llama.cpp's step measured {ratio:.2f}x torch's", seconds)


def static_or_eager(
    model: PreTrainedModel, context_length: int | None, *, compile: bool | None = None
) -> RuntimeChoice:
    """The static runtime (compiled on a GPU; `compile` forces either) where
    its one-token step, warmed up, measured cheaper than the eager one, else
    torch eagerly; with the reason. The drafter's text never reaches the
    answer (the target verifies), so only the cost decides."""
    try:
        static = StaticTorchModel(model, max_length=context_length, compile=compile)
    except StaticRuntimeRefused as error:
        return RuntimeChoice(None, f"the static runtime cannot run it: {error}")
    static.warm_up()
    step = static.one_token_seconds()
    assert step is not None  # warmed up: every bucket timed
    seconds = {"static": step, "torch": measure_widths(model, 1)[1]}
    ratio = seconds["static"] / seconds["torch"]
    warmed = f"warmed up in {static.warm_up_seconds:.1f} s"
    if ratio < 1:
        reason = f"a step costs {ratio:.2f} of eager's ({warmed})"
        return RuntimeChoice(None, reason, seconds, static)
    return RuntimeChoice(None, f"the static runtime's step measured {ratio:.2f}x eager's", seconds)


def choose_drafter_runtime(
    options: DrafterOptions,
    model: PreTrainedModel | None,
    gguf: Path | None,
    *,
    context_length: int | None = None,
) -> RuntimeChoice | None:
    """What runs the drafter model for the drafter `options` describe (None
    when no model drafts): `choose_runtime` with `options.runtime`."""
    if not options.needs_model or model is None:
        return None
    return choose_runtime(options.runtime, model, gguf, context_length=context_length)
