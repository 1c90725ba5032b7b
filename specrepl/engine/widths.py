"""Forward widths: feed a model a few more tokens when that is cheaper.

A speculative step feeds the target 1 + k new tokens. On CPUs the cost of a
forward pass need not grow with that width: the matrix kernels change with the
number of rows, and on the 2-core machine this project is measured on, the
embedded float32 target took 58, 97, 119, 89 and 81 ms for widths 1 to 5. A
width plan, measured once per model, maps each width to the cheapest width at
least as large; `forward.forward_pass` then pads the fed tokens up to it (the
plan reaches it in the model's `tuning.Tuning`), keeps the logits of the real
positions and crops the padding out of the cache again. Causal attention means
the padding cannot change the real positions' logits (beyond the rounding any
change of kernel brings).

Each width is timed in every form of the linear layers' product the model
allows (`linear_forms.py`: `F.linear`'s x Wᵀ, the weight-first (W xᵀ)ᵀ, which
some CPU BLAS libraries run much faster for a few rows, and oneDNN's product
with a packed copy of the weights), and the plan keeps, per width, the
cheapest. Passes wider than the plan's widths (a prompt, a pasted document)
are timed at a few prompt sizes (`WIDE_WIDTHS`) stock and packed, and the plan
packs them all where packed measured cheaper at every one of those sizes.
Every timed pass runs inside the model's `tuning.Tuning.running`, in the form
being timed, with the packed copies and the attention of that tuning, as
`forward.forward_pass` will run it; the model is the stock model again after
each.

This module times a model and makes its plan (`width_plan.WidthPlan`); it
keeps nothing. Which plans are stored, and for which models, is
`specrepl.models.width_plans`' business. It knows nothing about drafting or
acceptance.
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.devices import synchronize
from specrepl.engine.kv_cache import new_cache, rollback_to
from specrepl.engine.linear_forms import STOCK, RowForms
from specrepl.engine.tuning import Tuning
from specrepl.engine.width_plan import WidthPlan, plan_widths

__all__ = [  # WidthPlan and plan_widths are width_plan's, named here as before
    "WIDE_WIDTHS",
    "WidthPlan",
    "cpu_identity",
    "cpu_model",
    "machine_parts",
    "measure_plan",
    "measure_wide_samples",
    "measure_width_samples",
    "measure_widths",
    "plan_widths",
    "processor_name",
    "spread",
]


WIDE_WIDTHS: tuple[int, ...] = (64, 256)
"""Prompt-sized passes (tokens fed at once) at which a plan times the stock and
the packed form for every pass wider than its own widths."""


def measure_widths(
    model: PreTrainedModel,
    max_width: int,
    *,
    context: int = 48,
    repeats: int = 5,
    seed: int = 0,
    forms: RowForms = STOCK,
    tuning: Tuning | None = None,
) -> dict[int, float]:
    """Median seconds of one cached forward pass feeding 1..max_width tokens
    after `context` cached tokens, run as `tuning` runs the model's passes
    (None: the stock model) but with each width's linear layers in the form
    `forms` give it (see `linear_forms.py`). Widths are timed in rotating
    order so that a slow spell of the machine does not land on one width."""
    samples = measure_width_samples(
        model, max_width, context=context, repeats=repeats, seed=seed, forms=forms, tuning=tuning
    )
    return {w: statistics.median(times) for w, times in samples.items()}


def spread(samples: dict[int, list[float]]) -> float:
    """How much the repeats of the noisiest width disagree: (second largest -
    second smallest) / median (the extremes left out), 0 with under 4 repeats."""
    worst = 0.0
    for times in samples.values():
        if len(times) < 4:
            continue
        ordered = sorted(times)
        worst = max(worst, (ordered[-2] - ordered[1]) / statistics.median(ordered))
    return worst


def _prefilled(model: PreTrainedModel, tokens: torch.Tensor, tuning: Tuning) -> DynamicCache:
    """A cache holding `tokens`, fed as `tuning` runs the model (the timed
    passes attend over it)."""
    cache = new_cache(model)
    with tuning.running(model, STOCK):
        model(input_ids=tokens[None], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache


@torch.no_grad()
def measure_width_samples(
    model: PreTrainedModel,
    max_width: int,
    *,
    context: int = 48,
    repeats: int = 5,
    seed: int = 0,
    forms: RowForms = STOCK,
    tuning: Tuning | None = None,
) -> dict[int, list[float]]:
    """Every timed repeat of `measure_widths`, per width."""
    if max_width < 1:
        raise ValueError(f"max_width must be >= 1, got {max_width}")
    tuning = Tuning() if tuning is None else tuning
    device = next(model.parameters()).device
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (context + max_width,), generator=generator).to(device)
    cache = _prefilled(model, tokens[:context], tuning)
    timings: dict[int, list[float]] = {w: [] for w in range(1, max_width + 1)}
    widths = list(timings)
    for round_index in range(repeats + 1):  # the first round warms the kernels up
        shift = round_index % len(widths)
        for width in widths[shift:] + widths[:shift]:
            fed = tokens[None, context : context + width]
            synchronize(device)
            start = time.perf_counter()
            with tuning.running(model, forms):
                model(input_ids=fed, past_key_values=cache, use_cache=True, logits_to_keep=width)
            synchronize(device)
            elapsed = time.perf_counter() - start
            rollback_to(cache, context)
            if round_index:
                timings[width].append(elapsed)
    return timings


@torch.no_grad()
def measure_wide_samples(
    model: PreTrainedModel,
    widths: tuple[int, ...],
    forms: dict[str, RowForms],
    *,
    context: int = 48,
    repeats: int = 2,
    seed: int = 0,
    tuning: Tuning | None = None,
) -> dict[str, dict[int, list[float]]]:
    """Every timed repeat of one cached pass feeding each of `widths` tokens
    (a prompt: one logit kept) in each of `forms`, by form name and width, run
    as `tuning` runs the model's passes (None: the stock model) in that form.
    The forms alternate within every round, so that a slow spell of the
    machine lands on all of them; the first round warms the kernels up."""
    tuning = Tuning() if tuning is None else tuning
    device = next(model.parameters()).device
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (context + max(widths),), generator=generator).to(device)
    cache = _prefilled(model, tokens[:context], tuning)
    timings: dict[str, dict[int, list[float]]] = {name: {w: [] for w in widths} for name in forms}
    for round_index in range(repeats + 1):
        for width in widths:
            for name, row_forms in forms.items():
                synchronize(device)
                start = time.perf_counter()
                with tuning.running(model, row_forms):
                    model(
                        input_ids=tokens[None, context : context + width],
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                synchronize(device)
                elapsed = time.perf_counter() - start
                rollback_to(cache, context)
                if round_index:
                    timings[name][width].append(elapsed)
    return timings


def _wide_passes_packed(
    model: PreTrainedModel, max_width: int, tuning: Tuning, **measure: int
) -> bool:
    """Whether passes wider than `max_width` measured cheaper packed than stock
    at every prompt size of `WIDE_WIDTHS` above it (`tuning` holds packed
    copies)."""
    widths = tuple(w for w in WIDE_WIDTHS if w > max_width)
    if not widths:
        return False
    context = measure.get("context", 48)
    forms = {"stock": STOCK, "packed": RowForms(packed_from=1)}
    timed = measure_wide_samples(model, widths, forms, context=context, tuning=tuning)
    return all(
        statistics.median(timed["packed"][w]) < statistics.median(timed["stock"][w]) for w in widths
    )


def measure_plan(
    model: PreTrainedModel,
    max_width: int,
    tuning: Tuning | None = None,
    **measure: int,
) -> tuple[WidthPlan, float]:
    """Time every width, as `tuning` runs the model's passes (None: the stock
    model), in the stock form and, where `tuning` says the model's layers can
    take them, weight first (`linear_forms`; the stock form is then timed on
    the same switched layers, as a plan's stock widths run) and with packed
    copies (`packed_weights`: `tuning` holds them); plan with the cheapest
    form of each width, and, with packed copies, pack every wider pass where
    prompt-sized passes measured cheaper packed (`WIDE_WIDTHS`). Returns the
    plan and the spread of the noisiest timings."""
    tuning = Tuning() if tuning is None else tuning
    forms, packed = tuning.linear_forms, tuning.linear_forms and tuning.packed_weights
    stock = measure_width_samples(model, max_width, forms=STOCK, tuning=tuning, **measure)
    every = frozenset(stock)
    samples = [stock]
    seconds = {w: statistics.median(t) for w, t in stock.items()}
    cheapest = dict.fromkeys(seconds, "stock")  # the form each width is cheapest in
    others = []
    if forms:
        others.append(("weight_first", RowForms(weight_first=every)))
        if packed:
            others.append(("packed", RowForms(packed=every)))
    for name, row_forms in others:
        timed = measure_width_samples(model, max_width, forms=row_forms, tuning=tuning, **measure)
        samples.append(timed)
        for width, times in timed.items():
            if (median := statistics.median(times)) < seconds[width]:
                seconds[width], cheapest[width] = median, name
    wide_packed = packed and _wide_passes_packed(model, max_width, tuning, **measure)
    plan = plan_widths(
        seconds,
        weight_first=frozenset(w for w, name in cheapest.items() if name == "weight_first"),
        packed=frozenset(w for w, name in cheapest.items() if name == "packed"),
        packed_from=max_width + 1 if wide_packed else None,
    )
    return plan, max(spread(s) for s in samples)


def cpu_model() -> str:
    """The CPU's model name, as the kernel reports it (or the platform's guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_parts() -> tuple[str, str, str]:
    """What a timing stored across starts must match of the machine: the CPU
    (`cpu_identity`), the thread count and torch's version."""
    return cpu_identity(), f"threads={torch.get_num_threads()}", f"torch={torch.__version__}"


def cpu_identity() -> str:
    """The CPU's model name with its family and model numbers where the kernel
    gives them (`AMD EPYC (family 25, model 17)`): one model name can cover
    several generations, whose costs differ."""
    numbers: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in numbers:
                numbers[key.strip()] = value.strip()
            if not line.strip() and numbers:
                break  # the first processor's block is enough
    except OSError:
        pass
    if "cpu family" in numbers and "model" in numbers:
        return f"{cpu_model()} (family {numbers['cpu family']}, model {numbers['model']})"
    return cpu_model()


def processor_name(device: torch.device) -> str:
    """What did the work on `device`: the CPU (`cpu_identity`), or the GPU's name
    with the host CPU's (as a shard or a checkpoint records where it was made)."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (GPU; host CPU {cpu_identity()})"
    return cpu_identity()
