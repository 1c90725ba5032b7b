"""A training checkpoint small enough to commit next to the data (`distill --data`).

Two files in one directory (by default `DIR/checkpoint/` of the data directory):

    checkpoint.safetensors   the head's trained weights in bfloat16 and the
                             draft vocabulary's ids (`token_ids`, int32); its
                             metadata holds the same JSON as the file below
    checkpoint.json          what the checkpoint is: the target, the head's
                             shape, the settings, the draft vocabulary's size
                             and sha256, the progress and the sessions so far

The safetensors file is written first, then the JSON (each atomically); the
copy of the JSON inside the safetensors file is the one read back, so a stop
between the two writes never pairs weights with another checkpoint's
progress. About 2 bytes a trained parameter: the AdamW moments are not kept,
so a resumed run restarts its optimizer (a warm restart; `training.py`
ramps the learning rate up again over its first steps).

Reading refuses (CheckpointRefused) a checkpoint made for another target,
another draft vocabulary size or another head shape, naming both; a damaged
one is reported through a callback and ignored.

This module knows the head's weights and the checkpoint's files; nothing of
the data, the loss or the training loop. It never prints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specrepl.engine.drafters.draft_head import DraftHead, HeadConfig
from specrepl.engine.widths import cpu_identity, processor_name
from specrepl.store.atomic import unreadable, write_atomically, write_text_atomically

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_JSON",
    "CHECKPOINT_WEIGHTS",
    "CacheCheckpoint",
    "CheckpointRefused",
    "CommittedCheckpoint",
    "Position",
    "SavedHead",
    "read_checkpoint",
    "start_from_head",
    "vocabulary_hash",
    "write_checkpoint",
]

CHECKPOINT_FORMAT = "specrepl-head-checkpoint"
CHECKPOINT_VERSION = 1
CHECKPOINT_WEIGHTS = "checkpoint.safetensors"
CHECKPOINT_JSON = "checkpoint.json"
_METADATA_KEY = "checkpoint"


class CheckpointRefused(ValueError):
    """A committed checkpoint that cannot be resumed by this run: another
    target, another draft vocabulary size, another head shape, a newer format."""


@dataclass(frozen=True)
class SavedHead:
    """A checkpoint read back: the weights (bfloat16), the draft vocabulary's
    ids and the description (the JSON)."""

    weights: dict[str, torch.Tensor]
    token_ids: torch.Tensor
    description: dict[str, Any]

    @property
    def progress(self) -> dict[str, Any]:
        return dict(self.description.get("progress", {}))


def vocabulary_hash(token_ids: torch.Tensor) -> str:
    """sha256 of the draft vocabulary's ids as little-endian int32."""
    data = token_ids.detach().cpu().to(torch.int32).numpy().astype("<i4").tobytes()
    return hashlib.sha256(data).hexdigest()


def write_checkpoint(directory: Path, head: DraftHead, description: dict[str, Any]) -> None:
    """Write the head's weights in bfloat16 with its token ids, then the JSON
    (`description` plus the format, the head's shape and the vocabulary's hash)."""
    directory.mkdir(parents=True, exist_ok=True)
    full = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "config": asdict(head.config),
        "draft_vocab": int(head.token_ids.shape[0]),
        "draft_vocab_sha256": vocabulary_hash(head.token_ids),
        **description,
    }
    text = json.dumps(full, indent=1) + "\n"
    tensors = {
        name: value.detach().to(torch.bfloat16).cpu().contiguous()
        for name, value in head.state_dict().items()
    }
    tensors["token_ids"] = head.token_ids.detach().cpu().to(torch.int32).contiguous()
    write_atomically(
        directory / CHECKPOINT_WEIGHTS,
        lambda file: save_file(tensors, str(file), metadata={_METADATA_KEY: text}),
    )
    write_text_atomically(directory / CHECKPOINT_JSON, text)


def start_from_head(
    directory: Path,
    head: DraftHead,
    *,
    target: dict[str, Any],
    settings: dict[str, Any],
    source: str,
) -> bool:
    """Write a checkpoint holding `head`'s weights and nothing used yet, so
    that training resumes from them (a warm restart) with its own schedule;
    False, writing nothing, when `directory` already holds a checkpoint."""
    if (directory / CHECKPOINT_WEIGHTS).exists():
        return False
    progress = {**asdict(Position()), "training_records": -1, "held_back_agreement": []}
    description = {
        "target": target,
        "settings": settings,
        "progress": progress,
        "started_from": source,
        "sessions": [],
    }
    write_checkpoint(directory, head, description)
    return True


def _load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    with safe_open(str(path), framework="pt") as archive:
        metadata = archive.metadata() or {}
        names = archive.keys()  # safe_open is not iterable
        tensors = {name: archive.get_tensor(name) for name in names}
    description = json.loads(metadata[_METADATA_KEY])
    if not isinstance(description, dict) or description.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a {CHECKPOINT_FORMAT}")
    return tensors, description


def _stored_config(stored: Any) -> HeadConfig | None:
    """The head shape a checkpoint's JSON names (fields added since take their
    defaults), or None when it names none that this version can read."""
    try:
        return HeadConfig(**stored)
    except TypeError:
        return None


def read_checkpoint(
    directory: Path,
    *,
    fingerprint: str,
    config: HeadConfig,
    on_message: Callable[[str], None] | None = None,
) -> SavedHead | None:
    """The checkpoint in `directory` for a head of `config` on the target with
    `fingerprint`; None when there is none, or when it is damaged (one line to
    `on_message`: training starts over and overwrites it). CheckpointRefused
    for one made for another target, draft vocabulary size or head shape."""
    path = directory / CHECKPOINT_WEIGHTS
    if not path.exists():
        return None
    try:
        tensors, description = _load(path)
        token_ids = tensors.pop("token_ids").long()
    except Exception as error:
        if on_message is not None:
            on_message(
                f"the training checkpoint {path} is damaged ({unreadable(error)}):"
                " training starts over"
            )
        return None
    version = description.get("version")
    if not isinstance(version, int) or version > CHECKPOINT_VERSION:
        raise CheckpointRefused(
            f"{path} is checkpoint version {version}; this specrepl reads up to"
            f" version {CHECKPOINT_VERSION}"
        )
    stored = description.get("target", {})
    if stored.get("fingerprint") != fingerprint:
        raise CheckpointRefused(
            f"the checkpoint in {directory} was made for another target ({stored.get('name')},"
            f" fingerprint {stored.get('fingerprint')}), not this one (fingerprint"
            f" {fingerprint}): give another --checkpoint directory"
        )
    if int(token_ids.shape[0]) != config.draft_vocab:
        raise CheckpointRefused(
            f"the checkpoint in {directory} has a draft vocabulary of {token_ids.shape[0]}"
            f" tokens, not {config.draft_vocab}: resume with --draft-vocab {token_ids.shape[0]}"
            " or give another --checkpoint directory"
        )
    if _stored_config(description.get("config")) != config:
        raise CheckpointRefused(
            f"the checkpoint in {directory} is for a head of another shape"
            f" ({description.get('config')}), not {asdict(config)}"
        )
    if vocabulary_hash(token_ids) != description.get("draft_vocab_sha256"):
        if on_message is not None:
            on_message(f"the training checkpoint {path} is damaged (vocabulary hash)")
        return None
    return SavedHead(tensors, token_ids, description)


@dataclass
class Position:
    """Where training stands: what was used, and the place in the pass over the data."""

    seconds: float = 0.0
    tokens: int = 0
    steps: int = 0
    epoch: int = 0
    done_in_epoch: int = 0


def _read_cache_checkpoint(
    path: Path, on_message: Callable[[str], None] | None
) -> dict[str, Any] | None:
    """The saved training state, or None (with one line) when the file is damaged:
    training then starts from the beginning and overwrites it."""
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
        keys = {"head", "optimizer", "settings", "token_ids", "seconds", "tokens", "steps"}
        if isinstance(saved, dict) and keys <= saved.keys():
            return saved
        problem = "not a training checkpoint"
    except Exception as error:
        problem = unreadable(error)
    if on_message is not None:
        on_message(f"the training checkpoint {path} is damaged ({problem}): training starts over")
    return None


class CacheCheckpoint:
    """The work directory's checkpoint: head, optimizer and progress in one
    file, resumed only with the same settings and draft vocabulary."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = settings

    def resume(
        self,
        head: DraftHead,
        optimizer: torch.optim.Optimizer,
        on_message: Callable[[str], None] | None,
    ) -> Position | None:
        saved = _read_cache_checkpoint(self.path, on_message) if self.path.exists() else None
        if saved is None or saved.get("settings") != self.settings:
            return None
        if not torch.equal(saved["token_ids"].cpu(), head.token_ids.cpu()):
            return None
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        names = ("seconds", "tokens", "steps", "epoch", "done_in_epoch")
        return Position(*(saved[name] for name in names))

    def save(
        self,
        head: DraftHead,
        optimizer: torch.optim.Optimizer,
        position: Position,
        agreement: tuple[float, ...],
    ) -> None:
        payload = {
            "settings": self.settings,
            "token_ids": head.token_ids,
            "head": head.state_dict(),
            "optimizer": optimizer.state_dict(),
            **asdict(position),
        }
        write_atomically(self.path, lambda file: torch.save(payload, file))


class CommittedCheckpoint:
    """The compact checkpoint kept with the data (`checkpoint.py`): bfloat16
    weights and progress; the optimizer restarts on resume."""

    def __init__(
        self,
        directory: Path,
        saved: SavedHead | None,
        target: dict[str, Any],
        settings: dict[str, Any],
        records: dict[str, int],
    ) -> None:
        self.directory = directory
        self.saved = saved
        self.target = target
        self.settings = settings
        self.records = records  # training_records, held_back_records, held_back_every
        self.sessions = list(saved.description.get("sessions", [])) if saved else []
        self.started_from = saved.description.get("started_from") if saved else None
        self.session = {"cpu": cpu_identity(), "date": "", "seconds": 0.0, "steps": 0}
        self.start = Position()

    def history(self) -> dict[str, Any]:
        """Where the weights came from and every sitting that trained them
        (the one running now included once it took a step), for head.json."""
        sessions = [*self.sessions, dict(self.session)] if self.session["steps"] else self.sessions
        started = {"started_from": self.started_from} if self.started_from else {}
        return {**started, "sessions": sessions}

    def resume(
        self,
        head: DraftHead,
        optimizer: torch.optim.Optimizer,
        on_message: Callable[[str], None] | None,
    ) -> Position | None:
        if self.saved is None:
            return None
        say = on_message or (lambda message: None)
        with torch.no_grad():
            for name, value in head.state_dict().items():
                value.copy_(self.saved.weights[name].to(value.dtype))
        progress = self.saved.progress
        names = ("seconds", "tokens", "steps", "epoch", "done_in_epoch")
        position = Position(*(progress[name] for name in names))
        used_records = int(progress.get("training_records", -1))  # -1: started from a head
        if used_records >= 0 and used_records != self.records["training_records"]:
            say(
                f"the data changed since the checkpoint ({progress.get('training_records')} ->"
                f" {self.records['training_records']} training records): a new pass over all"
                " of it starts"
            )
            position.epoch, position.done_in_epoch = position.epoch + 1, 0
        before = self.saved.description.get("settings", {})
        changed = [k for k, v in self.settings.items() if before.get(k) != v]
        if changed:
            say(f"resumed with other settings than the checkpoint's: {', '.join(changed)}")
        self.start = Position(**asdict(position))
        return position

    def save(
        self,
        head: DraftHead,
        optimizer: torch.optim.Optimizer,
        position: Position,
        agreement: tuple[float, ...],
    ) -> None:
        self.session.update(
            cpu=processor_name(head.token_ids.device),
            date=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            seconds=round(position.seconds - self.start.seconds, 1),
            steps=position.steps - self.start.steps,
        )
        description = {
            "target": self.target,
            "settings": self.settings,
            "progress": {
                **asdict(position),
                "seconds": round(position.seconds, 2),
                **self.records,
                "held_back_agreement": [round(a, 4) for a in agreement],
            },
            **self.history(),  # a sitting that took no step is not one
        }
        write_checkpoint(self.directory, head, description)
