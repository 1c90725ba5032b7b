"""Token-id data kept in a repository: the shard format, appending, resuming,
refusals, and the features recomputed from the ids at training time.

Tiny random targets (specrepl/testing.py): every test runs in a second or two.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from specrepl.app import cli
from specrepl.engine.drafters.head_store import target_fingerprint
from specrepl.models.pair import ModelPair
from specrepl.testing import interrupt_on_call, tiny_llama, tiny_tokenizer
from specrepl.train.accumulate import (
    AnswerRecipe,
    _document_prompts,
    accumulate_answers,
    earlier_answers,
    rate_and_time_left,
)
from specrepl.train.data import batched_generate
from specrepl.train.distill import open_data
from specrepl.train.features import FeatureSource, forward_batch_for
from specrepl.train.prompts import DOCUMENT_TASKS
from specrepl.train.shards import (
    MANIFEST,
    VERSION,
    DataRefused,
    TokenData,
    TokenRecord,
    encode_shard,
    id_dtype,
)

END = 3


def random_records(count: int, vocab_size: int, seed: int) -> list[TokenRecord]:
    generator = np.random.default_rng(seed)
    records = []
    for _ in range(count):
        length = int(generator.integers(2, 40))
        ids = generator.integers(0, vocab_size, length)
        records.append(TokenRecord(ids, int(generator.integers(1, length + 1))))
    return records


def opened(directory: Path, fingerprint: str = "0123456789abcdef", vocab: int = 50_000):
    return TokenData.open(directory, name="t", fingerprint=fingerprint, vocab_size=vocab)


def append(data: TokenData, records: list[TokenRecord]) -> None:
    data.append(
        records,
        recipe={"prompts": "test"},
        cpu_seconds=1.5,
        wall_seconds=2.0,
        cpu="test cpu",
        date="2026-11-25",
        made_by="test",
    )


def same_records(got: list[TokenRecord], expected: list[TokenRecord]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.prompt_length == b.prompt_length
        np.testing.assert_array_equal(a.ids.astype(np.int64), np.asarray(b.ids, dtype=np.int64))


def test_shards_round_trip_through_the_manifest(tmp_path: Path) -> None:
    first, second = random_records(7, 50_000, 1), random_records(5, 50_000, 2)
    data = opened(tmp_path / "data")
    append(data, first)
    append(data, second)
    again = opened(tmp_path / "data")
    same_records(list(again.records()), first + second)
    manifest = json.loads((tmp_path / "data" / MANIFEST).read_text())
    assert manifest["version"] == VERSION and manifest["target"]["vocab_size"] == 50_000
    assert [s["file"] for s in manifest["shards"]] == ["shard-00000.npz", "shard-00001.npz"]
    entry = manifest["shards"][1]
    assert entry["records"] == 5 and entry["cpu_seconds"] == 1.5 and entry["cpu"] == "test cpu"
    assert entry["answer_tokens"] == sum(r.answer_tokens for r in second)
    summary = again.summary()
    assert summary.records == 12 and summary.cpu_seconds == 3.0
    assert summary.prompt_tokens + summary.answer_tokens == sum(len(r.ids) for r in first + second)
    with np.load(tmp_path / "data" / "shard-00000.npz") as archive:
        assert archive["ids"].dtype == np.uint16


def test_ids_take_two_bytes_a_token_below_65537_tokens_and_four_above() -> None:
    assert id_dtype(32) == id_dtype(65_536) == np.uint16
    assert id_dtype(65_537) == np.uint32
    records = random_records(64, 49_152, 3)
    tokens = sum(len(r.ids) for r in records)
    arrays = encode_shard(records, 49_152)
    assert arrays["ids"].itemsize == 2 and arrays["ids"].shape == (tokens,)
    # per record: an 8-byte offset and a 4-byte prompt length, whatever its length
    assert sum(a.nbytes for a in arrays.values()) == 2 * tokens + 12 * len(records) + 8
    with pytest.raises(ValueError, match="token ids must lie"):
        encode_shard([TokenRecord(np.array([5, 40_000]), 1)], 32_000)


def test_an_interrupted_append_is_ignored_and_the_next_run_continues(tmp_path: Path) -> None:
    """What a crash leaves, a half-written temporary file and a whole shard the
    manifest does not list yet, is not data; the next shard takes its place."""
    directory = tmp_path / "data"
    first = random_records(4, 50_000, 4)
    append(opened(directory), first)
    (directory / ".shard-00001.npz.999.tmp").write_bytes(b"PK\x03\x04 half")
    np.savez_compressed(directory / "shard-00001.npz", ids=np.arange(3, dtype=np.uint16))
    data = opened(directory)
    assert data.summary().shards == 1 and data.next_file() == "shard-00001.npz"
    same_records(list(data.records()), first)
    second = random_records(3, 50_000, 5)
    append(data, second)
    same_records(list(opened(directory).records()), first + second)


def test_another_targets_data_or_a_newer_format_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    append(opened(directory, fingerprint="aaaaaaaaaaaaaaaa"), random_records(2, 50_000, 6))
    with pytest.raises(DataRefused, match=r"another target .*aaaaaaaaaaaaaaaa.*bbbbbbbbbbbbbbbb"):
        opened(directory, fingerprint="bbbbbbbbbbbbbbbb")
    with pytest.raises(DataRefused, match="vocabulary of 50000"):
        opened(directory, fingerprint="aaaaaaaaaaaaaaaa", vocab=60_000)
    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / MANIFEST).write_text(json.dumps({**manifest, "version": VERSION + 1}))
    with pytest.raises(DataRefused, match="reads up to version"):
        opened(directory, fingerprint="aaaaaaaaaaaaaaaa")
    (directory / MANIFEST).write_text('{"format": "specrepl-tok')
    with pytest.raises(DataRefused, match="does not read"):
        opened(directory, fingerprint="aaaaaaaaaaaaaaaa")


def test_a_damaged_shard_is_named_and_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    data = opened(directory)
    records = [random_records(3, 50_000, seed) for seed in (7, 8, 9)]
    for chunk in records:
        append(data, chunk)
    cut = directory / "shard-00001.npz"
    cut.write_bytes(cut.read_bytes()[:40])
    (directory / "shard-00002.npz").unlink()
    said: list[str] = []
    same_records(list(opened(directory).records(said.append)), records[0])
    assert len(said) == 2
    assert str(cut) in said[0] and "checksum" in said[0] and "skipped" in said[0]
    assert "shard-00002.npz" in said[1] and "FileNotFoundError" in said[1]


def test_the_refusal_reaches_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`distill --data DIR --data-only` appends for one target and refuses DIR for another."""
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    directory = tmp_path / "data"
    for seed in (4, 5):
        tiny_llama(32, seed=seed).save_pretrained(tmp_path / f"model{seed}")
        tiny_tokenizer(32).save_pretrained(tmp_path / f"model{seed}")
    flags = ["distill", "--data", str(directory), "--data-only", "--data-tokens", "100"]
    flags += ["--answer-tokens", "8"]
    model = ["--drafter", "none", "--target"]
    assert cli.main([*model, str(tmp_path / "model4"), *flags]) == 0
    assert opened(directory, target_fingerprint(tiny_llama(32, seed=4)), 32).summary().shards == 1
    assert cli.main([*model, str(tmp_path / "model5"), *flags]) == 2
    said = "".join(capsys.readouterr().err.split())
    assert "holdsdatawrittenbyanothertarget" in said and "Traceback" not in said
    assert cli.main([*model, str(tmp_path / "model4"), "distill", "--data-only"]) == 2
    assert "--data-onlyneeds--dataDIR" in "".join(capsys.readouterr().err.split())
    bad = ["distill", "--data", str(directory), "--batch-sequences", "-1", "--out", "h"]
    assert cli.main([*model, str(tmp_path / "model4"), *bad]) == 2
    assert "--batch-sequencesmustbeatleast1(or0:bydevice)" in "".join(
        capsys.readouterr().err.split()
    )


@pytest.fixture(scope="module")
def pair() -> ModelPair:
    return ModelPair.from_models(tiny_llama(32, seed=4), None, tiny_tokenizer(32))


def accumulate(pair: ModelPair, directory: Path, tokens: int) -> None:
    def encode(text: str) -> list[int]:
        return pair.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
        )

    accumulate_answers(
        pair.target.model,
        pair.tokenizer,
        open_data(pair, directory),
        token_budget=tokens,
        recipe=AnswerRecipe(max_new_tokens=12, shard_records=8, answer_batch=4, prompt_batch=8),
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=0,
    )


def forward_calls(model: torch.nn.Module, run: Callable[[], object]) -> int:
    """How many forward passes `run` makes."""
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    handle = model.register_forward_hook(count)
    try:
        run()
    finally:
        handle.remove()
    return calls


def test_an_interrupted_run_resumes_into_the_same_data(pair: ModelPair, tmp_path: Path) -> None:
    """Ctrl-C in the middle of the second shard keeps the first whole and leaves
    nothing else; the rerun's directory holds what an uninterrupted run writes
    (each shard's prompts have their own seed), and no prompt appears twice."""
    model = pair.target.model
    accumulate(pair, tmp_path / "whole", 250)
    whole = list(open_data(pair, tmp_path / "whole").records())
    shards = open_data(pair, tmp_path / "whole").shards
    assert len(shards) >= 3
    seeds = [shard.recipe["prompt_seed"] for shard in shards]  # each shard its own prompts
    assert len(set(seeds)) == len(seeds)
    first_shard = forward_calls(model, lambda: accumulate(pair, tmp_path / "one", 1))
    directory = tmp_path / "interrupted"
    with pytest.raises(KeyboardInterrupt), interrupt_on_call(model, first_shard + 5):
        accumulate(pair, directory, 250)
    assert open_data(pair, directory).summary().shards == 1
    assert sorted(path.name for path in directory.iterdir()) == [MANIFEST, "shard-00000.npz"]
    accumulate(pair, directory, 250)
    same_records(list(open_data(pair, directory).records()), whole)
    prompts = [r.ids[: r.prompt_length].tobytes() for r in whole]
    assert len(set(prompts)) == len(prompts)


def test_features_recomputed_from_the_ids_are_those_read_while_writing(tmp_path: Path) -> None:
    """The features training computes from stored ids equal, to one bfloat16
    step, those the target gave while writing the answers.

    Both are the same float32 function of the same ids, computed in another
    batch with other padding (differences near 1e-6 relative), then rounded to
    bfloat16, whose 8-bit significand puts neighbours 2^-8 to 2^-7 apart
    relatively: the two roundings are equal or neighbours, so rtol = 2^-7."""
    target = tiny_llama(48, num_layers=2, seed=5)
    generator = torch.Generator().manual_seed(3)
    prompts = [
        torch.randint(4, 48, (int(n),), generator=generator).tolist()
        for n in torch.randint(2, 14, (9,), generator=generator)
    ]
    generated = batched_generate(target, prompts, max_new_tokens=16, end_tokens=[END], pad_id=0)
    data = opened(tmp_path / "data", vocab=48)
    append(
        data,
        [
            TokenRecord(ids.numpy(), n)
            for ids, n in zip(generated.ids, generated.prompt_lengths, strict=True)
        ],
    )
    records = [
        {"ids": torch.from_numpy(r.ids.astype(np.int64)), "prompt_length": r.prompt_length}
        for r in opened(tmp_path / "data", vocab=48).records()
    ]
    source = FeatureSource(target)
    with_features = source.with_features(records)
    assert source.computed == len(records) and source.kept_bytes > 0
    for record, during in zip(with_features, generated.features, strict=True):
        assert record["features"].dtype == torch.bfloat16
        assert record["features"].shape == during.shape
        torch.testing.assert_close(record["features"], during, rtol=2**-7, atol=1e-6)
    assert source.with_features(records) == with_features  # kept: nothing computed again
    assert source.computed == len(records)


def test_features_beyond_the_budget_are_not_kept(tmp_path: Path) -> None:
    target = tiny_llama(32, seed=4)
    records = [{"ids": torch.arange(4, 20), "prompt_length": 3} for _ in range(3)]
    source = FeatureSource(target, budget_bytes=0)
    first = source.with_features(records)
    assert all("features" in r for r in first) and not any("features" in r for r in records)
    assert source.kept_bytes == 0
    source.with_features(records)
    assert source.computed == 6


def test_the_rate_and_the_time_left() -> None:
    assert rate_and_time_left(100, 100, 1000, 5.0) == (None, None)
    assert rate_and_time_left(100, 300, 1000, 10.0) == (20.0, 35.0)
    assert rate_and_time_left(0, 1200, 1000, 10.0) == (120.0, 0.0)


def test_feature_passes_are_sized_for_the_device() -> None:
    cpu = torch.device("cpu")
    assert forward_batch_for(cpu, 10) == forward_batch_for(cpu, 4000)  # memory-bound: fixed
    gpu = torch.device("cuda")
    assert forward_batch_for(gpu, 100) > forward_batch_for(gpu, 1000) >= 1
    assert forward_batch_for(gpu, 10**9) == 1


def test_features_on_the_cpu_stay_on_the_cpu_and_are_timed() -> None:
    target = tiny_llama(32, seed=4)
    records = [{"ids": torch.arange(4, 20), "prompt_length": 3} for _ in range(3)]
    source = FeatureSource(target)
    assert not source.on_device and source.seconds == 0.0
    chosen = source.with_features(records)
    assert all(r["features"].device.type == "cpu" for r in chosen)
    assert source.seconds > 0.0


def test_document_prompts_hand_the_target_texts_it_wrote() -> None:
    """A share of a shard's prompts: a task of DOCUMENT_TASKS over one earlier
    answer (two or three for a task that names documents), drawn with the
    shard's seed; none without documents or at share 0."""
    documents = [f"document {chr(65 + i)} says this. " * 4 for i in range(10)]
    recipe = AnswerRecipe(shard_records=16, document_share=0.25)

    def encode(text: str) -> list[int]:
        return list(text.encode())

    seen: set[bytes] = set()
    prompts = _document_prompts(recipe, 7, documents, encode=encode, seen=seen)
    assert len(prompts) == 4 and len(seen) == 4
    for prompt in prompts:
        task, _, body = bytes(prompt).decode().partition("\n\n")
        assert task in DOCUMENT_TASKS
        named = [d for d in documents if d in body]
        assert len(named) == 1 if "documents" not in task else len(named) in (2, 3)
    assert _document_prompts(recipe, 7, documents, encode=encode, seen=set()) == prompts
    assert _document_prompts(recipe, 8, documents, encode=encode, seen=set()) != prompts
    assert _document_prompts(recipe, 7, documents[:2], encode=encode, seen=set()) == []
    none = AnswerRecipe(shard_records=16)
    assert _document_prompts(none, 7, documents, encode=encode, seen=set()) == []


def test_shards_record_their_prompts_with_a_document(pair: ModelPair, tmp_path: Path) -> None:
    """Earlier answers that ended become the documents of the next shard's
    prompts; the shard records how many of its prompts hold one."""
    end = pair.eos_token_ids[0]
    data = open_data(pair, tmp_path / "data")
    answers = [np.array([7, 8, *([9 + i % 20] * 40), end]) for i in range(4)]
    answers.append(np.array([7, 8, *([12] * 40)]))  # cut short: not a document
    append(data, [TokenRecord(ids, 2) for ids in answers])
    texts = earlier_answers(data.records(), pair.tokenizer, pair.eos_token_ids)
    assert len(texts) == 4 and texts[0] == pair.tokenizer.decode([9] * 40)

    def encode(text: str) -> list[int]:
        return pair.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
        )

    recipe = AnswerRecipe(
        max_new_tokens=8, shard_records=8, answer_batch=4, prompt_batch=8, document_share=0.5
    )
    accumulate_answers(
        pair.target.model,
        pair.tokenizer,
        data,
        token_budget=data.summary().answer_tokens + 1,
        recipe=recipe,
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=0,
    )
    written = open_data(pair, tmp_path / "data").shards[-1].recipe
    assert written["document_prompts"] == 4 and "DOCUMENT_TASKS" in written["documents"]
