"""What specrepl keeps on disk, and `python infer.py cache` to see and clear it.

Six kinds of state outlive a run, all of them re-computable:

- `models`: converted copies of GGUF models (`<cache>/gguf/`, see
  models/gguf.py), checked here as on every load, and the float32 GGUF files
  written for llama.cpp (`<cache>/gguf-f32/`, models/gguf_f32.py);
- `widths`: the forward-width timings per model and machine
  (`<cache>/widths.json`, see engine/widths.py);
- `choices`: whether a hybrid with head "auto" drafted faster with the draft
  head or the drafter model, per pair, runtime and machine
  (`<cache>/draft-choices.json`, see chat/draft_choice.py);
- `distill`: the prompts, answer shards and training checkpoints of
  `distill` runs (`<cache>/distill/<target fingerprint>/`);
- `history`: the REPL's prompt history;
- `llamacpp`: whether llama.cpp ran a GGUF file here without crashing, per
  binding build, CPU and file (`<cache>/llamacpp-trials.json`, see
  llamacpp.py); cleared, the trial runs again.

`<cache>` is `$SPECREPL_CACHE_DIR`, else `$XDG_CACHE_HOME/specrepl`, else
`~/.cache/specrepl`. Hugging Face hub downloads are not ours: they live in the
hub's own cache (`hf cache` manages it). Nor are the draft heads a user keeps
under `<cache>/heads/` (trained, not re-computable): never listed or cleared here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from specrepl.app.render.formatting import format_bytes
from specrepl.chat.draft_choice import MAX_CHOICE_AGE_DAYS
from specrepl.engine.signals import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from specrepl.models.gguf import PARTIAL_PREFIX, check_copy, discard
from specrepl.models.gguf_f32 import is_float32_copy
from specrepl.models.width_plans import MAX_PLAN_AGE_DAYS
from specrepl.store.paths import (
    DISTILL_CHECKPOINT_FILE,
    cache_root,
    distill_root,
    draft_choices_file,
    float32_copies_dir,
    history_file,
    llamacpp_trials_file,
    model_copies_dir,
    width_plans_file,
)

__all__ = ["KINDS", "StoredItem", "add_arguments", "clear", "run", "stored_items"]

KINDS = ("models", "widths", "choices", "distill", "history", "llamacpp")


@dataclass(frozen=True)
class StoredItem:
    """One thing on disk: a directory or a file."""

    kind: str
    path: Path
    size: int
    state: str
    healthy: bool = True
    """False where the next run will rebuild it (damaged, unfinished, stale)."""


def stored_items() -> list[StoredItem]:
    """Everything specrepl keeps, kind by kind (what does not exist is left out)."""
    items = _model_copies(model_copies_dir()) + _float32_copies(float32_copies_dir())
    items += _width_plans(width_plans_file())
    items += _draft_choices(draft_choices_file())
    items += _distill_runs(distill_root())
    history = history_file()
    if history.is_file():
        lines = _count_lines(history)
        items.append(StoredItem("history", history, _size(history), f"{lines} lines"))
    return items + _llamacpp_trials(llamacpp_trials_file())


def clear(kinds: Sequence[str]) -> list[StoredItem]:
    """Remove every stored item of `kinds`; returns what was removed."""
    removed = []
    for item in stored_items():
        if item.kind not in kinds:
            continue
        if item.kind == "models" and item.path.is_dir():
            discard(item.path)  # the marker first: a half-removed copy is never taken as whole
        elif item.path.is_dir():
            shutil.rmtree(item.path, ignore_errors=True)
        else:
            item.path.unlink(missing_ok=True)
        removed.append(item)
    return removed


def _float32_copies(directory: Path) -> list[StoredItem]:
    state = "a float32 GGUF file for llama.cpp (written again when needed)"
    files = sorted(directory.iterdir()) if directory.is_dir() else []
    return [StoredItem("models", f, _size(f), state) for f in files if is_float32_copy(f)]


def _model_copies(directory: Path) -> list[StoredItem]:
    items = []
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        if not entry.is_dir():
            continue
        if entry.name.startswith(PARTIAL_PREFIX):
            state, healthy = "an unfinished conversion (removed after a day)", False
        else:
            problem = check_copy(entry)
            healthy = problem is None
            state = "whole" if healthy else f"damaged: {problem} (converted again on next load)"
        items.append(StoredItem("models", entry, _size(entry), state, healthy))
    return items


def _json_store(kind: str, store: Path, rebuilt: str) -> tuple[dict | None, list[StoredItem]]:
    """A JSON object kept in one file: (its contents, []), or (None, the item
    saying it does not read and is `rebuilt` when), or (None, []) if absent."""
    if not store.is_file():
        return None, []
    try:
        data = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        state = f"not readable ({rebuilt})"
        return None, [StoredItem(kind, store, _size(store), state, False)]
    return data, []


def _width_plans(store: Path) -> list[StoredItem]:
    return _dated_store("widths", store, "plan", MAX_PLAN_AGE_DAYS)


def _draft_choices(store: Path) -> list[StoredItem]:
    return _dated_store("choices", store, "choice", MAX_CHOICE_AGE_DAYS)


def _dated_store(kind: str, store: Path, noun: str, max_age_days: int) -> list[StoredItem]:
    """A JSON store of measurements, each with its `measured_at`, taken again
    once older than `max_age_days`."""
    data, unreadable = _json_store(kind, store, "measured again and rewritten on next start")
    if data is None:
        return unreadable
    now, old = time.time(), 0
    for entry in data.values():
        measured = entry.get("measured_at") if isinstance(entry, dict) else None
        if not isinstance(measured, int | float) or now - measured > max_age_days * 86400:
            old += 1
    state = f"{len(data)} {noun}{'s' if len(data) != 1 else ''}"
    if old:
        state += f", {old} to be measured again (older than {max_age_days} days or undated)"
    return [StoredItem(kind, store, _size(store), state, old == 0)]


def _llamacpp_trials(store: Path) -> list[StoredItem]:
    data, unreadable = _json_store(
        "llamacpp", store, "tried again and rewritten when llama.cpp is next used"
    )
    if data is None:
        return unreadable
    failed = sum(1 for entry in data.values() if isinstance(entry, dict) and not entry.get("ok"))
    state = f"{len(data)} trial{'s' if len(data) != 1 else ''} of llama.cpp"
    if failed:
        state += f", {failed} failed (llama.cpp is not used for those)"
    return [StoredItem("llamacpp", store, _size(store), state)]


def _distill_runs(directory: Path) -> list[StoredItem]:
    items = []
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        if not entry.is_dir():
            continue
        prompts = entry / "prompts.jsonl"
        parts = [f"{_count_lines(prompts)} prompts" if prompts.is_file() else "no prompts yet"]
        shards = len(list(entry.glob("shard-*.pt")))
        parts.append(f"{shards} answer shard{'s' if shards != 1 else ''}")
        if (entry / DISTILL_CHECKPOINT_FILE).is_file():
            parts.append("a training checkpoint")
        items.append(StoredItem("distill", entry, _size(entry), ", ".join(parts)))
    return items


def _size(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as file:
            return sum(1 for _ in file)
    except OSError:
        return 0


# -- the command line -------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List what specrepl keeps on disk (converted models, width timings, draft choices, distill "
        "runs, prompt history, llama.cpp trials), its size and state, or clear all or part of it. "
        f"Everything is re-computed when needed. The cache directory: {cache_root()}"
    )
    parser.add_argument(
        "action", nargs="?", choices=("list", "clear"), default="list",
        help="list (default) or clear",
    )  # fmt: skip
    parser.add_argument(
        "kinds", nargs="*", metavar="KIND",
        help=f"with clear: what to clear, of {', '.join(KINDS)} or all",
    )  # fmt: skip
    parser.add_argument("--yes", "-y", action="store_true", help="clear without asking")


def run(args: argparse.Namespace, console: Console) -> int:
    """`python infer.py cache [list | clear KIND... [--yes]]`; returns the exit status."""
    if args.action == "list":
        if args.kinds:
            console.print("[red]cache list takes no kinds[/] (cache clear KIND... clears)")
            return EXIT_USAGE
        _print_items(stored_items(), console)
        return EXIT_OK
    kinds = list(KINDS) if "all" in args.kinds else list(dict.fromkeys(args.kinds))
    unknown = [kind for kind in kinds if kind not in KINDS]
    if not kinds or unknown:
        named = f"unknown kind {', '.join(unknown)}; " if unknown else ""
        console.print(f"[red]cache clear: {escape(named)}name one or more of "
                      f"{', '.join(KINDS)}, or all[/]")  # fmt: skip
        return EXIT_USAGE
    doomed = [item for item in stored_items() if item.kind in kinds]
    if not doomed:
        console.print(f"nothing stored of {', '.join(kinds)}")
        return EXIT_OK
    total = sum(item.size for item in doomed)
    if not args.yes:
        if not sys.stdin.isatty():
            console.print("[red]cache clear: add --yes to clear without a terminal to ask on[/]")
            return EXIT_USAGE
        _print_items(doomed, console)
        try:
            reply = console.input(f"clear these ({format_bytes(total)})? [y/N] ")
        except (EOFError, KeyboardInterrupt):
            console.print("\nnothing cleared")
            return EXIT_INTERRUPTED
        if reply.strip().lower() not in ("y", "yes"):
            console.print("nothing cleared")
            return EXIT_OK
    removed = clear(kinds)
    console.print(f"cleared {len(removed)} item{'s' if len(removed) != 1 else ''}, "
                  f"{format_bytes(sum(item.size for item in removed))}")  # fmt: skip
    return EXIT_OK


def _print_items(items: list[StoredItem], console: Console) -> None:
    if not items:
        console.print(f"nothing stored (cache directory {escape(str(cache_root()))})")
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("kind", no_wrap=True)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("state")
    table.add_column("path", overflow="fold")
    for item in items:
        state = escape(item.state) if item.healthy else f"[yellow]{escape(item.state)}[/]"
        table.add_row(item.kind, format_bytes(item.size), state, escape(str(item.path)))
    console.print(table)
    console.print(f"total {format_bytes(sum(item.size for item in items))}")
