"""Width plans of a loaded pair: timed once per model and machine, kept on disk.

`tune_pair_widths` gives the target and, when it is another model, the
drafter of a pair a width plan (`specrepl.engine.widths`) in their `Tuning`:
measured now, or read from a store (a JSON file, `widths.json` in the cache)
where an earlier start measured it. Stored plans are keyed by the model as
loaded, the CPU, the thread count and the torch version, so another machine
or an upgrade measures again; a plan is also measured again once it is older
than `MAX_PLAN_AGE_DAYS`, or on request (`retime=True`), and a measurement
whose repeats disagree by more than `NOISY_SPREAD` (the machine was busy) is
used for the session but not stored, so it cannot slow every later start down.

A model is timed in every form its linear layers can take, as its passes
will run (`tuning.allow_linear_forms`, and `tuning.pack_linear_weights`
where the memory allows a packed copy, dropped again when no width is
faster with it; recorded in its tuning, whose packed copies and attention
the timed passes use; a plan may pack prompt-sized passes only). A stored
plan that uses the packed copy while the memory no longer allows one is
measured again. Only models on a CPU are timed. This module knows nothing
about decoding, settings or the terminal.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from specrepl.engine.width_plan import WidthPlan, plan_widths
from specrepl.engine.widths import machine_parts, measure_plan
from specrepl.models.loaded import LoadedModel
from specrepl.models.pair import ModelPair
from specrepl.models.tuning import (
    allow_linear_forms,
    pack_linear_weights,
    unpack_linear_weights,
)
from specrepl.store.json_file import read_json_object, write_json_object

__all__ = ["MAX_PLAN_AGE_DAYS", "NOISY_SPREAD", "ROLES", "tune_pair_widths"]

MAX_PLAN_AGE_DAYS = 30
NOISY_SPREAD = 0.25  # (second largest - second smallest) / median of one width's repeats
ROLES = ("target", "drafter")


def tune_pair_widths(
    pair: ModelPair,
    max_gamma: int,
    *,
    store: Path | None = None,
    retime: bool = False,
    roles: Collection[str] = ROLES,
) -> dict[str, WidthPlan]:
    """Give the target and, when it is a different model, the drafter of `pair`
    a width plan for widths up to max_gamma + 1, in their `tuning`; returns the
    plans by role. With `store` (a JSON file), timings measured before for the
    same model, machine and torch, less than `MAX_PLAN_AGE_DAYS` ago, are reused
    unless `retime`; new ones are added to it unless their repeats were noisy.
    `roles` names the models to time (a session leaves out a drafter whose
    torch model does not run, as when llama.cpp drafts: it is not loaded again
    for it). A model that is split or offloaded (`LoadedModel.offloaded`) is
    never timed: it runs every pass stock, and the gamma policy prices its
    steps from what they measure while it decodes. Nor is a model on a GPU
    or another accelerator: there a pass costs about the same at every
    width (its kernels' launches, not the rows, set its price), so padding
    gains nothing, and timing it would only delay the first answer."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"roles are {' and '.join(ROLES)}, got {sorted(unknown)}")
    loaded = {"target": pair.target} if "target" in roles else {}
    drafter = pair.drafter
    if "drafter" in roles and drafter is not None and drafter.model is not pair.target.model:
        loaded["drafter"] = drafter
    # a split or offloaded model runs stock: its weights are brought in by
    # accelerate's hooks for each pass, which the forms and packed copies would not see
    loaded = {role: model for role, model in loaded.items() if not model.offloaded}
    loaded = {role: model for role, model in loaded.items() if model.device.type == "cpu"}
    if not loaded:
        return {}
    max_width = max_gamma + 1
    saved = read_json_object(store) if store is not None else {}
    now = time.time()
    plans: dict[str, WidthPlan] = {}
    for role, model in loaded.items():
        key = _plan_key(model, max_width)
        plan = None if retime else _stored_plan(saved.get(key), now)
        if plan is not None and not _take_forms(model, plan):
            plan = None
        if plan is None:
            plan = _measure(model, max_width, saved, key, now)
        model.tuning.plan = plan
        plans[role] = plan
    if store is not None:
        write_json_object(store, saved)  # a read-only cache only costs measuring again
    return plans


def _take_forms(loaded: LoadedModel, plan: WidthPlan) -> bool:
    """Ready `loaded`'s layers for the forms a stored plan uses (dropping packed
    copies it does not use); False when the plan's packed widths cannot have
    their packed copy now."""
    if plan.weight_first or plan.packs_any:
        allow_linear_forms(loaded.model, loaded.tuning)
    if plan.packs_any:
        return pack_linear_weights(loaded.model, loaded.tuning)
    unpack_linear_weights(loaded.tuning)
    return True


def _measure(
    loaded: LoadedModel, max_width: int, saved: dict[str, Any], key: str, now: float
) -> WidthPlan:
    """Time `loaded`'s widths in every form its layers can take (the stock form
    on the layers that run the others) and note the plan in `saved` unless
    noisy."""
    tuning = loaded.tuning
    allow_linear_forms(loaded.model, tuning)
    pack_linear_weights(loaded.model, tuning)
    plan, noise = measure_plan(loaded.model, max_width, tuning)
    if not plan.packs_any:
        unpack_linear_weights(tuning)
    if noise <= NOISY_SPREAD:
        saved[key] = {
            "seconds": plan.seconds,
            "weight_first": sorted(plan.weight_first),
            "packed": sorted(plan.packed),
            "packed_from": plan.packed_from,
            "measured_at": now,
            "spread": noise,
        }
    else:
        saved.pop(key, None)
    return plan


def _plan_key(loaded: LoadedModel, max_width: int) -> str:
    """What a stored plan must match: the model as loaded, the machine, torch."""
    parts = (
        loaded.name,
        str(loaded.dtype),
        str(loaded.quantization),
        str(loaded.parameters),
        str(loaded.device),
        *machine_parts(),
        f"widths=1..{max_width}",
    )
    return " | ".join(parts)


def _stored_plan(entry: Any, now: float) -> WidthPlan | None:
    """The plan of a stored entry, if it is well formed and not too old."""
    try:
        seconds = {int(w): float(t) for w, t in entry["seconds"].items()}
        measured = float(entry["measured_at"])
        # a plan stored before the forms were chosen per width, or before wide
        # passes were timed, lacks their keys: measured again
        weight_first = frozenset(int(w) for w in entry["weight_first"])
        packed = frozenset(int(w) for w in entry["packed"])
        packed_from = None if entry["packed_from"] is None else int(entry["packed_from"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not 0 <= now - measured <= MAX_PLAN_AGE_DAYS * 86400:
        return None
    if not seconds or not all(t > 0 for t in seconds.values()):
        return None
    return plan_widths(seconds, weight_first=weight_first, packed=packed, packed_from=packed_from)
