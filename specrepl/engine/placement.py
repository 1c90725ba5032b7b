"""Where the parts of a loaded model live, as the engine needs to know it while running it.

A model loaded whole sits on one device. A model that transformers and
accelerate placed (`hf_device_map`: split over devices, or with layers kept
in CPU memory or on disk and brought in for each pass by accelerate's hooks)
has parts in several places, and the engine asks here instead of reading the
device of the first parameter:

- `input_device`: where its inputs go (the input embeddings' execution
  device);
- `run_devices`: every device its passes run on (a clock synchronizes them
  all);
- `placed_map`: what transformers placed where, None for a model on one
  device; `offloaded`: whether some weights live off the device they run on
  (CPU memory or disk) or the model is split;
- `weights`: its parameters with the offloaded ones brought in one module at
  a time (to fingerprint a model without loading it all at once);
- `describe_placement`: the map in a few words, layers in ranges.

The tuning of a pass (linear forms, packed copies, width plans) is for a
model whose weights stay put, so whoever tunes a model asks `offloaded`
first. This module knows nothing about loading, decoding or settings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch
from accelerate.utils import align_module_device, has_offloaded_params
from torch import nn

__all__ = [
    "describe_placement",
    "input_device",
    "offloaded",
    "placed_map",
    "run_devices",
    "weights",
]

_LAYER = re.compile(r"(.*\.)([0-9]+)$")


def placed_map(model: nn.Module) -> dict[str, str] | None:
    """The module-to-device map transformers placed `model` by, with devices as
    text (`cpu`, `disk`, `cuda:0`); None when the whole model is on one device."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return None
    named = {name: _name(device) for name, device in device_map.items()}
    return named if len(set(named.values())) > 1 or "disk" in named.values() else None


def _name(device: object) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    return str(torch.device(device)) if not isinstance(device, str) or device != "disk" else device


def offloaded(model: nn.Module) -> bool:
    """Whether some of `model`'s weights live off the device they run on (in
    CPU memory for a GPU, or on disk) or it is split over devices."""
    return placed_map(model) is not None or any(has_offloaded_params(m) for m in model.modules())


def _execution_device(module: nn.Module) -> torch.device | None:
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    for parameter in module.parameters(recurse=False):
        if parameter.device.type != "meta":
            return parameter.device
    return None


def input_device(model: nn.Module) -> torch.device:
    """The device `model`'s input ids go to: its input embeddings' (where their
    hook runs them, for a placed model)."""
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if get is not None else None
    if embeddings is not None:
        device = _execution_device(embeddings)
        if device is not None:
            return device
    return next(model.parameters()).device


def run_devices(model: nn.Module) -> tuple[torch.device, ...]:
    """Every device `model`'s passes run on, its input device first."""
    found = [input_device(model)]
    if placed_map(model) is not None:
        for module in model.modules():
            device = _execution_device(module)
            if device is not None and device not in found:
                found.append(device)
    return tuple(found)


def weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`model`'s named parameters, as `named_parameters` names and orders them
    (a tied weight once), with those offloaded by accelerate brought in for
    the time their module is read (one module at a time, never the whole
    model)."""
    if not offloaded(model):
        yield from model.named_parameters()
        return
    yield from _weights(model, "", set())


def _weights(module: nn.Module, prefix: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    if has_offloaded_params(module):  # its hook brings in all its weights, its children's too
        fresh = [(n, p) for n, p in module.named_parameters() if id(p) not in seen]
        seen.update(id(p) for _, p in fresh)
        with align_module_device(module, torch.device("cpu")):
            brought = dict(module.named_parameters())
            for name, _ in fresh:
                yield prefix + name, brought[name]
        return
    for name, parameter in module.named_parameters(recurse=False):
        if id(parameter) not in seen:
            seen.add(id(parameter))
            yield prefix + name, parameter
    for name, child in module.named_children():
        yield from _weights(child, f"{prefix}{name}.", seen)


def describe_placement(device_map: dict[str, str]) -> str:
    """`model.embed_tokens cpu · model.layers.0-3 cpu · model.layers.4-29 disk ·
    model.norm, lm_head disk`: consecutive entries on one device together,
    numbered layers as a range."""
    groups: list[tuple[str, list[str]]] = []
    for name, device in device_map.items():
        if groups and groups[-1][0] == device:
            groups[-1][1].append(name)
        else:
            groups.append((device, [name]))
    return " · ".join(f"{_ranges(names)} {device}" for device, names in groups)


def _ranges(names: list[str]) -> str:
    """`a.0, a.1, a.2, b` → `a.0-2, b`."""
    parts: list[str] = []
    run: tuple[str, int, int] | None = None
    for name in names:
        match = _LAYER.fullmatch(name)
        if match and run and run[0] == match.group(1) and int(match.group(2)) == run[2] + 1:
            run = (run[0], run[1], run[2] + 1)
            continue
        if run:
            parts.append(_span(run))
        run = (match.group(1), int(match.group(2)), int(match.group(2))) if match else None
        if not match:
            parts.append(name)
    if run:
        parts.append(_span(run))
    return ", ".join(parts)


def _span(run: tuple[str, int, int]) -> str:
    prefix, first, last = run
    return f"{prefix}{first}" if first == last else f"{prefix}{first}-{last}"
