"""A converted, cached copy of a GGUF model, so that only the first load pays for parsing.

transformers reads a `.gguf` file by de-quantizing every tensor and parsing the
tokenizer out of the metadata: about 17 s for the embedded 135M model
(NOTES.md). This module does that once per file and saves the result as an
ordinary model directory (float32 safetensors, config, generation config,
tokenizer) under the cache root; later loads read that directory in well under
a second.

The copy is keyed by a fingerprint of the file's content, written into a
temporary directory and renamed into place, so an interrupted conversion never
leaves a half-written copy behind and two processes converting at once both end
with one good copy.

This module knows nothing about devices, dtypes or quantization (the caller
loads the copy as it likes) and never prints: it reports through `progress`,
mutes the de-quantization bar, and leaves transformers' other progress bars and
logs to the caller to silence (`models.py` does).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["CACHE_FORMAT", "ConvertedGguf", "cache_root", "converted_copy", "fingerprint"]

CACHE_FORMAT = 1
MARKER = "specrepl-gguf.json"
SAMPLE_BYTES = 8 * 1024 * 1024
STALE_PARTIAL_SECONDS = 24 * 3600
_PARTIAL_PREFIX = ".partial-"


@dataclass(frozen=True)
class ConvertedGguf:
    """Where the converted copy of a GGUF file lives and whether it was already there."""

    directory: Path
    from_cache: bool
    seconds: float


def cache_root() -> Path:
    """`$SPECREPL_CACHE_DIR`, else `$XDG_CACHE_HOME/specrepl`, else `~/.cache/specrepl`."""
    explicit = os.environ.get("SPECREPL_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specrepl"


def fingerprint(path: str | Path) -> str:
    """A content key for a GGUF file: its size and the sha256 of its first and last 8 MiB.

    Hashing a whole multi-GB file would cost seconds on every load; the header
    (metadata, tensor layout) lies in the first bytes and weights fill the
    rest, so a changed model changes the sampled bytes or the size.
    """
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(f"specrepl-gguf-{CACHE_FORMAT}:{size}:".encode())
    with path.open("rb") as file:
        digest.update(file.read(SAMPLE_BYTES))
        if size > SAMPLE_BYTES:
            file.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
            digest.update(file.read(SAMPLE_BYTES))
    return digest.hexdigest()


def converted_copy(
    gguf_path: str | Path, *, progress: Callable[[str], None] | None = None
) -> ConvertedGguf:
    """The cached model directory for `gguf_path`, converting it first if needed.

    `progress` is told before a conversion starts (and only then).
    """
    start = time.perf_counter()
    gguf_path = Path(gguf_path).expanduser().resolve()
    root = cache_root() / "gguf"
    directory = root / f"{gguf_path.stem}-{fingerprint(gguf_path)[:20]}"
    if (directory / MARKER).is_file():
        return ConvertedGguf(directory, True, time.perf_counter() - start)
    if directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
    if progress is not None:
        progress(f"converting GGUF {gguf_path.name} (first time only, ~20 s)…")
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    partial = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL_PREFIX}{directory.name}-", dir=root))
    try:
        _convert(gguf_path, partial)
        try:
            partial.rename(directory)
        except OSError:
            if not (directory / MARKER).is_file():
                raise
            # Another process finished the same conversion first: keep its copy.
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)
    return ConvertedGguf(directory, False, time.perf_counter() - start)


def _convert(gguf_path: Path, out: Path) -> None:
    """Parse the GGUF file and write a plain float32 model directory into `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    with _silent_gguf_progress_bar():
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: rebuild it from a config
    # without the GGUF quantization marker and move the weights over.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker = {"format": CACHE_FORMAT, "source": str(gguf_path), "size": gguf_path.stat().st_size}
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


@contextlib.contextmanager
def _silent_gguf_progress_bar() -> Iterator[None]:
    """Mute the de-quantization progress bar, which ignores transformers' own switch."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _remove_stale_partials(root: Path) -> None:
    """Delete temporary directories left by conversions killed a day or more ago."""
    now = time.time()
    for entry in root.glob(f"{_PARTIAL_PREFIX}*"):
        try:
            if now - entry.stat().st_mtime > STALE_PARTIAL_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
