"""Draft heads: the network, its files, the drafter, the session and `distill`."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specrepl.app.commands.registry import REGISTRY
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.drafters.draft_head import DraftHead, HeadCache
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import (
    HeadLoadError,
    load_head,
    resolve_head,
    save_head,
    target_fingerprint,
)
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_head, tiny_llama, tiny_tokenizer
from specrepl.train.data import batched_generate, target_features
from specrepl.train.training import TrainSettings, evaluate_head

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=4)


@pytest.fixture(scope="module")
def head(target) -> DraftHead:
    return tiny_head(target, draft_vocab=24)


@pytest.fixture(scope="module")
def head_dir(head, target, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("head")
    save_head(
        head, directory, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    return directory


def test_unrolled_training_passes_match_drafting_step_by_step(target) -> None:
    """Pass j of `unrolled` at position t is exactly what drafting sees at draft j."""
    torch.manual_seed(0)
    head = DraftHead.for_target(target, torch.arange(20)).eval()
    features, tokens = torch.randn(1, 10, 32), torch.randint(0, 32, (1, 10))
    positions = torch.arange(10)[None]
    with torch.no_grad():
        passes = head.unrolled(features, tokens, 3)
        assert torch.allclose(passes[0], head.step(features, tokens, positions), atol=1e-5)
        cache = HeadCache()
        head.step(features[:, :7], tokens[:, :7], positions[:, :7], cache)  # real features 0..6
        second = head.step(passes[0][:, 6:7], tokens[:, 7:8], positions[:, 7:8], cache)
        third = head.step(second, tokens[:, 8:9], positions[:, 8:9], cache)
    assert torch.allclose(second, passes[1][:, 7:8], atol=1e-5)
    assert torch.allclose(third, passes[2][:, 8:9], atol=1e-5)


def test_top_k_agreement_grows_with_k_and_is_whole_over_the_draft_vocabulary(target, head) -> None:
    """`evaluate_head(top=k)`: the target's token among the head's k likeliest;
    k=1 is top-1 agreement, and k = the draft vocabulary holds every label."""
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(4, 32, (6,), generator=generator).tolist() for _ in range(6)]
    generated = batched_generate(
        target, prompts, max_new_tokens=16, end_tokens=[3], pad_id=0, keep_features=False
    )
    features = target_features(target, generated.ids, pad_id=0)
    records = [
        {"ids": ids, "features": f, "prompt_length": length}
        for ids, f, length in zip(generated.ids, features, generated.prompt_lengths, strict=True)
    ]
    settings = TrainSettings(depth=3, batch_sequences=4)
    by_k = {k: evaluate_head(head, records, settings, torch.float32, top=k) for k in (1, 2, 24)}
    assert by_k[1] == evaluate_head(head, records, settings, torch.float32)
    assert all(a <= b for a, b in zip(by_k[1], by_k[2], strict=True))
    assert by_k[2] != by_k[1]  # the trained head's second guess is sometimes the right one
    assert by_k[24] == (1.0, 1.0, 1.0)


def test_a_rollback_forgets_the_drafted_positions(target) -> None:
    torch.manual_seed(0)
    head = DraftHead.for_target(target, torch.arange(20)).eval()
    features, tokens = torch.randn(1, 6, 32), torch.randint(0, 32, (1, 6))
    positions = torch.arange(6)[None]
    with torch.no_grad():
        cache = HeadCache()
        head.step(features[:, :4], tokens[:, :4], positions[:, :4], cache)
        head.step(torch.randn(1, 2, 32), tokens[:, 4:], positions[:, 4:], cache)  # drafts
        cache.rollback_to(4)
        again = head.step(features[:, 4:], tokens[:, 4:], positions[:, 4:], cache)
        whole = head.step(features, tokens, positions)
    assert cache.length == 6
    assert torch.allclose(again, whole[:, 4:], atol=1e-5)


def test_trained_head_drafts_only_its_vocabulary_and_keeps_greedy_output(target, head) -> None:
    drafter = HeadDrafter(head)
    allowed = set(head.token_ids.tolist())
    drafted: list[int] = []
    for prompt in ([1, 17, 4, 30, 8], [1, 5, 9, 12, 9, 5]):
        reference = autoregressive_generate(prompt, target, max_gen_len=30)
        result = speculative_generate(
            prompt,
            drafter,
            target,
            gamma=4,
            max_gen_len=30,
            on_step=lambda event: drafted.extend(event.drafts),
        )
        assert result.token_ids == reference.token_ids
        assert set(drafted) <= allowed
        assert result.accepted > 0, "a trained head should get some drafts accepted"


def test_save_and_load_give_the_same_drafts(target, head, head_dir) -> None:
    loaded, description = load_head(head_dir, target)
    assert description["target"]["fingerprint"] == target_fingerprint(target)
    prompt = [1, 17, 4, 30, 8]
    steps_a: list[tuple[int, ...]] = []
    steps_b: list[tuple[int, ...]] = []
    # The file holds the head's own weights in bfloat16; the target's embedding
    # and output rows it borrows are not in the file and stay the target's.
    rounded = copy.deepcopy(head)
    rounded.load_state_dict(
        {name: value.to(torch.bfloat16).float() for name, value in head.state_dict().items()}
    )
    for name, value in rounded.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[name]), name
    assert torch.equal(rounded.embedding, loaded.embedding)
    assert torch.equal(rounded.output_rows, loaded.output_rows)
    speculative_generate(
        prompt,
        HeadDrafter(rounded),
        target,
        gamma=3,
        max_gen_len=20,
        on_step=lambda e: steps_a.append(e.drafts),
    )
    speculative_generate(
        prompt,
        HeadDrafter(loaded),
        target,
        gamma=3,
        max_gen_len=20,
        on_step=lambda e: steps_b.append(e.drafts),
    )
    assert steps_a == steps_b


def test_a_head_for_another_target_is_refused_naming_both(head_dir) -> None:
    other = tiny_llama(32, seed=5)
    with pytest.raises(HeadLoadError, match="trained for tiny") as refused:
        load_head(head_dir, other)
    assert target_fingerprint(other) in str(refused.value)


def test_damaged_head_files_are_refused_with_the_path(head_dir, target, tmp_path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "head.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(HeadLoadError, match="cannot be read"):
        load_head(broken, target)
    with pytest.raises(HeadLoadError, match="no draft head"):
        load_head(tmp_path / "missing", target)
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "head.json").write_bytes((head_dir / "head.json").read_bytes())
    (cut / "head.safetensors").write_bytes((head_dir / "head.safetensors").read_bytes()[:100])
    with pytest.raises(HeadLoadError, match="weights"):
        load_head(cut, target)


def test_fingerprint_is_the_same_in_bfloat16_and_differs_for_other_weights(target) -> None:
    copy = tiny_llama(32, seed=4).to(torch.bfloat16)
    assert target_fingerprint(copy) == target_fingerprint(target)
    assert target_fingerprint(tiny_llama(32, seed=6)) != target_fingerprint(target)


def _session(target) -> ChatSession:
    return ChatSession(ModelPair.from_models(target, None, tiny_tokenizer(32)))


def test_session_switches_to_the_head_drafter_by_command(target, head_dir) -> None:
    session = _session(target)
    assert not session.settings.speculative  # no drafter model: the model kind cannot run
    REGISTRY.dispatch(session, f"/drafter_kind head {head_dir}")
    REGISTRY.dispatch(session, "/speculative on")
    assert session.settings.drafter_kind == "head"
    answer = session.answer("w9 w10 w11")
    assert answer.refusal is None
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids


def test_session_refuses_a_head_kind_without_a_usable_head(target, head_dir, tmp_path) -> None:
    session = _session(target)
    before = session.settings
    with pytest.raises(SettingError, match="needs a draft head"):
        session.update(drafter_kind="head")
    with pytest.raises(SettingError, match="no draft head"):
        session.update(drafter_kind="head", drafter_head=str(tmp_path / "nowhere"))
    with pytest.raises(SettingError, match="trained for"):
        ChatSession(ModelPair.from_models(tiny_llama(32, seed=5), None, tiny_tokenizer(32))).update(
            drafter_kind="head", drafter_head=str(head_dir)
        )
    assert session.settings == before


def test_hybrid_uses_the_head_when_one_is_set(target, head_dir) -> None:
    session = ChatSession(
        ModelPair.from_models(target, None, tiny_tokenizer(32)),
        Settings(drafter_kind="hybrid", drafter_head=str(head_dir)),
    )
    assert session.settings.speculative  # hybrid with a head needs no drafter model
    answer = session.answer("w9 w10 w9 w10")
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids


def test_embedded_resolves_to_the_shipped_head() -> None:
    assert resolve_head("embedded") == ROOT / "specrepl" / "heads" / "smollm2-135m-instruct"
    assert resolve_head("~/x") == Path.home() / "x"


def test_distill_command_trains_writes_and_resumes(tmp_path) -> None:
    """`python infer.py distill` on a tiny target: prompts, answers, training, a
    head directory; a second run with the same flags resumes from the checkpoint."""
    model_dir = tmp_path / "model"
    tiny_llama(32, seed=4).save_pretrained(model_dir)
    tiny_tokenizer(32).save_pretrained(model_dir)
    out, work = tmp_path / "head", tmp_path / "work"
    command = [
        sys.executable,
        str(ROOT / "infer.py"),
        "--target",
        str(model_dir),
        "--drafter",
        "none",
        "distill",
        "--out",
        str(out),
        "--work",
        str(work),
        "--prompts",
        "24",
        "--data-tokens",
        "300",
        "--answer-tokens",
        "16",
        "--minutes",
        "0.05",
        "--draft-vocab",
        "20",
        "--depth",
        "2",
    ]
    env = {
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PATH": "/usr/bin:/bin",
        "SPECREPL_CACHE_DIR": str(tmp_path / "cache"),
    }
    first = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    description = json.loads((out / "head.json").read_text())
    assert description["draft_vocab"] == 20
    assert description["data"]["prompt_count"] >= 1
    assert len(description["held_back_agreement"]) == 2
    assert description["training"]["batch_sequences"] == 1  # by device: one answer a step on a CPU
    assert (work / "prompts.jsonl").exists() and (work / "checkpoint.pt").exists()
    target = tiny_llama(32, seed=4)
    load_head(out, target)  # made for this target
    steps = description["training"]["steps"]
    # the budget is spent: a rerun resumes, trains no further and writes the same head
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stderr
    assert json.loads((out / "head.json").read_text())["training"]["steps"] == steps
    # damaged work files are made again, each with one line, and the run still ends well
    shard = sorted(work.glob("shard-*.pt"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # cut short
    checkpoint = work / "checkpoint.pt"
    checkpoint.write_bytes(b"\0" * checkpoint.stat().st_size)  # zero-filled
    third = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert third.returncode == 0, third.stderr
    said = "".join((third.stdout + third.stderr).split())  # as printed, folded or not
    assert f"theanswershard{shard}isdamaged" in said and "itismadeagain" in said
    assert f"thetrainingcheckpoint{checkpoint}isdamaged" in said and "trainingstartsover" in said
    assert "Traceback" not in said
    torch.load(shard, weights_only=True)  # whole again
    load_head(out, target)
