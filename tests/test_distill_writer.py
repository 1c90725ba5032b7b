"""distill's answer writer: chosen by timing, its answers the target's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specrepl.app import cli
from specrepl.engine.linear_forms import STOCK, packing_works
from specrepl.engine.tuning import Tuning
from specrepl.testing import tiny_llama, tiny_tokenizer, visible_state
from specrepl.train import writer as writer_module
from specrepl.train.data import batched_generate
from specrepl.train.writer import (
    BFLOAT16_MARGIN,
    EVERY_PASS_PACKED,
    batch_seconds,
    choose_writer,
)

needs_packing = pytest.mark.skipif(
    not packing_works(torch.float32), reason="this torch cannot pack weights on this CPU"
)
needs_bfloat16_packing = pytest.mark.skipif(
    not (packing_works(torch.float32) and packing_works(torch.bfloat16)),
    reason="this torch cannot pack bfloat16 weights on this CPU",
)


@pytest.fixture()
def roomy(monkeypatch):
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)


@pytest.fixture()
def tunings(monkeypatch) -> list[Tuning]:
    """Every tuning the writer makes (each candidate's: its packed copies)."""
    made: list[Tuning] = []

    def recorded(*args, **kwargs) -> Tuning:
        made.append(Tuning(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(writer_module, "Tuning", recorded)
    return made


def held(tunings: list[Tuning], model) -> list[Tuning]:
    """The tunings that hold packed copies of `model`'s layers."""
    return [tuning for tuning in tunings if tuning.layers.packed(model)]


def costs(table: dict[tuple[torch.dtype, bool], float]):
    """A stand-in for the timing: seconds a batch by (dtype, packed)."""

    def measure(model, forms=STOCK, **kwargs):
        return table[(model.dtype, bool(forms))]

    return measure


def test_a_batch_is_timed_in_the_forms_given() -> None:
    model = tiny_llama(32, seed=0)
    short = batch_seconds(model, rows=4, prompt_tokens=6, answer_tokens=1, steps=2)
    long = batch_seconds(model, rows=4, prompt_tokens=6, answer_tokens=400, steps=2)
    assert 0 < short < long  # the decoding steps count once per answer token


@needs_packing
def test_the_faster_form_of_the_target_writes(monkeypatch, roomy, tunings) -> None:
    target = tiny_llama(32, seed=0)
    before = visible_state(target)
    table = {(torch.float32, False): 15.0, (torch.float32, True): 10.0}
    monkeypatch.setattr(writer_module, "batch_seconds", costs(table))
    writer = choose_writer(target, "float32", attention="specrepl_sdpa_grouped")
    assert writer.model is target and writer.forms == EVERY_PASS_PACKED
    assert writer.label == "float32, packed" and held(tunings, target) == [writer.tuning]
    assert writer.tuning.attention == "specrepl_sdpa_grouped"  # the target's passes' own
    assert writer.timed == {"float32, stock": 15.0, "float32, packed": 10.0}
    assert visible_state(target) == before  # the copies are the writer's, not the target's
    writer.release()
    assert held(tunings, target) == []
    table[(torch.float32, True)] = 20.0
    writer = choose_writer(target, "float32")
    assert writer.forms == STOCK and writer.form == "stock"
    assert held(tunings, target) == []  # dropped at once
    assert visible_state(target) == before


@needs_bfloat16_packing
@pytest.mark.parametrize("copy_seconds", [9.5, 8.5])
def test_a_bfloat16_copy_writes_only_where_clearly_faster(
    monkeypatch, roomy, tunings, copy_seconds
) -> None:
    target = tiny_llama(32, seed=0)
    table = {
        (torch.float32, False): 20.0,
        (torch.float32, True): 10.0,
        (torch.bfloat16, False): 12.0,
        (torch.bfloat16, True): copy_seconds,
    }
    monkeypatch.setattr(writer_module, "batch_seconds", costs(table))
    writer = choose_writer(target, "auto")
    if BFLOAT16_MARGIN * copy_seconds < 10.0:
        assert writer.model is not target and writer.label == "bfloat16, packed"
        assert held(tunings, target) == []  # its copies given back
        assert held(tunings, writer.model) == [writer.tuning]
    else:
        assert writer.model is target and writer.label == "float32, packed"
    assert len(writer.timed) == 4


@needs_packing
def test_packed_writing_gives_the_stock_answers(monkeypatch, roomy) -> None:
    target = tiny_llama(32, seed=0)
    prompts = [[1, 5, 9, 12], [7], [1, 17, 4, 30, 8, 8, 2, 11]]
    stock = batched_generate(target, prompts, max_new_tokens=16, end_tokens=[3], pad_id=0)
    table = {(torch.float32, False): 15.0, (torch.float32, True): 10.0}
    monkeypatch.setattr(writer_module, "batch_seconds", costs(table))
    writer = choose_writer(target, "float32", rows=3)
    assert writer.forms == EVERY_PASS_PACKED and writer.tuning.layers.packed(target)
    pointwise = torch.ops.mkldnn._linear_pointwise
    packed_products: list[int] = []

    def counting(*args, **kwargs):
        packed_products.append(1)
        return pointwise(*args, **kwargs)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counting)
    before = visible_state(target)
    with writer.writing():
        written = batched_generate(target, prompts, max_new_tokens=16, end_tokens=[3], pad_id=0)
    assert packed_products and visible_state(target) == before
    writer.release()
    assert [s.tolist() for s in written.ids] == [s.tolist() for s in stock.ids]


def test_the_shards_record_how_the_writer_multiplied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    tiny_llama(32, seed=4).save_pretrained(tmp_path / "model")
    tiny_tokenizer(32).save_pretrained(tmp_path / "model")
    directory = tmp_path / "data"
    flags = ["distill", "--data", str(directory), "--data-only", "--data-tokens", "50"]
    command = ["--drafter", "none", "--target", str(tmp_path / "model"), *flags]
    assert cli.main([*command, "--answer-tokens", "8", "--writer-dtype", "float32"]) == 0
    (shard,) = json.loads((directory / "manifest.json").read_text())["shards"]
    assert shard["recipe"]["writer_dtype"] == "float32"
    assert shard["recipe"]["writer_form"] in ("stock", "packed")
    out = capsys.readouterr()
    said = " ".join((out.out + out.err).split())
    assert f"float32, {shard['recipe']['writer_form']}" in said and "s a batch" in said
