"""Forward widths: feed a model a few more tokens when that is cheaper.

A speculative step feeds the target 1 + k new tokens. On CPUs the cost of a
forward pass need not grow with that width: the matrix kernels change with the
number of rows, and on the 2-core machine this project is measured on, the
embedded float32 target took 58, 97, 119, 89 and 81 ms for widths 1 to 5. A
width plan, measured once per model, maps each width to the cheapest width at
least as large; `forward.forward_logits` then pads the fed tokens up to it,
keeps the logits of the real positions and crops the padding out of the cache
again. Causal attention means the padding cannot change the real positions'
logits (beyond the rounding any change of kernel brings).

Stored plans (`tune_pair_widths(store=...)`) are keyed by the model as
loaded, the CPU, the thread count and the torch version, so another machine or
an upgrade measures again; a plan is also measured again once it is older than
`MAX_PLAN_AGE_DAYS`, or on request (`retime=True`), and a measurement whose
repeats disagree by more than `NOISY_SPREAD` (the machine was busy) is used for
the session but not stored, so it cannot slow every later start down.

Each width is timed in two forms of the linear layers' product where the
model allows it (`linear_forms.py`: `F.linear`'s x Wᵀ and the weight-first
(W xᵀ)ᵀ, which some CPU BLAS libraries run much faster for a few rows), and the
plan keeps, per width, the cheaper of the two.

This module times models and keeps their plans; it knows nothing about
drafting or acceptance.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.devices import synchronize
from specrepl.engine.kv_cache import new_cache, rollback_to
from specrepl.engine.linear_forms import allow_forms, weight_first_rows
from specrepl.store.atomic import write_text_atomically

__all__ = [
    "MAX_PLAN_AGE_DAYS",
    "NOISY_SPREAD",
    "WidthPlan",
    "clear_width_plan",
    "cpu_model",
    "install_width_plan",
    "measure_plan",
    "measure_widths",
    "one_token_step",
    "padded_width",
    "plan_widths",
    "set_width_plan",
    "tune_pair_widths",
    "tune_widths",
    "width_plan",
]


MAX_PLAN_AGE_DAYS = 30
NOISY_SPREAD = 0.25  # (second largest - second smallest) / median of one width's repeats


@dataclass(frozen=True)
class WidthPlan:
    """Measured forward seconds per width (in the cheaper form), the width each
    width is padded to, and the widths whose pass multiplies weight first."""

    seconds: dict[int, float]
    padded: dict[int, int]
    weight_first: frozenset[int] = frozenset()

    def to_dict(self) -> dict[str, object]:
        return {
            "ms_per_width": {w: round(s * 1e3, 2) for w, s in sorted(self.seconds.items())},
            "padded": {w: p for w, p in sorted(self.padded.items()) if p != w},
            "weight_first": sorted(self.weight_first),
        }


_PLANS: weakref.WeakKeyDictionary[PreTrainedModel, WidthPlan] = weakref.WeakKeyDictionary()


def set_width_plan(model: PreTrainedModel, plan: WidthPlan) -> None:
    _PLANS[model] = plan


def install_width_plan(model: PreTrainedModel, plan: WidthPlan) -> None:
    """Give `model` a plan measured before (stored, or on an earlier load of the
    same model): its layers take the weight-first form where the plan says so."""
    if plan.weight_first:
        allow_forms(model)
    set_width_plan(model, plan)


def clear_width_plan(model: PreTrainedModel) -> None:
    _PLANS.pop(model, None)


def width_plan(model: PreTrainedModel) -> WidthPlan | None:
    return _PLANS.get(model)


def one_token_step(model: PreTrainedModel) -> float | None:
    """The model's measured seconds for a one-token step (its width plan), if timed."""
    plan = _PLANS.get(model)
    return None if plan is None else plan.seconds.get(1)


def padded_width(model: PreTrainedModel, width: int) -> int:
    """The width to feed instead of `width` (itself when there is no plan)."""
    plan = _PLANS.get(model)
    if plan is None:
        return width
    return plan.padded.get(width, width)


def measure_widths(
    model: PreTrainedModel,
    max_width: int,
    *,
    context: int = 48,
    repeats: int = 5,
    seed: int = 0,
    weight_first: frozenset[int] = frozenset(),
) -> dict[int, float]:
    """Median seconds of one cached forward pass feeding 1..max_width tokens
    after `context` cached tokens (the widths in `weight_first` multiplying
    weight first, see `linear_forms.py`). Widths are timed in rotating order
    so that a slow spell of the machine does not land on one width."""
    samples = measure_width_samples(
        model, max_width, context=context, repeats=repeats, seed=seed, weight_first=weight_first
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


@torch.no_grad()
def measure_width_samples(
    model: PreTrainedModel,
    max_width: int,
    *,
    context: int = 48,
    repeats: int = 5,
    seed: int = 0,
    weight_first: frozenset[int] = frozenset(),
) -> dict[int, list[float]]:
    """Every timed repeat of `measure_widths`, per width."""
    if max_width < 1:
        raise ValueError(f"max_width must be >= 1, got {max_width}")
    device = next(model.parameters()).device
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (context + max_width,), generator=generator).to(device)
    cache = new_cache(model)
    model(input_ids=tokens[None, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
    timings: dict[int, list[float]] = {w: [] for w in range(1, max_width + 1)}
    widths = list(timings)
    for round_index in range(repeats + 1):  # the first round warms the kernels up
        shift = round_index % len(widths)
        for width in widths[shift:] + widths[:shift]:
            fed = tokens[None, context : context + width]
            synchronize(device)
            start = time.perf_counter()
            with weight_first_rows(weight_first):
                model(input_ids=fed, past_key_values=cache, use_cache=True, logits_to_keep=width)
            synchronize(device)
            elapsed = time.perf_counter() - start
            rollback_to(cache, context)
            if round_index:
                timings[width].append(elapsed)
    return timings


def plan_widths(
    seconds: dict[int, float],
    *,
    margin: float = 0.9,
    weight_first: frozenset[int] = frozenset(),
) -> WidthPlan:
    """Pad a width to the cheapest larger measured width when that costs less
    than `margin` times its own time (a clear win, not noise). `seconds` are
    each width's in the form that `weight_first` chose for it."""
    padded: dict[int, int] = {}
    for width, cost in seconds.items():
        larger = [(seconds[w], w) for w in seconds if w > width]
        best_cost, best = min(larger, default=(cost, width))
        padded[width] = best if best_cost < margin * cost else width
    chosen = frozenset(w for w in weight_first if w in seconds)
    return WidthPlan(seconds=dict(seconds), padded=padded, weight_first=chosen)


def measure_plan(model: PreTrainedModel, max_width: int, **measure: int) -> tuple[WidthPlan, float]:
    """Time every width in the stock form and, where the model allows it
    (`linear_forms.allow_forms`), weight first; plan with the cheaper form of
    each width. Returns the plan and the spread of the noisiest timings."""
    allowed = allow_forms(model)  # before timing the stock form: passes run as these layers
    stock = measure_width_samples(model, max_width, **measure)
    samples = [stock]
    seconds = {w: statistics.median(t) for w, t in stock.items()}
    weight_first: set[int] = set()
    if allowed:
        other = measure_width_samples(model, max_width, weight_first=frozenset(stock), **measure)
        samples.append(other)
        for width, times in other.items():
            if (median := statistics.median(times)) < seconds[width]:
                seconds[width] = median
                weight_first.add(width)
    plan = plan_widths(seconds, weight_first=frozenset(weight_first))
    return plan, max(spread(s) for s in samples)


def tune_widths(model: PreTrainedModel, max_width: int, **measure: int) -> WidthPlan:
    """Measure `model` and install its plan (used by every later forward pass)."""
    plan, _ = measure_plan(model, max_width, **measure)
    set_width_plan(model, plan)
    return plan


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


def _plan_key(loaded: Any, max_width: int) -> str:
    """What a stored plan must match: the model as loaded, the machine, torch."""
    parts = (
        loaded.name,
        str(loaded.dtype),
        str(loaded.quantization),
        str(loaded.parameters),
        str(loaded.device),
        cpu_model(),
        f"threads={torch.get_num_threads()}",
        f"torch={torch.__version__}",
        f"widths=1..{max_width}",
    )
    return " | ".join(parts)


def _read_store(store: Path) -> dict[str, Any]:
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stored_plan(entry: Any, now: float) -> WidthPlan | None:
    """The plan of a stored entry, if it is well formed and not too old."""
    try:
        seconds = {int(w): float(t) for w, t in entry["seconds"].items()}
        measured = float(entry["measured_at"])
        # a plan stored before the form was chosen per width lacks the key: measured again
        weight_first = frozenset(int(w) for w in entry["weight_first"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not 0 <= now - measured <= MAX_PLAN_AGE_DAYS * 86400:
        return None
    if not seconds or not all(t > 0 for t in seconds.values()):
        return None
    return plan_widths(seconds, weight_first=weight_first)


def tune_pair_widths(
    pair: Any, max_gamma: int, *, store: Path | None = None, retime: bool = False
) -> dict[str, WidthPlan]:
    """Tune the target and, when it is a different model, the drafter of a
    model pair (`.target` and an optional `.drafter`, each a `LoadedModel`)
    for widths up to max_gamma + 1, and install the plans; returns them by
    role. With `store` (a JSON file), timings measured before for the same
    model, machine and torch, less than `MAX_PLAN_AGE_DAYS` ago, are reused
    unless `retime`; new ones are added to it unless their repeats were noisy."""
    loaded = {"target": pair.target}
    drafter = getattr(pair, "drafter", None)
    if drafter is not None and drafter.model is not pair.target.model:
        loaded["drafter"] = drafter
    max_width = max_gamma + 1
    saved = _read_store(store) if store is not None else {}
    now = time.time()
    plans: dict[str, WidthPlan] = {}
    for role, model in loaded.items():
        key = _plan_key(model, max_width)
        plan = None if retime else _stored_plan(saved.get(key), now)
        if plan is None:
            plan, noise = measure_plan(model.model, max_width)
            if noise <= NOISY_SPREAD:
                saved[key] = {
                    "seconds": plan.seconds,
                    "weight_first": sorted(plan.weight_first),
                    "measured_at": now,
                    "spread": noise,
                }
            else:
                saved.pop(key, None)
            set_width_plan(model.model, plan)
        else:
            install_width_plan(model.model, plan)
        plans[role] = plan
    if store is not None:
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomically(store, json.dumps(saved, indent=1))
        except OSError:
            pass  # a read-only cache only costs a new measurement next time
    return plans
