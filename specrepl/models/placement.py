"""Planning where a placed model's parts go, and refusing a plan that cannot run, before loading.

A spec with a device map (`ModelSpec.placed`) is loaded by transformers with
an explicit device map that `plan_placement` computes first, with
accelerate's own planner (`infer_auto_device_map`, over the caps
`get_balanced_memory` or `get_max_memory` make of the spec's), on the model
built from its config on the meta device: no weight is read to plan. The
plan is checked before any weight is loaded, so a bad request costs nothing
and is answered in words:

- a device it names that this machine lacks (`cuda:3` on a CPU machine);
- an offload folder that cannot be written;
- caps too small for the first layer (the input embeddings would be on
  disk: there would be nothing to run the model on);
- a drafter that would not stay whole on one device (it runs a pass per
  draft; streaming its weights would cost more than it saves);
- a module map that leaves some weight without a device.

transformers and accelerate do the placing itself (hooks that bring
offloaded weights in for each pass); nothing here re-implements it. This
module knows nothing about decoding, settings or the terminal.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import (
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
)
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from specrepl.models.devices import resolve_device
from specrepl.models.errors import ModelLoadError, first_line
from specrepl.models.placing import describe_bytes, describe_max_memory
from specrepl.models.specs import ModelSpec

__all__ = ["Plan", "plan_placement"]


@dataclass(frozen=True)
class Plan:
    """What transformers is given to place one model: an explicit device map
    (module name to `cpu`, `disk`, `cuda:N`, ...) and the offload folder."""

    device_map: dict[str, str]
    offload_folder: str | None


def plan_placement(
    spec: ModelSpec,
    role: str,
    files: str,
    dtype: torch.dtype,
    *,
    trust_remote_code: bool,
    offline: bool,
    default_folder: Path,
) -> Plan:
    """The plan for a placed `spec` (its files at `files`), checked (see the
    module docstring); raises ModelLoadError saying what to change. A plan
    with parts on disk and no folder named offloads to `default_folder`."""
    _check_devices(spec, role)
    model = _meta_model(files, dtype, trust_remote_code=trust_remote_code, offline=offline)
    if isinstance(spec.device_map, str):
        device_map = _inferred(model, spec, dtype)
    else:
        device_map = _given(model, spec, role)
    _check_first_layer(model, device_map, spec, role, dtype)
    if role == "drafter" and (len(set(device_map.values())) > 1 or "disk" in device_map.values()):
        need = describe_bytes(compute_module_sizes(model, dtype=dtype)[""])
        raise ModelLoadError(
            f"the drafter does not fit whole on one device with max_memory "
            f"{describe_max_memory(spec.max_memory)} (it needs {need}, and would be split "
            f"{_summary(device_map)}): a drafter runs a pass for every draft, so it runs "
            "whole on one device; raise its cap or give it no device map"
        )
    folder = spec.offload_folder
    if folder is not None:
        _check_folder(Path(folder), role)
    elif "disk" in device_map.values():
        folder = str(default_folder)
        _check_folder(default_folder, role)
    return Plan(device_map, folder)


def _check_devices(spec: ModelSpec, role: str) -> None:
    """Refuse a device the spec names that this machine does not have."""
    named = [device for device, _ in spec.max_memory]
    if not isinstance(spec.device_map, str):
        named += [device for _, device in spec.device_map]
    for device in dict.fromkeys(named):
        if device in ("cpu", "disk"):
            continue
        try:
            resolve_device(device)
        except ModelLoadError as error:
            raise ModelLoadError(f"the {role}'s placement names {device}: {error}") from None


def _meta_model(
    files: str, dtype: torch.dtype, *, trust_remote_code: bool, offline: bool
) -> PreTrainedModel:
    """The model of `files`' config, built on the meta device (no weights)."""
    try:
        config = AutoConfig.from_pretrained(
            files, trust_remote_code=trust_remote_code, local_files_only=offline
        )
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                config, dtype=dtype, trust_remote_code=trust_remote_code
            )
    except Exception as exc:  # the load itself explains a missing or foreign model better
        raise ModelLoadError(f"could not plan where {files} goes: {first_line(exc)}") from exc


def _accelerate_caps(spec: ModelSpec) -> dict[int | str, int] | None:
    """The spec's caps as accelerate keys them (a GPU by its index)."""
    if not spec.max_memory:
        return None
    return {
        (int(device.split(":")[1]) if device.startswith("cuda:") else device): size
        for device, size in spec.max_memory
    }


def _inferred(model: PreTrainedModel, spec: ModelSpec, dtype: torch.dtype) -> dict[str, str]:
    """accelerate's map for a strategy (`auto`, ...) under the spec's caps."""
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    caps = _accelerate_caps(spec)
    if spec.device_map == "sequential":
        memory = get_max_memory(caps)
    else:
        memory = get_balanced_memory(
            model,
            max_memory=caps,
            no_split_module_classes=no_split,
            dtype=dtype,
            low_zero=spec.device_map == "balanced_low_0",
        )
    inferred = infer_auto_device_map(
        model, max_memory=memory, no_split_module_classes=no_split, dtype=dtype
    )
    return {name: _device_name(device) for name, device in inferred.items()}


def _device_name(device: Any) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(device)


def _given(model: PreTrainedModel, spec: ModelSpec, role: str) -> dict[str, str]:
    """The spec's own module map, refused where it leaves a weight without a
    device or names a module the model lacks."""
    device_map = dict(spec.device_map)
    modules = {name for name, _ in model.named_modules()}
    unknown = [name for name in device_map if name not in modules]
    if unknown:
        raise ModelLoadError(
            f"the {role}'s device map names {unknown[0]!r}, which is not a module of the model "
            f"(its top modules: {', '.join(sorted(_top_modules(model)))})"
        )
    for name in model.state_dict():
        if not any(not m or name == m or name.startswith(m + ".") for m in device_map):
            raise ModelLoadError(
                f"the {role}'s device map gives {name} no device: name a module holding it "
                'or "" for the rest'
            )
    return device_map


def _top_modules(model: PreTrainedModel) -> set[str]:
    return {name for name, _ in model.named_modules() if name and name.count(".") <= 1}


def device_of(device_map: dict[str, str], name: str) -> str | None:
    """The device a module of that name lands on under `device_map` (the
    longest entry that holds it); None when none does."""
    best: tuple[int, str] | None = None
    for module, device in device_map.items():
        holds = not module or name == module or name.startswith(module + ".")
        if holds and (best is None or len(module) > best[0]):
            best = (len(module), device)
    return None if best is None else best[1]


def _input_module(model: PreTrainedModel) -> str:
    embeddings = model.get_input_embeddings()
    return next(name for name, module in model.named_modules() if module is embeddings)


def _check_first_layer(
    model: PreTrainedModel, device_map: dict[str, str], spec: ModelSpec, role: str, dtype: Any
) -> None:
    """Refuse a plan whose input embeddings would be on disk: the caps leave
    no device for the model to run on."""
    first = _input_module(model)
    if device_of(device_map, first) != "disk":
        return
    sizes = compute_module_sizes(model, dtype=dtype)
    caps = describe_max_memory(spec.max_memory)
    raise ModelLoadError(
        f"max_memory {caps} leaves no room for the {role}'s first layer ({first}, "
        f"{describe_bytes(sizes[first])}; accelerate also keeps room for the largest layer "
        f"beside it): raise the cap of the device it should run on"
    )


def _check_folder(folder: Path, role: str) -> None:
    """Refuse an offload folder that cannot be made or written (checked with a
    probe file, removed again)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".specrepl-probe-", dir=folder)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise ModelLoadError(
            f"the {role}'s offload folder {folder} cannot be written "
            f"({error.strerror or first_line(error)}): give a writable --offload-folder"
        ) from None


def _summary(device_map: dict[str, str]) -> str:
    """`over cpu (3 parts), disk (29 parts)`."""
    counts: dict[str, int] = {}
    for device in device_map.values():
        counts[device] = counts.get(device, 0) + 1
    return "over " + ", ".join(f"{device} ({n} parts)" for device, n in counts.items())
