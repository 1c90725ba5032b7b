"""The GPU paths, run only where CUDA is present (CI has none; a lent GPU
machine runs them): greedy speculative decoding equals the target's greedy
output on the GPU for every drafter kind that runs there, and `distill`'s
data writing and head training work with the target on the GPU.

Tiny seeded models built in code, as in the CPU tests."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch

from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import load_head, save_head, target_fingerprint
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.models.pair import ModelPair
from specrepl.store.paths import draft_choices_file, kept_heads_dir
from specrepl.testing import HostReads, perturbed_copy, tiny_head, tiny_llama, tiny_tokenizer
from specrepl.train.accumulate import AnswerRecipe, accumulate_answers, answer_batch_for
from specrepl.train.distill import open_data, training_records
from specrepl.train.training import TrainSettings, train_head

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = ([1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30], [1, 5, 9, 12], [6, 7, 6, 7, 6, 7])
CUDA = torch.device("cuda")


@functools.cache
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=0).to(CUDA)


@functools.cache
def head():
    return tiny_head(target(), draft_vocab=24)


@functools.cache
def fused_head():
    return tiny_head(target(), draft_vocab=24, fused_layers=(1,))


def drafter(kind: str, use_cache: bool):
    copy = perturbed_copy(target(), 0.1, seed=1).to(CUDA)
    return {
        "model": lambda: ModelDrafter(copy, use_cache=use_cache),
        "model-copy": lambda: ModelDrafter(copy, use_cache=use_cache, copy_of_target=True),
        "lookup": lambda: LookupDrafter(3),
        "head": lambda: HeadDrafter(head()),
        "head-fused": lambda: HeadDrafter(fused_head()),
        "hybrid-head": lambda: HybridDrafter(HeadDrafter(head()), LookupDrafter(3), min_match=1),
    }[kind]()


@pytest.mark.parametrize(
    "kind", ["model", "model-copy", "lookup", "head", "head-fused", "hybrid-head"]
)
def test_greedy_speculative_equals_the_target_on_the_gpu(kind: str) -> None:
    for prompt in PROMPTS:
        reference = autoregressive_generate(prompt, target(), max_gen_len=40).token_ids
        for gamma, use_cache in ((1, True), (4, False), (8, True)):
            result = speculative_generate(
                prompt,
                drafter(kind, use_cache),
                target(),
                gamma=make_policy("fixed", gamma),
                max_gen_len=40,
                use_cache=use_cache,
            )
            assert result.token_ids == reference, (kind, gamma, use_cache)


def test_the_head_trained_on_the_gpu_lives_there_and_drafts_right_often() -> None:
    trained = head()
    assert trained.token_ids.device.type == "cuda"
    result = speculative_generate(
        PROMPTS[0], HeadDrafter(trained), target(), gamma=make_policy("fixed", 4), max_gen_len=40
    )
    assert result.accepted > 0


def test_distill_data_and_training_run_with_the_target_on_the_gpu(tmp_path: Path) -> None:
    """Data written on the GPU (prompts sampled there) records the GPU, reads
    back on the CPU side, and trains a head with the committed checkpoint."""
    assert answer_batch_for(CUDA) > answer_batch_for(torch.device("cpu"))
    model = tiny_llama(32, seed=4).to(CUDA)
    pair = ModelPair.from_models(model, None, tiny_tokenizer(32))

    def encode(text: str) -> list[int]:
        return pair.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
        )

    data = open_data(pair, tmp_path / "data")
    recipe = AnswerRecipe.batched(8, max_new_tokens=12, writer_dtype="float32", seed=0)
    accumulate_answers(
        model,
        pair.tokenizer,
        data,
        token_budget=300,
        recipe=recipe,
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=0,
    )
    data = open_data(pair, tmp_path / "data")
    assert data.summary().answer_tokens >= 300
    assert all("(GPU" in shard.cpu for shard in data.shards)
    records = training_records(data)
    prompts = [bytes(r["ids"][: r["prompt_length"]].numpy()) for r in records]
    assert len(set(prompts)) == len(prompts)

    def train(minutes: float):
        settings = TrainSettings(
            draft_vocab=24, batch_sequences=16, max_minutes=minutes, checkpoint_seconds=1e9
        )
        return train_head(
            model,
            records,
            settings,
            tmp_path / "work",
            end_tokens=pair.eos_token_ids,
            vocab_size=32,
            checkpoint_directory=tmp_path / "checkpoint",
        )

    state = train(0.05)
    assert state.steps > 0 and all(0.0 <= a <= 1.0 for a in state.agreement)
    about = {"target": {"name": "tiny", "fingerprint": target_fingerprint(model)}}
    save_head(state.head, tmp_path / "head", about)
    loaded, _ = load_head(tmp_path / "head", model)
    assert loaded.token_ids.device.type == "cuda"
    resumed = train(0.1)  # the same checkpoint, a longer budget
    assert resumed.resumed and resumed.steps > state.steps


def test_features_stay_on_the_gpu_and_match_the_cpus() -> None:
    from specrepl.train.features import FeatureSource
    from specrepl.train.training import _batch

    records = [{"ids": torch.arange(4, 4 + n) % 32, "prompt_length": 3} for n in (9, 16, 23)]
    on_gpu = FeatureSource(target()).with_features([dict(r) for r in records])
    on_cpu = FeatureSource(tiny_llama(32, seed=0)).with_features([dict(r) for r in records])
    for gpu, cpu in zip(on_gpu, on_cpu, strict=True):
        assert gpu["features"].device.type == "cuda"
        torch.testing.assert_close(gpu["features"].cpu(), cpu["features"], rtol=2**-6, atol=1e-3)
    batch = _batch(on_gpu, 32, torch.float32, CUDA)
    assert all(value.device.type == "cuda" for value in batch.values())


def test_a_hybrids_head_auto_is_timed_on_the_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU the hybrid's head "auto" times the head against the drafter
    model there (the store names the GPU), and the answer is the target's
    whichever drafts."""
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path))
    copy = perturbed_copy(target(), 0.1, seed=1).to(CUDA)
    pair = ModelPair.from_models(target(), copy, tiny_tokenizer(32))
    fingerprint = target_fingerprint(target())
    save_head(
        head(), kept_heads_dir() / "tiny", {"target": {"name": "t", "fingerprint": fingerprint}}
    )
    settings = Settings(drafter_kind="hybrid", drafter_head="auto", max_new_tokens=12)
    session = ChatSession(pair, settings)
    answer = session.answer("w5 w6 w7 w8")
    assert answer.refusal is None, answer.refusal
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids
    choice = session.drafters.choice(settings)
    assert set(choice.seconds) == {"head", "model"} and not choice.stored
    (key,) = json.loads(draft_choices_file().read_text(encoding="utf-8"))
    assert torch.cuda.get_device_name(CUDA) in key


def test_the_compiled_static_runtime_gives_the_targets_text_on_the_gpu() -> None:
    """CUDA graphs over the static cache (`engine/static_runtime.py`): the
    compiled buckets and the uncompiled passes beside them keep the text."""
    from specrepl.engine.static_runtime import StaticTorchModel

    compiled = StaticTorchModel(target(), buckets=(1, 5))
    assert compiled.compiled
    compiled.warm_up(repeats=1)
    for prompt in PROMPTS:
        reference = autoregressive_generate(prompt, target(), max_gen_len=40).token_ids
        alone = autoregressive_generate(prompt, compiled, max_gen_len=40).token_ids
        assert alone == reference
        for kind, gamma in (("lookup", 4), ("model", 4), ("model", 8)):
            result = speculative_generate(
                prompt,
                drafter(kind, True),
                compiled,
                gamma=make_policy("fixed", gamma),
                max_gen_len=40,
            )
            assert result.token_ids == reference, (kind, gamma, prompt)


@pytest.mark.parametrize("kind", ["alone", "lookup", "model"])
def test_the_loop_reads_back_from_the_gpu_once_a_step(kind: str) -> None:
    """The loop's own reads back from the GPU (each a wait for its queue): one a
    step, the verification's, as on a CPU (tests/test_device_reads.py); the
    clock's stamps are CUDA events, waited for once a step."""
    loop = ("engine/steps.py", "engine/verification.py", "engine/processors.py",
            "engine/clock.py", "engine/generation.py")  # fmt: skip
    with HostReads() as counted:
        if kind == "alone":
            result = autoregressive_generate(PROMPTS[0], target(), max_gen_len=24)
        else:
            result = speculative_generate(
                PROMPTS[0], drafter(kind, True), target(), gamma=4, max_gen_len=24
            )
    assert counted.made_in(*loop, outside=("engine/drafters/",)) == result.steps
    assert result.target_seconds > 0
