"""Where a model's files come from, told from the name a user gives.

A source is "embedded" (`embedded.py`), a path to a `.gguf` file, a local
model directory or a Hugging Face hub id; `classify` says which, and refuses
names that are none of them with what was expected. `hub_reachable` asks the
hub's host, briefly, before a download is tried. This module knows nothing
about loading a model.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from specrepl.models.embedded import EMBEDDED, embedded_gguf_path
from specrepl.models.errors import ModelLoadError, first_line

__all__ = ["HUB_PROBE_SECONDS", "Source", "classify", "has_tokenizer_files", "hub_reachable"]

HUB_PROBE_SECONDS = 3.0
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class Source:
    """Where a model's files come from: `location` is a path or a hub id."""

    kind: str
    location: str
    gguf: Path | None = None


def classify(source: str) -> Source:
    """Where `source` names a model's files; a ModelLoadError when nowhere."""
    if source.lower() == EMBEDDED:
        path = embedded_gguf_path()
        return Source(EMBEDDED, str(path), path)
    if "://" in source:
        raise ModelLoadError(
            f"{source} is a URL: give a hub id (org/name), a model directory or a .gguf file"
        )
    try:
        return _classify_path(source)
    except ModelLoadError:
        raise
    except (OSError, RuntimeError, ValueError) as exc:  # a name too long, `~nobody`, a NUL
        name = repr(source[:80]) + ("…" if len(source) > 80 else "")
        reason = getattr(exc, "strerror", None) or first_line(exc)
        raise ModelLoadError(f"cannot use {name} as a model path: {reason}") from None


def _classify_path(source: str) -> Source:
    path = Path(source).expanduser()
    if source.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"no such GGUF file: {path}")
        return Source("gguf", str(path.resolve()), path.resolve())
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is a directory without a config.json: expected a model saved "
                "with save_pretrained (or give a .gguf file)"
            )
        return Source("directory", str(path.resolve()))
    if path.exists():
        raise ModelLoadError(
            f"{path} is a file but not a .gguf file: expected a .gguf file, a model "
            "directory or a hub id"
        )
    if source.startswith(("/", "./", "../", "~", ".\\", "..\\")) or source.count("/") > 1:
        raise ModelLoadError(f"no such model directory: {source}")
    return Source("hub", source)


def has_tokenizer_files(directory: Path) -> bool:
    """Whether a model directory holds a tokenizer of its own."""
    return any((directory / name).is_file() for name in _TOKENIZER_FILES)


def hub_reachable() -> bool:
    """False in offline mode or when the hub's host does not answer within a few seconds.

    Asking first saves the minute of retries huggingface_hub spends on a dead
    network; behind a proxy the direct probe proves nothing, so it is skipped.
    """
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS):
            return True
    except OSError:
        return False
