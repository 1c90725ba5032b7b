"""One writer at a time in a distill data or checkpoint directory.

Two `distill --data DIR` runs appending at once would both take the next
shard's name, and the manifest written last would forget the other's shard;
two trainings would overwrite each other's checkpoint. The second one is
refused at once, with who holds the directory, and changes nothing. Tiny
random targets (specrepl/testing.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specrepl.app import cli
from specrepl.store.exclusive import Busy, held_exclusively
from specrepl.testing import tiny_llama, tiny_tokenizer
from specrepl.train.distill import ANSWERS_LOCK, TRAINING_LOCK
from specrepl.train.shards import MANIFEST

HOLD = """
import sys
from pathlib import Path
from specrepl.store.exclusive import held_exclusively
with held_exclusively(Path(sys.argv[1]), "a test holding it"):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_second_process_is_refused_until_the_holder_ends_however_it_ends(
    tmp_path: Path,
) -> None:
    lock = tmp_path / "directory" / ".answers.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(Busy) as refused, held_exclusively(lock, "distill writing answers"):
            pytest.fail("took a lock another process holds")
        message = str(refused.value)
        assert str(lock.parent) in message and "is in use" in message
        assert "a test holding it" in message and f"process {holder.pid}" in message
        holder.send_signal(signal.SIGKILL)  # no chance to clean up
        holder.wait(timeout=30)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with held_exclusively(lock, "distill writing answers"):
        assert "distill writing answers" in lock.read_text(encoding="utf-8")
    with held_exclusively(lock, "again"):  # released when the block ends
        pass


def test_the_same_lock_taken_twice_in_one_process_is_refused_too(tmp_path: Path) -> None:
    lock = tmp_path / ".training.lock"
    with (
        held_exclusively(lock, "the first"),
        pytest.raises(Busy, match="the first"),
        held_exclusively(lock, "the second"),
    ):
        pytest.fail("took a lock already held")


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    tiny_llama(32, seed=4).save_pretrained(tmp_path / "model")
    tiny_tokenizer(32).save_pretrained(tmp_path / "model")
    return ["--drafter", "none", "--target", str(tmp_path / "model")]


def data_flags(directory: Path, tokens: int) -> list[str]:
    return [
        "distill",
        "--data",
        str(directory),
        "--data-tokens",
        str(tokens),
        "--answer-tokens",
        "8",
    ]


def held_answer_tokens(directory: Path) -> int:
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    return sum(int(shard["answer_tokens"]) for shard in manifest["shards"])


def data_files(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if not path.name.endswith(".lock"))


def test_a_second_answer_writer_is_refused_and_changes_nothing(
    tmp_path: Path, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "data"
    assert cli.main([*target, *data_flags(directory, 60), "--data-only"]) == 0
    before = {name: (directory / name).read_bytes() for name in data_files(directory)}
    more = held_answer_tokens(directory) + 1
    with held_exclusively(directory / ANSWERS_LOCK, "distill writing answers"):
        assert cli.main([*target, *data_flags(directory, more), "--data-only"]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert "is in use: distill writing answers (process" in said and "Traceback" not in said
        assert {name: (directory / name).read_bytes() for name in data_files(directory)} == before
        # a run that needs no more answers only reads them: the writer does not stop it
        assert cli.main([*target, *data_flags(directory, 60), "--data-only"]) == 0
    assert cli.main([*target, *data_flags(directory, more), "--data-only"]) == 0
    assert held_answer_tokens(directory) >= more and len(data_files(directory)) > len(before)
    assert MANIFEST in data_files(directory)


def test_a_second_training_from_the_same_checkpoint_is_refused(
    tmp_path: Path, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "data"
    assert cli.main([*target, *data_flags(directory, 60), "--data-only"]) == 0
    training = [*data_flags(directory, 60), "--minutes", "0.01", "--out", str(tmp_path / "head")]
    with held_exclusively(directory / "checkpoint" / TRAINING_LOCK, "distill training a head"):
        assert cli.main([*target, *training]) == 2
        said = " ".join(capsys.readouterr().err.split())
        assert "is in use: distill training a head (process" in said and "Traceback" not in said
        assert data_files(directory / "checkpoint") == []
        assert not (tmp_path / "head").exists()
