"""Token-id data for a draft head, compact enough to keep in a repository.

A data directory holds what the target wrote (prompt and answer token ids),
never its features: those are recomputed from the ids when training starts
(about 1.1 KB a token for a 576-wide target in bfloat16, against about 1.5
bytes a token here). The format, version 1 (docs/draft-heads.md has it too):

    DIR/manifest.json       what the data is for and how each shard was made
    DIR/shard-00000.npz     numpy `savez_compressed` archives, numbered from 0
    DIR/shard-00001.npz     ...

A shard holds three arrays:

- `ids`: the token ids of every record, prompt then answer, one record after
  another; `uint16` when the vocabulary has at most 65536 tokens, else `uint32`;
- `offsets`: `int64`, one more than the records: record i is
  `ids[offsets[i]:offsets[i + 1]]` (`offsets[0]` is 0, the last is `len(ids)`);
- `prompt_lengths`: `uint32`: the first `prompt_lengths[i]` ids of record i are
  its prompt (the chat template up to the assistant's turn), the rest its answer.

`manifest.json` names the format and version, the target (`name`,
`fingerprint` as `head_store.target_fingerprint` computes it, `vocab_size`),
and lists the shards in order, each with its `file`, `records`,
`prompt_tokens`, `answer_tokens`, `sha256`, the `cpu_seconds` and
`wall_seconds` spent making it, the `cpu` model name, the `date`, `made_by`
and its `recipe` (how the prompts and answers were made).

Only shards listed in the manifest are data. A shard is written whole under
its name first, then the manifest that lists it (each atomically), so an
interrupted run loses at most the shard in progress and the next run appends
after the last shard listed. Reading refuses another target's data, a newer
format or a manifest that does not read, and skips a damaged shard (missing,
cut short, checksum or counts wrong) with one line naming it.

This module knows the format only (numpy arrays and JSON): nothing of models,
tokenizers, torch or training. It never prints: damage is reported through a
callback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specrepl.store.atomic import unreadable, write_atomically, write_text_atomically

__all__ = [
    "FORMAT",
    "MANIFEST",
    "VERSION",
    "DataRefused",
    "DataSummary",
    "ShardDamaged",
    "ShardInfo",
    "TokenData",
    "TokenRecord",
    "decode_shard",
    "encode_shard",
    "id_dtype",
]

FORMAT = "specrepl-token-data"
VERSION = 1
MANIFEST = "manifest.json"


class DataRefused(ValueError):
    """The directory cannot be used for this target: another target's data, a
    newer format, a manifest that does not read."""


class ShardDamaged(ValueError):
    """One shard does not match what the manifest says of it."""


@dataclass(frozen=True)
class TokenRecord:
    """One prompt and its answer: `ids` (prompt then answer) and the prompt's length."""

    ids: np.ndarray
    prompt_length: int

    @property
    def answer_tokens(self) -> int:
        return int(self.ids.shape[0]) - self.prompt_length


@dataclass(frozen=True)
class ShardInfo:
    """A shard's line in the manifest."""

    file: str
    records: int
    prompt_tokens: int
    answer_tokens: int
    sha256: str
    cpu_seconds: float
    wall_seconds: float
    cpu: str
    date: str
    made_by: str
    recipe: dict[str, Any] = field(default_factory=dict)

    @property
    def number(self) -> int:
        """The shard's number, from its file name (`shard-00003.npz` is 3)."""
        return int(self.file.removeprefix("shard-").removesuffix(".npz"))

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> ShardInfo:
        return cls(
            file=str(entry["file"]),
            records=int(entry["records"]),
            prompt_tokens=int(entry["prompt_tokens"]),
            answer_tokens=int(entry["answer_tokens"]),
            sha256=str(entry.get("sha256", "")),
            cpu_seconds=float(entry.get("cpu_seconds", 0.0)),
            wall_seconds=float(entry.get("wall_seconds", 0.0)),
            cpu=str(entry.get("cpu", "")),
            date=str(entry.get("date", "")),
            made_by=str(entry.get("made_by", "")),
            recipe=dict(entry.get("recipe", {})),
        )


@dataclass(frozen=True)
class DataSummary:
    """What a data directory holds, and what making it cost."""

    directory: Path
    shards: int
    records: int
    prompt_tokens: int
    answer_tokens: int
    cpu_seconds: float
    wall_seconds: float
    bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "directory": str(self.directory)}


def id_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id of the vocabulary."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def encode_shard(records: Sequence[TokenRecord], vocab_size: int) -> dict[str, np.ndarray]:
    """A shard's three arrays; ValueError for an id outside the vocabulary or a
    prompt longer than its record."""
    lengths = [int(record.ids.shape[0]) for record in records]
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = np.concatenate([np.asarray(r.ids, dtype=np.int64) for r in records] or [np.zeros(0)])
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    prompts = np.array([r.prompt_length for r in records], dtype=np.int64)
    if np.any(prompts < 0) or np.any(prompts > np.array(lengths, dtype=np.int64)):
        raise ValueError("a prompt length lies outside its record")
    return {
        "ids": ids.astype(id_dtype(vocab_size)),
        "offsets": offsets,
        "prompt_lengths": prompts.astype(np.uint32),
    }


def decode_shard(arrays: dict[str, np.ndarray], vocab_size: int) -> list[TokenRecord]:
    """The records of a shard's arrays, checked; ShardDamaged says what is wrong."""
    try:
        ids, offsets, prompts = arrays["ids"], arrays["offsets"], arrays["prompt_lengths"]
    except KeyError as error:
        raise ShardDamaged(f"no array {error}") from None
    integers = ids.dtype.kind == "u" and offsets.dtype.kind in "iu" and prompts.dtype.kind in "iu"
    if not integers or not ids.ndim == offsets.ndim == prompts.ndim == 1:
        raise ShardDamaged("arrays of the wrong shape or type")
    if offsets.shape[0] != prompts.shape[0] + 1 or offsets[0] != 0 or offsets[-1] != ids.shape[0]:
        raise ShardDamaged("offsets do not match the ids")
    lengths = np.diff(offsets)
    if np.any(lengths < 0) or np.any(prompts.astype(np.int64) > lengths):
        raise ShardDamaged("a record's offsets or prompt length are out of order")
    if ids.size and int(ids.max()) >= vocab_size:
        raise ShardDamaged(f"a token id is outside the vocabulary of {vocab_size}")
    return [
        TokenRecord(ids[int(start) : int(end)], int(prompt))
        for start, end, prompt in zip(offsets[:-1], offsets[1:], prompts, strict=True)
    ]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class TokenData:
    """An opened data directory for one target (`open` checks the manifest)."""

    directory: Path
    target: dict[str, Any]
    shards: list[ShardInfo]

    @classmethod
    def open(cls, directory: Path, *, name: str, fingerprint: str, vocab_size: int) -> TokenData:
        """The data in `directory` for the target with this fingerprint; an
        absent or empty directory is new data. DataRefused when the directory
        holds another target's data, a newer format, or a manifest that does
        not read."""
        path = directory / MANIFEST
        target = {"name": name, "fingerprint": fingerprint, "vocab_size": vocab_size}
        if not path.exists():
            return cls(directory, target, [])
        manifest = _read_manifest(path)
        stored = manifest.get("target", {})
        if stored.get("fingerprint") != fingerprint:
            raise DataRefused(
                f"{directory} holds data written by another target ({stored.get('name')}, "
                f"fingerprint {stored.get('fingerprint')}), not by {name} (fingerprint "
                f"{fingerprint}): give another --data directory"
            )
        if int(stored.get("vocab_size", -1)) != vocab_size:
            raise DataRefused(
                f"{directory} was written for a vocabulary of {stored.get('vocab_size')} tokens,"
                f" not {vocab_size}"
            )
        try:
            shards = [ShardInfo.from_dict(entry) for entry in manifest.get("shards", [])]
        except (KeyError, TypeError, ValueError) as error:
            raise DataRefused(f"{path} lists a shard it does not describe ({error})") from None
        return cls(directory, {**target, "name": stored.get("name", name)}, shards)

    def next_file(self) -> str:
        """The name of the shard to append: after the last one listed."""
        numbers = [shard.number for shard in self.shards]
        return f"shard-{max(numbers, default=-1) + 1:05d}.npz"

    def append(
        self,
        records: Sequence[TokenRecord],
        *,
        recipe: dict[str, Any],
        cpu_seconds: float,
        wall_seconds: float,
        cpu: str,
        date: str,
        made_by: str,
    ) -> ShardInfo:
        """Write `records` as the next shard, then the manifest that lists it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = self.next_file()
        arrays = encode_shard(records, int(self.target["vocab_size"]))

        def write(file: Path) -> None:
            with file.open("wb") as handle:
                np.savez_compressed(handle, **arrays)

        path = self.directory / name
        write_atomically(path, write)
        lengths = np.diff(arrays["offsets"])
        prompt_tokens = int(arrays["prompt_lengths"].astype(np.int64).sum())
        info = ShardInfo(
            file=name,
            records=len(records),
            prompt_tokens=prompt_tokens,
            answer_tokens=int(lengths.sum()) - prompt_tokens,
            sha256=_sha256(path),
            cpu_seconds=round(cpu_seconds, 2),
            wall_seconds=round(wall_seconds, 2),
            cpu=cpu,
            date=date,
            made_by=made_by,
            recipe=recipe,
        )
        self.shards.append(info)
        self._write_manifest()
        return info

    def _write_manifest(self) -> None:
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "target": self.target,
            "shards": [asdict(shard) for shard in self.shards],
        }
        text = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
        write_text_atomically(self.directory / MANIFEST, text)

    def read_shard(self, shard: ShardInfo) -> list[TokenRecord]:
        """One listed shard's records; ShardDamaged says what is wrong with it."""
        path = self.directory / shard.file
        try:
            if shard.sha256 and _sha256(path) != shard.sha256:
                raise ShardDamaged("its checksum differs from the manifest's")
            with np.load(path, allow_pickle=False) as archive:
                arrays = {key: archive[key] for key in archive.files}
        except ShardDamaged:
            raise
        except Exception as error:
            raise ShardDamaged(unreadable(error)) from None
        records = decode_shard(arrays, int(self.target["vocab_size"]))
        answers = sum(record.answer_tokens for record in records)
        if len(records) != shard.records or answers != shard.answer_tokens:
            raise ShardDamaged("its records or tokens differ from the manifest's")
        return records

    def records(self, on_damaged: Callable[[str], None] | None = None) -> Iterator[TokenRecord]:
        """Every record of every listed shard, in order; a damaged shard is
        skipped with one line to `on_damaged`."""
        for _, _, record in self.numbered_records(on_damaged):
            yield record

    def numbered_records(
        self, on_damaged: Callable[[str], None] | None = None
    ) -> Iterator[tuple[int, int, TokenRecord]]:
        """(shard number, index in the shard, record) for every record of
        every listed shard, in order: a place that appending never changes. A
        damaged shard is skipped with one line to `on_damaged`."""
        for shard in self.shards:
            try:
                records = self.read_shard(shard)
            except ShardDamaged as error:
                if on_damaged is not None:
                    on_damaged(
                        f"the data shard {self.directory / shard.file} is damaged ({error}):"
                        " skipped"
                    )
                continue
            for index, record in enumerate(records):
                yield shard.number, index, record

    def summary(self) -> DataSummary:
        """Totals from the manifest, and the bytes of the listed shards on disk."""
        paths = [self.directory / shard.file for shard in self.shards]
        return DataSummary(
            directory=self.directory,
            shards=len(self.shards),
            records=sum(s.records for s in self.shards),
            prompt_tokens=sum(s.prompt_tokens for s in self.shards),
            answer_tokens=sum(s.answer_tokens for s in self.shards),
            cpu_seconds=round(sum(s.cpu_seconds for s in self.shards), 2),
            wall_seconds=round(sum(s.wall_seconds for s in self.shards), 2),
            bytes=sum(path.stat().st_size for path in paths if path.exists()),
        )


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest's JSON; DataRefused for one that does not read or is newer."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataRefused(f"{path} does not read ({unreadable(error)})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataRefused(f"{path} is not a manifest of {FORMAT} data")
    version = manifest.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise DataRefused(
            f"{path} is format version {version}; this specrepl reads up to version {VERSION}"
        )
    return manifest
