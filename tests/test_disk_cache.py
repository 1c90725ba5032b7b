"""`python infer.py cache`: what specrepl keeps on disk, its state, and clearing it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from specrepl.app import cli
from specrepl.app.disk_cache import KINDS, clear, stored_items
from specrepl.models.gguf import MARKER, PARTIAL_PREFIX


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory of its own (never the test session's shared one), with one
    thing of every kind: a damaged model copy and an unfinished conversion, width
    plans one of which is old, a distill run, a prompt history and llama.cpp trials."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(root))
    monkeypatch.setenv("SPECREPL_HISTORY", str(tmp_path / "state" / "history"))
    copy = root / "gguf" / "model-0123"
    copy.mkdir(parents=True)
    (copy / "model.safetensors").write_bytes(b"\0" * 1000)  # no marker: damaged
    (root / "gguf" / f"{PARTIAL_PREFIX}model-0123-x").mkdir()
    (root / "gguf-f32").mkdir()
    (root / "gguf-f32" / "model-0123abcd-f32-v1.gguf").write_bytes(b"GGUF" + b"\0" * 96)
    now = time.time()
    plans = {
        "a": {"seconds": {"1": 0.01}, "measured_at": now, "spread": 0.01},
        "b": {"seconds": {"1": 0.01}, "measured_at": now - 90 * 86400, "spread": 0.01},
    }
    (root / "widths.json").write_text(json.dumps(plans))
    choices = {"c": {"source": "head", "seconds": {"head": 1, "model": 2}, "measured_at": now}}
    (root / "draft-choices.json").write_text(json.dumps(choices))
    run = root / "distill" / "f00d"
    run.mkdir(parents=True)
    (run / "prompts.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (run / "shard-00000.pt").write_bytes(b"x" * 300)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "history").write_text("\n# t\n+hello\n")
    trials = {"k1": {"ok": True, "problem": None}, "k2": {"ok": False, "problem": "crashed"}}
    (root / "llamacpp-trials.json").write_text(json.dumps(trials))
    return root


def states(kind: str) -> list[str]:
    return [item.state for item in stored_items() if item.kind == kind]


def test_every_kind_is_listed_with_its_state(cache: Path) -> None:
    items = stored_items()
    assert {item.kind for item in items} == set(KINDS)
    models = {item.path.name: item for item in items if item.kind == "models"}
    assert not models["model-0123"].healthy and "damaged" in models["model-0123"].state
    assert "unfinished" in models[f"{PARTIAL_PREFIX}model-0123-x"].state
    assert "float32 GGUF file for llama.cpp" in models["model-0123abcd-f32-v1.gguf"].state
    assert states("widths") == ["2 plans, 1 to be measured again (older than 30 days or undated)"]
    assert states("choices") == ["1 choice"]
    assert states("distill") == ["2 prompts, 1 answer shard"]
    assert states("history") == ["3 lines"]
    assert states("llamacpp") == [
        "2 trials of llama.cpp, 1 failed (llama.cpp is not used for those)"
    ]
    assert sum(item.size for item in items if item.kind == "distill") > 300


def test_a_broken_widths_file_is_listed_as_such(cache: Path) -> None:
    (cache / "widths.json").write_text("{not json")
    assert states("widths") == ["not readable (measured again and rewritten on next start)"]


def test_a_broken_trials_file_is_listed_as_such(cache: Path) -> None:
    (cache / "llamacpp-trials.json").write_text("[1, 2")
    assert states("llamacpp") == [
        "not readable (tried again and rewritten when llama.cpp is next used)"
    ]


def test_clear_removes_only_the_kinds_named(cache: Path) -> None:
    removed = clear(["models", "widths"])
    assert {item.kind for item in removed} == {"models", "widths"}
    assert not (cache / "widths.json").exists()
    assert list((cache / "gguf").iterdir()) == []
    assert list((cache / "gguf-f32").iterdir()) == []
    assert {item.kind for item in stored_items()} == {"choices", "distill", "history", "llamacpp"}


def test_the_cache_command_lists_and_clears(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cache"]) == 0
    listing = capsys.readouterr().out
    for word in (*KINDS, "damaged", "total"):
        assert word in listing
    # without a terminal to ask on, clearing needs --yes, and nothing changes
    assert cli.main(["cache", "clear", "distill"]) == 2
    assert "--yes" in capsys.readouterr().out
    assert (cache / "distill" / "f00d").is_dir()
    assert cli.main(["cache", "clear", "distill", "--yes"]) == 0
    assert "cleared 1 item" in capsys.readouterr().out
    assert not (cache / "distill" / "f00d").exists()
    assert cli.main(["cache", "clear", "all", "-y"]) == 0
    capsys.readouterr()
    assert stored_items() == []
    assert cli.main(["cache"]) == 0
    assert "nothing stored" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["cache", "clear"], ["cache", "clear", "models", "bogus"],
                                  ["cache", "list", "models"]])  # fmt: skip
def test_bad_cache_commands_change_nothing(
    cache: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    before = sorted(str(p) for p in cache.rglob("*"))
    assert cli.main(argv) == 2
    assert sorted(str(p) for p in cache.rglob("*")) == before
    assert (cache / "gguf" / "model-0123" / "model.safetensors").exists()
    assert not (cache / "gguf" / "model-0123" / MARKER).exists()
