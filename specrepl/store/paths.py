"""Where specrepl keeps things: the files shipped inside the package and the
user's cache directory.

Every other module asks here for a location instead of building one from
`__file__` or the environment, so moving a file is a change to one line.
Knows nothing of models, drafters or rendering: only the standard library.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

__all__ = [
    "DATA_DIR",
    "DISTILL_CHECKPOINT_FILE",
    "EMBEDDED_HEADS_DIR",
    "PACKAGE_DIR",
    "cache_root",
    "default_chat_path",
    "default_config_path",
    "distill_root",
    "draft_choices_file",
    "ends_digest",
    "fingerprint",
    "history_file",
    "kept_heads_dir",
    "llamacpp_trials_file",
    "model_copies_dir",
    "offload_dir",
    "target_runtimes_file",
    "width_plans_file",
]

PACKAGE_DIR = Path(__file__).resolve().parent.parent
"""The installed `specrepl` package."""

DATA_DIR = PACKAGE_DIR / "data"
"""Data shipped with the package: the default config and the default chat."""

EMBEDDED_HEADS_DIR = PACKAGE_DIR / "heads"
"""Draft heads trained for the embedded target, shipped with the package."""

_SAMPLED_BYTES = 8 << 20


def default_config_path() -> Path:
    """The config every entry point reads without `--config`: the embedded pair."""
    return DATA_DIR / "default.toml"


def default_chat_path() -> Path:
    """The scripted chat that `replay` runs without a file of its own."""
    return DATA_DIR / "chat.jsonl"


def cache_root() -> Path:
    """`$SPECREPL_CACHE_DIR`, else `$XDG_CACHE_HOME/specrepl`, else `~/.cache/specrepl`."""
    explicit = os.environ.get("SPECREPL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specrepl"


def model_copies_dir() -> Path:
    """Converted copies of GGUF models, one directory per file content key."""
    return cache_root() / "gguf"


def float32_copies_dir() -> Path:
    """Float32 GGUF files written from quantized ones, for llama.cpp to run a
    target's exact weights."""
    return cache_root() / "gguf-f32"


def offload_dir() -> Path:
    """Where a placed model's weights that fit nowhere else are written, when
    its spec names no offload folder (one folder per role under it)."""
    return cache_root() / "offload"


def width_plans_file() -> Path:
    """The forward-width timings, per model and machine."""
    return cache_root() / "widths.json"


def draft_choices_file() -> Path:
    """Whether a hybrid drafted faster with a draft head or the drafter model, by pair and
    machine."""
    return cache_root() / "draft-choices.json"


def target_runtimes_file() -> Path:
    """What runs a target when the user lets specrepl choose ("auto"): the verdict
    measured at the first start, by GGUF file and machine."""
    return cache_root() / "target-runtimes.json"


def kept_heads_dir() -> Path:
    """Draft heads the user keeps for their own targets (one directory each), which
    a drafter head named "auto" finds as it finds the shipped ones."""
    return cache_root() / "heads"


def llamacpp_trials_file() -> Path:
    """Whether llama.cpp ran a GGUF file here without crashing, per build, CPU and file."""
    return cache_root() / "llamacpp-trials.json"


def distill_root() -> Path:
    """`distill` runs: one directory per target fingerprint."""
    return cache_root() / "distill"


DISTILL_CHECKPOINT_FILE = "checkpoint.pt"
"""The training checkpoint inside a `distill` run's directory."""


def history_file() -> Path:
    """`$SPECREPL_HISTORY`, else `$XDG_STATE_HOME/specrepl/history`, else
    `~/.local/state/specrepl/history`."""
    explicit = os.environ.get("SPECREPL_HISTORY")
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME")
    base = Path(state).expanduser() if state else Path.home() / ".local" / "state"
    return base / "specrepl" / "history"


GGUF_KEY_FORMAT = 1
"""Bumped when what `fingerprint` keys on changes, so old keys stop matching."""


def fingerprint(path: str | Path) -> str:
    """A content key for a model file: its size and the sha256 of its first and last 8 MiB.

    Hashing a whole multi-GB file would cost seconds on every load; the header
    (metadata, tensor layout) lies in the first bytes and weights fill the
    rest, so a changed model changes the sampled bytes or the size.
    """
    return ends_digest(Path(path), _SAMPLED_BYTES, f"specrepl-gguf-{GGUF_KEY_FORMAT}:")


def ends_digest(path: Path, chunk: int, label: str = "") -> str:
    """sha256 of `label`, the file's size, and its first and last `chunk` bytes."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{label}{size}:".encode())
    with path.open("rb") as file:
        digest.update(file.read(chunk))
        if size > chunk:
            file.seek(max(chunk, size - chunk))
            digest.update(file.read(chunk))
    return digest.hexdigest()
