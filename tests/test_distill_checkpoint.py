"""Training that resumes from the compact checkpoint kept with `--data`: the
held-back records and the draft vocabulary stay fixed while shards are
appended, the weights and the progress come back, another target's checkpoint
is refused, and the files stay about 2 bytes a parameter.

Tiny random targets (specrepl/testing.py): every test runs in a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specrepl.engine.drafters.draft_head import head_parameters
from specrepl.engine.drafters.head_store import save_head, target_fingerprint
from specrepl.testing import tiny_llama
from specrepl.train.checkpoint import (
    CHECKPOINT_JSON,
    CHECKPOINT_WEIGHTS,
    CheckpointRefused,
    start_from_head,
)
from specrepl.train.distill import training_records
from specrepl.train.shards import TokenData, TokenRecord
from specrepl.train.training import (
    TrainProgress,
    TrainSettings,
    TrainState,
    choose_draft_vocabulary,
    split_by_layout,
    train_head,
)

VOCAB = 32
END = 3


def append_shard(data: TokenData, seed: int, words: tuple[int, int], count: int = 40) -> None:
    """A shard of `count` records whose answers use ids in [words[0], words[1])."""
    generator = np.random.default_rng(seed)
    records = []
    for _ in range(count):
        prompt = generator.integers(4, VOCAB, int(generator.integers(3, 8)))
        answer = generator.integers(words[0], words[1], int(generator.integers(4, 16)))
        records.append(TokenRecord(np.concatenate((prompt, answer)), int(prompt.shape[0])))
    data.append(
        records,
        recipe={"prompts": "test"},
        cpu_seconds=0.0,
        wall_seconds=0.0,
        cpu="test",
        date="2026-11-25",
        made_by="test",
    )


def new_data(directory: Path) -> TokenData:
    return TokenData.open(directory, name="tiny", fingerprint="0" * 16, vocab_size=VOCAB)


def settings(tokens: int, draft_vocab: int = 12, fused_layers=()) -> TrainSettings:
    return TrainSettings(
        draft_vocab=draft_vocab,
        fused_layers=fused_layers,
        batch_sequences=8,
        max_minutes=10.0,
        max_tokens=tokens,
        holdout=0.1,
        checkpoint_seconds=1e9,
    )


def train(target, data: TokenData, checkpoint: Path, tokens: int, **kw) -> TrainState:
    return train_head(
        target,
        training_records(data),
        settings(tokens, **kw),
        checkpoint.parent / "unused-work",
        end_tokens=[END],
        vocab_size=VOCAB,
        checkpoint_directory=checkpoint,
    )


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=0)


def places(records: list[dict]) -> set[tuple[int, int]]:
    return {(int(r["shard"]), int(r["index"])) for r in records}


def test_the_held_back_records_stay_held_back_when_a_shard_is_appended(tmp_path: Path) -> None:
    data = new_data(tmp_path)
    append_shard(data, 0, (4, 20))
    append_shard(data, 1, (4, 20))
    held, training = split_by_layout(training_records(data), 0.1)
    append_shard(data, 2, (4, 20))
    held_after, training_after = split_by_layout(training_records(data), 0.1)
    assert places(held) < places(held_after)
    assert places(training) < places(training_after)
    assert not places(held_after) & places(training_after)
    assert 0 < len(held_after) < len(training_after)


def test_a_resume_after_appending_data_keeps_the_draft_vocabulary(target, tmp_path: Path) -> None:
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 16))
    checkpoint = tmp_path / "data" / "checkpoint"
    first = train(target, data, checkpoint, tokens=200)
    kept = first.head.token_ids.clone()
    before = json.loads((checkpoint / CHECKPOINT_JSON).read_text())["progress"]
    for seed in (1, 2, 3):  # answers in other words: counted afresh, the vocabulary would change
        append_shard(data, seed, (16, VOCAB))
    _, training = split_by_layout(training_records(data), 0.1)
    assert not torch.equal(choose_draft_vocabulary(training, 12, [END], VOCAB), kept)
    second = train(target, data, checkpoint, tokens=400)
    assert second.resumed
    assert torch.equal(second.head.token_ids.cpu(), kept.cpu())
    after = json.loads((checkpoint / CHECKPOINT_JSON).read_text())["progress"]
    assert after["training_records"] == len(training) > before["training_records"]


def test_a_resume_loads_the_weights_and_continues_the_steps(target, tmp_path: Path) -> None:
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 20))
    checkpoint = tmp_path / "data" / "checkpoint"
    first = train(target, data, checkpoint, tokens=300)
    assert not first.resumed and first.steps > 0
    trained = {k: v.to(torch.bfloat16) for k, v in first.head.state_dict().items()}
    same_budget = train(target, data, checkpoint, tokens=300)  # nothing left: no step taken
    assert same_budget.resumed and same_budget.steps == first.steps
    for name, value in same_budget.head.state_dict().items():
        assert torch.equal(value.to(torch.bfloat16), trained[name]), name
    more = train(target, data, checkpoint, tokens=600)
    assert more.steps > first.steps and more.tokens >= 600
    progress = json.loads((checkpoint / CHECKPOINT_JSON).read_text())["progress"]
    assert (progress["steps"], progress["tokens"]) == (more.steps, more.tokens)


def test_another_targets_or_vocabulary_sizes_checkpoint_is_refused(target, tmp_path: Path) -> None:
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 20))
    checkpoint = tmp_path / "data" / "checkpoint"
    train(target, data, checkpoint, tokens=100)
    with pytest.raises(CheckpointRefused, match="made for another target"):
        train(tiny_llama(VOCAB, seed=1), data, checkpoint, tokens=100)
    with pytest.raises(CheckpointRefused, match="draft vocabulary of 12 tokens, not 16"):
        train(target, data, checkpoint, tokens=100, draft_vocab=16)
    with pytest.raises(CheckpointRefused, match="another shape"):
        train(target, data, checkpoint, tokens=100, fused_layers=(1,))


def test_a_fused_head_resumes_from_its_checkpoint(target, tmp_path: Path) -> None:
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 20))
    checkpoint = tmp_path / "data" / "checkpoint"
    first = train(target, data, checkpoint, tokens=300, fused_layers=(1,))
    assert first.head.config.fused_layers == (1,)
    more = train(target, data, checkpoint, tokens=600, fused_layers=(1,))
    assert more.resumed and more.steps > first.steps


def test_the_checkpoint_is_about_two_bytes_a_parameter(target, tmp_path: Path) -> None:
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 20))
    checkpoint = tmp_path / "data" / "checkpoint"
    state = train(target, data, checkpoint, tokens=100)
    parameters = head_parameters(state.head)
    description = (checkpoint / CHECKPOINT_JSON).stat().st_size
    weights = (checkpoint / CHECKPOINT_WEIGHTS).stat().st_size
    assert description < 4096
    # bfloat16 weights, int32 token ids, the JSON again in the header, 2 KB of tensor headers
    assert weights <= 2.2 * parameters + 4 * 12 + description + 2048
    tensors = load_file(str(checkpoint / CHECKPOINT_WEIGHTS))
    assert all(v.dtype == torch.bfloat16 for k, v in tensors.items() if k != "token_ids")


def test_training_can_start_from_a_saved_head(target, tmp_path: Path) -> None:
    """`distill --from-head`: the checkpoint starts as the head's weights and
    vocabulary, training resumes from them with a schedule of its own, and an
    existing checkpoint is never overwritten."""
    data = new_data(tmp_path / "data")
    append_shard(data, 0, (4, 20))
    trained = train(target, data, tmp_path / "first", tokens=300).head
    about = {"name": "tiny", "fingerprint": target_fingerprint(target), "vocab_size": VOCAB}
    checkpoint = tmp_path / "data" / "checkpoint"
    kept = settings(200).as_dict()
    assert start_from_head(checkpoint, trained, target=about, settings=kept, source="first")
    assert not start_from_head(checkpoint, trained, target=about, settings=kept, source="again")
    started = json.loads((checkpoint / CHECKPOINT_JSON).read_text())
    assert started["started_from"] == "first" and started["progress"]["steps"] == 0
    saved = load_file(str(checkpoint / CHECKPOINT_WEIGHTS))
    for name, value in trained.state_dict().items():
        assert torch.equal(saved[name], value.to(torch.bfloat16)), name
    resumed = train(target, data, checkpoint, tokens=200)
    assert resumed.resumed and resumed.steps > 0
    assert torch.equal(resumed.head.token_ids.cpu(), trained.token_ids.cpu())
    # the head's origin and the sitting outlive the checkpoint's saves, for head.json
    kept_json = json.loads((checkpoint / CHECKPOINT_JSON).read_text())
    assert kept_json["started_from"] == "first" and len(kept_json["sessions"]) == 1
    assert resumed.history == {k: kept_json[k] for k in ("started_from", "sessions")}
    assert resumed.history["sessions"][0]["steps"] == resumed.steps
    # a sitting with nothing left to train (the budget used) adds no session
    again = train(target, data, checkpoint, tokens=200)
    assert again.steps == resumed.steps and len(again.history["sessions"]) == 1
    after = json.loads((checkpoint / CHECKPOINT_JSON).read_text())
    assert after["sessions"] == kept_json["sessions"]


def test_from_head_refusals_reach_the_command_line(tmp_path: Path, capsys) -> None:
    from specrepl.app import cli
    from specrepl.testing import tiny_tokenizer

    for seed in (4, 5):
        tiny_llama(VOCAB, seed=seed).save_pretrained(tmp_path / f"model{seed}")
        tiny_tokenizer(VOCAB).save_pretrained(tmp_path / f"model{seed}")
    model = ["--drafter", "none", "--target"]
    flags = ["distill", "--from-head", str(tmp_path / "head"), "--out", str(tmp_path / "out")]
    assert cli.main([*model, str(tmp_path / "model4"), *flags]) == 2
    assert "--from-headneeds--dataDIR" in "".join(capsys.readouterr().err.split())
    head = train(tiny_llama(VOCAB, seed=5), new_data(tmp_path / "d5"), tmp_path / "c5", 1).head
    about = {
        "target": {"name": "tiny", "fingerprint": target_fingerprint(tiny_llama(VOCAB, seed=5))}
    }
    save_head(head, tmp_path / "head", about)
    data = ["--data", str(tmp_path / "d4"), "--data-tokens", "60", "--answer-tokens", "6"]
    assert cli.main([*model, str(tmp_path / "model4"), *flags, *data, "--minutes", "0.01"]) == 2
    said = "".join(capsys.readouterr().err.split())
    assert "notforthistarget" in said and "Traceback" not in said


def test_progress_says_how_much_of_the_time_went_to_features(target, tmp_path: Path) -> None:
    from specrepl.app.render.distill import pace_text

    data = new_data(tmp_path / "data")
    append_shard(data, seed=1, words=(3, 9))
    reports: list[TrainProgress] = []
    train_head(
        target,
        training_records(data),
        settings(600),
        tmp_path / "unused-work",
        end_tokens=[END],
        vocab_size=VOCAB,
        checkpoint_directory=tmp_path / "checkpoint",
        progress=reports.append,
    )
    last = reports[-1]
    # ids-only records: the first pass computes every training record's features
    assert 0.0 < last.feature_seconds < last.seconds
    assert [r.feature_seconds for r in reports] == sorted(r.feature_seconds for r in reports)
    assert "tokens/s" in pace_text(last) and "on features" in pace_text(last)
    assert pace_text(TrainProgress(0.0, 60.0, 0, 0, float("nan"))) == "starting"
