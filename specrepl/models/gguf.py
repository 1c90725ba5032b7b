"""A converted, cached copy of a GGUF model, so that only the first load pays for parsing.

transformers reads a `.gguf` file by de-quantizing every tensor and parsing the
tokenizer out of the metadata: about 17 s for the embedded 135M model on a
2-core CPU (4 s for the tokenizer, 12 s de-quantizing). This module does that
once per file and saves the result as an ordinary model directory (float32
safetensors, config, generation config, tokenizer) under the cache root; later
loads read that directory in well under a second.

The copy is keyed by a fingerprint of the file's content, written into a
temporary directory and renamed into place, so an interrupted conversion never
leaves a half-written copy behind and two processes converting at once both end
with one good copy.

A copy heals itself: its marker file lists every file it wrote with its size
and a checksum of its first and last MiB (and the specrepl and torch versions
that wrote it). Each load checks the list, and that every safetensors header
covers its file exactly; a copy that fails (a file cut short, zero-filled,
deleted, a marker that is not JSON) is converted again with one line saying
what was wrong. `discard` removes a copy that passed the check but still
failed to load.

This module knows nothing about devices, dtypes or quantization (the caller
loads the copy as it likes) and never prints: it reports through `progress`,
mutes the de-quantization bar, and leaves transformers' other progress bars and
logs to the caller to silence (`models.py` does).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from specrepl.store.atomic import write_text_atomically
from specrepl.store.paths import ends_digest, fingerprint, model_copies_dir

__all__ = [
    "CACHE_FORMAT",
    "MARKER",
    "PARTIAL_PREFIX",
    "ConvertedGguf",
    "check_copy",
    "converted_copy",
    "discard",
]

CACHE_FORMAT = 1
MARKER_FORMAT = 2  # 2: the marker lists the files (1 had no list)
MARKER = "specrepl-gguf.json"
CHECK_BYTES = 1024 * 1024
STALE_PARTIAL_SECONDS = 24 * 3600
PARTIAL_PREFIX = ".partial-"


@dataclass(frozen=True)
class ConvertedGguf:
    """Where the converted copy of a GGUF file lives and whether it was already there."""

    directory: Path
    from_cache: bool
    seconds: float


def converted_copy(
    gguf_path: str | Path, *, progress: Callable[[str], None] | None = None
) -> ConvertedGguf:
    """The cached model directory for `gguf_path`, converting it first if needed.

    `progress` is told before a conversion starts (and only then).
    """
    start = time.perf_counter()
    gguf_path = Path(gguf_path).expanduser().resolve()
    root = model_copies_dir()
    directory = root / f"{gguf_path.stem}-{fingerprint(gguf_path)[:20]}"
    if (directory / MARKER).is_file() or directory.exists():
        problem = check_copy(directory)
        if problem is None:
            return ConvertedGguf(directory, True, time.perf_counter() - start)
        if progress is not None:
            progress(f"the converted copy {directory} is damaged ({problem}): converting again…")
        discard(directory)
    elif progress is not None:
        progress(f"converting GGUF {gguf_path.name} (first time only, ~20 s)…")
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(root)
    partial = Path(tempfile.mkdtemp(prefix=f"{PARTIAL_PREFIX}{directory.name}-", dir=root))
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
    _write_marker(out, {"source": str(gguf_path), "size": gguf_path.stat().st_size})


def _write_marker(directory: Path, about: dict[str, object]) -> None:
    """List every file of `directory` (size and sampled checksum) in its marker."""
    from specrepl.version import __version__

    files = {
        entry.name: {"size": entry.stat().st_size, "sample": _sample_digest(entry)}
        for entry in sorted(directory.iterdir())
        if entry.is_file() and entry.name != MARKER
    }
    marker = {
        **about,
        "format": CACHE_FORMAT,
        "marker_format": MARKER_FORMAT,
        "files": files,
        "written_by": {"specrepl": __version__, "torch": torch.__version__},
    }
    write_text_atomically(directory / MARKER, json.dumps(marker, indent=2) + "\n")


def _sample_digest(path: Path) -> str:
    """sha256 of a file's size, first MiB and last MiB: cheap, and it changes when
    a file is cut short, extended, or zero-filled at either end."""
    return ends_digest(path, CHECK_BYTES)


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file's header does not describe the file exactly, if it does not."""
    size = path.stat().st_size
    try:
        with path.open("rb") as file:
            length = int.from_bytes(file.read(8), "little")
            if length <= 0 or 8 + length > size:
                return f"{path.name} has no readable header"
            header = json.loads(file.read(length))
        ends = [
            int(entry["data_offsets"][1])
            for name, entry in header.items()
            if name != "__metadata__"
        ]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return f"{path.name} has no readable header"
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{path.name} is {size} bytes, its header describes {expected}"
    return None


def check_copy(directory: Path) -> str | None:
    """What is wrong with a converted copy, in a few words, or None if it looks whole.

    A marker from before files were listed (marker format 1) is checked by its
    safetensors headers alone and, when they are whole, given a list."""
    try:
        marker = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "its marker file is missing"
    except (OSError, ValueError):
        return "its marker file is not readable JSON"
    if not isinstance(marker, dict) or marker.get("format") != CACHE_FORMAT:
        return "its marker file is not one this version writes"
    listed = marker.get("files")
    for weights in sorted(directory.glob("*.safetensors")):
        problem = _safetensors_problem(weights)
        if problem is not None:
            return problem
    if listed is None:  # an older marker: whole by the headers, so list the files now
        if not any(directory.glob("*.safetensors")):
            return "it has no weights file"
        with contextlib.suppress(OSError):
            _write_marker(directory, {k: v for k, v in marker.items() if k != "format"})
        return None
    if not isinstance(listed, dict) or not listed:
        return "its marker lists no files"
    for name, expected in listed.items():
        path = directory / name
        try:
            size = path.stat().st_size
            if not isinstance(expected, dict) or size != expected.get("size"):
                return f"{name} is {size} bytes, {expected.get('size')} were written"
            if _sample_digest(path) != expected.get("sample"):
                return f"{name} is not what was written"
        except FileNotFoundError:
            return f"{name} is missing"
        except (OSError, AttributeError):
            return f"{name} cannot be read"
    return None


def discard(directory: Path) -> None:
    """Remove a converted copy (the next load converts again)."""
    with contextlib.suppress(FileNotFoundError):
        (directory / MARKER).unlink()  # first: a half-removed copy is never taken as whole
    shutil.rmtree(directory, ignore_errors=True)


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
    for entry in root.glob(f"{PARTIAL_PREFIX}*"):
        try:
            if now - entry.stat().st_mtime > STALE_PARTIAL_SECONDS:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
