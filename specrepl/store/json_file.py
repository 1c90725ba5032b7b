"""Measurements kept in one JSON object per file: read forgivingly, written whole.

The stores of things timed or tried once per machine (width plans, llama.cpp
trials, a hybrid's draft-source choices) are each one JSON object, keyed by
what the measurement depends on. `read_json_object` gives an empty object for
a file that is absent, damaged or not an object, so the measurement is taken
again and the file written anew; `write_json_object` writes through a
temporary file (`atomic.write_text_atomically`) and shrugs off a read-only
cache, which costs only measuring again next time.

Knows nothing of what the entries mean: only the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specrepl.store.atomic import write_text_atomically

__all__ = ["read_json_object", "write_json_object"]


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when it is absent, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json_object(path: Path, data: dict[str, Any]) -> bool:
    """Write `data` to `path` whole (its directory made first); False where the
    cache cannot be written (then nothing changed)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(data, indent=1))
    except OSError:
        return False
    return True
