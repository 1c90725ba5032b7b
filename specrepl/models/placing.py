"""Where a model's parts may go, as a user writes it: a device map, memory caps, an offload folder.

A model is loaded whole on the pair's device unless its spec says otherwise
(`ModelSpec.device_map`, `max_memory`, `offload_folder`): then transformers
and accelerate place it (`placement.py` plans it and checks the plan before
anything is loaded). This module reads and checks the names only:

- a device map is a strategy accelerate knows (`auto`, `balanced`,
  `balanced_low_0`, `sequential`), one device for the whole model (`cpu`,
  `cuda:1`), or module names each with a device or `disk`
  (`model.layers.0=cpu,lm_head=disk`, or a TOML table);
- memory caps are devices each with a size (`cpu=200MB,cuda:0=2GiB`, or a
  TOML table; sizes as accelerate reads them: KB, MB and GB are powers of
  1000, KiB, MiB and GiB of 1024; a bare integer is bytes);
- an offload folder is a path where weights that do not fit may be written.

Everything is kept in a canonical, hashable form (tuples of pairs; memory in
bytes; `cuda` as `cuda:0`), so two specs that say the same compare equal. A
bad value raises ValueError naming what is valid. This module imports neither
torch nor transformers: config files and flags are read before they load. It
knows nothing about loading.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEVICE_MAP_STRATEGIES",
    "DeviceMap",
    "MaxMemory",
    "describe_bytes",
    "describe_device_map",
    "describe_max_memory",
    "memory_bytes",
    "parse_device_map",
    "parse_max_memory",
]

DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
"""The device maps accelerate computes from the memory at hand (and the caps)."""

DeviceMap = str | tuple[tuple[str, str], ...]
"""A strategy (`auto`, ...) or (module, device) pairs ("" is the whole model)."""
MaxMemory = tuple[tuple[str, int], ...]
"""(device, bytes) pairs."""

_DEVICE = re.compile(r"cpu|mps|disk|cuda(?::[0-9]+)?|[0-9]+")
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?", re.IGNORECASE)
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_MODULE = re.compile(r"[A-Za-z0-9_.]*")
_DEVICES_SAID = "cpu, cuda, cuda:N, mps or disk"


def canonical_device(name: Any, *, disk: bool = True) -> str:
    """A device as a placement names it: `cpu`, `mps`, `disk`, `cuda:N`
    (`cuda` and a bare GPU index N are `cuda:0` and `cuda:N`). ValueError for
    anything else (`disk` too, where `disk` is False)."""
    text = str(name).strip().lower() if isinstance(name, (str, int)) else ""
    if isinstance(name, bool) or not _DEVICE.fullmatch(text) or (text == "disk" and not disk):
        said = _DEVICES_SAID if disk else _DEVICES_SAID.replace(" or disk", "")
        raise ValueError(f"expected a device ({said}), got {name!r}")
    if text == "cuda":
        return "cuda:0"
    if text.isdigit():
        return f"cuda:{int(text)}"
    return text


def memory_bytes(value: Any) -> int:
    """Bytes of a size: an integer (bytes) or text such as `200MB`, `1.5GiB`."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"a memory size must be positive, got {value}")
        return value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f"expected a memory size such as 200MB, 1.5GiB or a number of bytes, got {value!r}"
        )
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return size


def _pairs(value: str | Mapping[Any, Any], what: str) -> list[tuple[Any, Any]]:
    """`a=x,b=y` or a mapping, as (key, value) pairs."""
    if isinstance(value, Mapping):
        return list(value.items())
    pairs = []
    for part in value.split(","):
        key, equals, item = part.partition("=")
        if not equals or not item.strip():
            raise ValueError(f"expected {what}, got {value!r}")
        pairs.append((key.strip(), item.strip()))
    return pairs


def parse_device_map(value: Any) -> DeviceMap | None:
    """The canonical form of a device map (None: none given; see the module
    docstring). ValueError naming what is valid."""
    if value is None:
        return None
    if isinstance(value, tuple):  # the canonical form, checked again
        value = dict(value)
    if isinstance(value, str) and "=" not in value:
        text = value.strip().lower()
        if text in DEVICE_MAP_STRATEGIES:
            return text
        try:
            return (("", canonical_device(text, disk=False)),)
        except ValueError:
            raise ValueError(
                f"a device map is one of {', '.join(DEVICE_MAP_STRATEGIES)}, one device "
                f"(cpu, cuda:N, mps) or MODULE=DEVICE pairs, got {value!r}"
            ) from None
    if not isinstance(value, (str, Mapping)):
        raise ValueError(f"a device map is text or a table, got {value!r}")
    pairs = _pairs(value, "MODULE=DEVICE pairs separated by commas")
    if not pairs:
        raise ValueError("a device map table needs at least one MODULE = DEVICE")
    placed: dict[str, str] = {}
    for module, device in pairs:
        if not isinstance(module, str) or not _MODULE.fullmatch(module):
            raise ValueError(f"{module!r} is not a module name (letters, digits, _ and .)")
        placed[module] = canonical_device(device)
    if all(device == "disk" for device in placed.values()):
        raise ValueError(
            "a device map must leave some part of the model on a device, not all on disk"
        )
    return tuple(placed.items())


def parse_max_memory(value: Any) -> MaxMemory:
    """The canonical form of memory caps (() when none are given)."""
    if value is None:
        return ()
    if isinstance(value, tuple):  # the canonical form, checked again
        value = dict(value)
    if not isinstance(value, (str, Mapping)):
        raise ValueError(f"memory caps are DEVICE=SIZE pairs or a table, got {value!r}")
    caps: dict[str, int] = {}
    for device, size in _pairs(value, "DEVICE=SIZE pairs separated by commas, e.g. cpu=200MB"):
        caps[canonical_device(device)] = memory_bytes(size)
    return tuple(caps.items())


def describe_bytes(size: int) -> str:
    """`200.0 MB` style: powers of 1000, as the caps are usually written."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def describe_device_map(device_map: DeviceMap | None) -> str:
    if device_map is None:
        return "none"
    if isinstance(device_map, str):
        return device_map
    return ",".join(f"{module or '(all)'}={device}" for module, device in device_map)


def describe_max_memory(caps: MaxMemory) -> str:
    return ",".join(f"{device}={describe_bytes(size)}" for device, size in caps) or "none"
