"""What runs the target: torch, or llama.cpp on a GGUF file of its weights, chosen by measurement.

The target's runtime sets the floor of every speculative run and is the
baseline every speedup divides by, so it is chosen as a user would choose
the fastest plain runtime, and never at the price of the text:
`choose_target_runtime` with "auto" opens the GGUF file in llama.cpp
(`llamacpp_runtime.LlamaCppModel`), times one decoding step there against
torch's (both measured now on this machine, never a constant), and takes
llama.cpp only when it is faster AND its greedy text equals torch's on the
calibration prompts it is given. "torch" and "llamacpp" force either ("llamacpp"
raises `LlamaCppUnavailable` saying why it cannot run). "static" runs it in
torch over a static cache, compiled on a GPU (`static_runtime`), compiled and
timed here before the first answer (`StaticRuntimeRefused` saying why where
it cannot run). On a GPU, "auto" weighs the static runtime against the
eager one instead (`static_or_eager`: cheaper, and the same greedy text on
the calibration prompts); on a CPU it weighs llama.cpp. A verdict measured at
an earlier start (`Verdict`, kept by the caller) is taken instead of measuring
again, so only the first start on a machine pays for the timing and the text
check. A llama.cpp target chosen also has its way of reading long prompts
timed (`LlamaCppModel.time_reading`) and kept in the verdict, so that a
later start takes it without timing again, except where the drafter reads
its features: such a target reads plainly, and is a
model object of its own so that no run of it reads otherwise.

Which GGUF file holds the target's exact weights (a float32 copy of a
quantized file) is the caller's business (`specrepl.models.gguf_f32`).

This module knows nothing of settings or of drafters.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specrepl.engine.forward import model_device
from specrepl.engine.generation import autoregressive_generate
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.placement import placed_map
from specrepl.engine.runtime import RunnableModel, TorchModel
from specrepl.engine.runtime_options import TARGET_RUNTIMES
from specrepl.engine.static_runtime import StaticRuntimeRefused, StaticTorchModel
from specrepl.engine.tuning import Tuning
from specrepl.engine.widths import measure_widths

__all__ = [
    "TARGET_RUNTIMES",
    "TargetChoice",
    "Verdict",
    "choose_target_runtime",
    "static_or_eager",
    "torch_step_seconds",
]

CALIBRATION_TOKENS = 32
"""New tokens of each calibration prompt whose greedy text must agree."""
MAX_WIDTH = 17
"""Widths timed in llama.cpp for the gamma policy (up to 16 drafts a step)."""


@dataclass(frozen=True)
class Verdict:
    """What "auto" decided, and why: kept across starts by the caller."""

    runtime: str
    """ "torch", "llamacpp" or "static"."""
    reason: str
    seconds: dict[str, float] = field(default_factory=dict)
    reads_wide_from: int | None = None
    reading: str | None = None
    """How a llama.cpp target reads long prompts (`LlamaCppModel.time_reading`),
    where it was timed (None: not yet)."""


@dataclass(frozen=True)
class TargetChoice:
    """What runs the target (`runnable`), its name and why."""

    runnable: RunnableModel
    reason: str
    seconds: dict[str, float] = field(default_factory=dict)
    """Measured seconds of one decoding step, by runtime ("torch", "llamacpp", "static")."""
    earlier: bool = False
    """Taken from a `Verdict` of an earlier start, not measured now."""
    timed_reading: bool = False
    """How a llama.cpp target reads long prompts was timed now (to be kept)."""

    @property
    def runtime(self) -> str:
        if isinstance(self.runnable, StaticTorchModel):
            return "static"
        return "llamacpp" if isinstance(self.runnable, LlamaCppModel) else "torch"

    @property
    def measured(self) -> bool:
        """Whether torch and another runtime were timed for this choice ("auto",
        measured now)."""
        return "torch" in self.seconds and len(self.seconds) > 1 and not self.earlier

    @classmethod
    def from_verdict(cls, runnable: RunnableModel, verdict: Verdict) -> TargetChoice:
        """`runnable` as an earlier start's `verdict` chose it, for its reasons."""
        return cls(runnable, verdict.reason, verdict.seconds, earlier=True)

    def verdict(self) -> Verdict:
        runnable = self.runnable
        if not isinstance(runnable, LlamaCppModel):
            return Verdict(self.runtime, self.reason, dict(self.seconds))
        return Verdict(
            self.runtime,
            self.reason,
            dict(self.seconds),
            runnable.reads_wide_from,
            runnable.reading,
        )

    def describe(self) -> str:
        name = {"llamacpp": "llama.cpp", "torch": "torch"}.get(self.runtime)
        if isinstance(self.runnable, StaticTorchModel):
            compiled = ", compiled" if self.runnable.compiled else ""
            name = f"torch, static cache{compiled}"
        file = f" ({self.runnable.path.name})" if isinstance(self.runnable, LlamaCppModel) else ""
        when = " (measured at an earlier start)" if self.earlier else ""
        reading = getattr(self.runnable, "reading", None)
        return f"{name}{file}: {self.reason}{when}" + (f"; {reading}" if reading else "")


_OPENED: weakref.WeakValueDictionary[tuple[str, int, int, bool], LlamaCppModel] = (
    weakref.WeakValueDictionary()
)
"""The llama.cpp targets open in this process: sessions over the same file
share its weights (each runtime has a context of its own) and its widths."""


def _opened(
    gguf: Path | None, *, context_length: int, threads: int, features: bool = False
) -> LlamaCppModel:
    """The file opened in llama.cpp once per process for each use: a target
    whose drafter reads its features never reads a prompt with flash
    attention (its features come from the plain context), so it is a model
    of its own, whose runtimes all read the same way."""
    key = (str(gguf), context_length, threads, features)
    model = _OPENED.get(key)
    if model is None:
        model = LlamaCppModel(gguf, context_length=context_length, threads=threads)
        _OPENED[key] = model
    return model


def _reading(choice: TargetChoice, features: bool, earlier: Verdict | None = None) -> TargetChoice:
    """`choice` (of a llama.cpp target) once how it reads prompts is decided:
    as an `earlier` verdict says where it says, else timed now (once per
    process), never with flash attention where the drafter reads the
    target's features."""
    llama = choice.runnable
    assert isinstance(llama, LlamaCppModel)
    if features:
        llama.reading = "reads prompts plainly (the drafter reads its features)"
    elif llama.reading is None and earlier is not None and earlier.reading is not None:
        llama.take_reading(earlier.reads_wide_from, earlier.reading)
    elif llama.reading is None:
        llama.time_reading()
        return replace(choice, timed_reading=True)
    return choice


def torch_step_seconds(model: PreTrainedModel, tuning: Tuning, *, repeats: int = 5) -> float:
    """Seconds of one cached one-token step of `model` in torch: its width
    plan's, where it was timed, else measured now after 48 tokens."""
    if tuning.one_token_step is not None:
        return tuning.one_token_step
    return measure_widths(model, 1, repeats=repeats, forms=tuning.forms, tuning=tuning)[1]


def _same_text(
    first: RunnableModel,
    second: RunnableModel,
    prompts: Sequence[list[int]],
    eos_token_ids: Sequence[int],
) -> int | None:
    """None when the two runtimes' greedy texts are the same on every prompt,
    else the index of the first prompt where they differ."""
    options = {"max_gen_len": CALIBRATION_TOKENS, "eos_tokens_id": list(eos_token_ids)}
    for index, ids in enumerate(prompts):
        one = autoregressive_generate(ids, first, **options)
        other = autoregressive_generate(ids, second, **options)
        if one.token_ids != other.token_ids:
            return index
    return None


def _placed_choice(
    requested: str, model: PreTrainedModel, in_torch: TorchModel
) -> TargetChoice | None:
    """Torch for a target split or offloaded by its device map (llama.cpp would
    read the whole file into memory); LlamaCppUnavailable where llama.cpp is
    forced; None for a target on one device."""
    placed = placed_map(model)
    if placed is None:
        return None
    where = ", ".join(sorted(set(placed.values())))
    if requested == "llamacpp":
        raise LlamaCppUnavailable(
            f"the target is placed by its device map (parts on {where}), and llama.cpp "
            "loads the whole file: set target_runtime torch, or give the target no device map"
        )
    return TargetChoice(
        in_torch,
        f"its device map places it over {where}: torch with accelerate runs it so; "
        "llama.cpp would load the whole file",
    )


def _torch_choice(requested: str, in_torch: TorchModel, context_length: int) -> TargetChoice:
    """Torch as asked: eager, or ("static") over a static cache as long as the
    session's context, compiled where it is compiled, every width bucket
    warmed up and timed."""
    if requested == "torch":
        return TargetChoice(in_torch, "asked for")
    static = StaticTorchModel(in_torch.model, max_length=context_length)
    static.warm_up()
    seconds = static.one_token_seconds()
    warmed = f"warmed up in {static.warm_up_seconds:.1f} s"
    return TargetChoice(
        static, f"asked for, {warmed}", {} if seconds is None else {"static": seconds}
    )


def static_or_eager(
    in_torch: TorchModel,
    context_length: int,
    calibration: Sequence[list[int]] = (),
    eos_token_ids: Sequence[int] = (),
    earlier: Verdict | None = None,
    *,
    compile: bool | None = None,
) -> TargetChoice:
    """Torch eagerly or over a static cache (compiled on a GPU; `compile`
    forces either), whichever measured faster: the static runtime is warmed
    up and its one-token pass timed against the eager one, and it is taken
    only when cheaper AND its greedy text equals the eager one's on the
    calibration prompts. A static verdict of an earlier start (`earlier`) is
    warmed up again (a compiled runtime compiles at every start) but not timed
    or checked; an eager one builds nothing."""
    if earlier is not None and earlier.runtime == "torch":
        return TargetChoice.from_verdict(in_torch, earlier)
    try:
        static = StaticTorchModel(in_torch.model, max_length=context_length, compile=compile)
    except StaticRuntimeRefused as error:
        return TargetChoice(in_torch, f"the static runtime cannot run it: {error}")
    static.warm_up()
    if earlier is not None:
        return TargetChoice.from_verdict(static, earlier)
    step = static.one_token_seconds()
    assert step is not None  # warmed up: every bucket timed
    seconds = {"static": step, "torch": torch_step_seconds(in_torch.model, in_torch.tuning)}
    ratio = seconds["static"] / seconds["torch"]
    warmed = f"warmed up in {static.warm_up_seconds:.1f} s"
    if ratio >= 1:
        return TargetChoice(
            in_torch, f"the static runtime's step measured {ratio:.2f}x eager's ({warmed})", seconds
        )
    differs = _same_text(in_torch, static, calibration, eos_token_ids)
    if differs is not None:
        return TargetChoice(
            in_torch,
            f"the static runtime's greedy text differs from eager's on calibration prompt "
            f"{differs + 1}",
            seconds,
        )
    checked = f", the same text on {len(calibration)} prompts" if calibration else ""
    return TargetChoice(
        static, f"a step costs {ratio:.2f} of eager's, measured{checked} ({warmed})", seconds
    )


def _without_features(requested: str, in_torch: TorchModel, problem: str) -> TargetChoice:
    """Torch, for a drafter that reads features this llama.cpp cannot give
    (`problem`); a forced llama.cpp is refused with the reason."""
    reason = f"the draft head reads the target's features: {problem}"
    if requested == "llamacpp":
        raise LlamaCppUnavailable(reason)
    return TargetChoice(in_torch, reason)


def choose_target_runtime(
    requested: str,
    model: PreTrainedModel,
    tuning: Tuning,
    gguf: Path | None,
    *,
    context_length: int,
    calibration: Sequence[list[int]] = (),
    eos_token_ids: Sequence[int] = (),
    threads: int | None = None,
    earlier: Verdict | None = None,
    features: bool = False,
) -> TargetChoice:
    """What runs the target `model` (whose exact weights the GGUF file `gguf`
    holds, or None): see the module docstring. `earlier`: what "auto" decided
    at an earlier start here, taken instead of measuring. `features`: the
    drafter reads the target's features (from llama.cpp only where it can)."""
    if requested not in TARGET_RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(TARGET_RUNTIMES)}, got {requested!r}")
    in_torch = TorchModel(model, tuning)
    if requested in ("torch", "static"):
        return _torch_choice(requested, in_torch, context_length)
    placed = _placed_choice(requested, model, in_torch)
    if placed is not None:
        return placed
    threads = threads or torch.get_num_threads()
    device = model_device(model)
    if requested == "auto" and device.type == "cuda":
        return static_or_eager(in_torch, context_length, calibration, eos_token_ids, earlier)
    if requested == "auto" and device.type != "cpu":
        return TargetChoice(in_torch, f"the target runs on {device.type}; llama.cpp on the CPU")
    if requested == "auto" and earlier is not None and earlier.runtime == "torch":
        return TargetChoice.from_verdict(in_torch, earlier)
    try:
        llama = _opened(gguf, context_length=context_length, threads=threads, features=features)
    except LlamaCppUnavailable as error:
        if requested == "llamacpp":
            raise
        return TargetChoice(in_torch, str(error))
    if features and llama.features_problem is not None:
        return _without_features(requested, in_torch, llama.features_problem)
    widths = llama.step_seconds() or llama.time_widths(MAX_WIDTH)
    if requested == "llamacpp":
        return _reading(TargetChoice(llama, "asked for", {"llamacpp": widths[0]}), features)
    if earlier is not None:
        return _reading(TargetChoice.from_verdict(llama, earlier), features, earlier)
    seconds = {"llamacpp": widths[0], "torch": torch_step_seconds(model, tuning)}
    ratio = seconds["llamacpp"] / seconds["torch"]
    if ratio >= 1:
        return TargetChoice(in_torch, f"llama.cpp's step measured {ratio:.2f}x torch's", seconds)
    differs = _same_text(in_torch, llama, calibration, eos_token_ids)
    if differs is not None:
        return TargetChoice(
            in_torch,
            f"llama.cpp's greedy text differs from torch's on calibration prompt {differs + 1}",
            seconds,
        )
    checked = f", the same text on {len(calibration)} prompts" if calibration else ""
    reason = f"a step costs {ratio:.2f} of torch's, measured{checked}"
    return _reading(TargetChoice(llama, reason, seconds), features)
