"""The llama.cpp bench peer: reported as unavailable with the reason wherever it
cannot run, and, where llama-cpp-python is installed (`bash scripts/setup.sh
--llamacpp`), run for real on the embedded GGUF file."""

from __future__ import annotations

import importlib.util
import io
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rich.console import Console

import specrepl.engine.drafters.runtime as runtime_choice
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.llamacpp import LlamaCppDraftRuntime
from specrepl.engine.processors import GreedyProcessor, NucleusProcessor, TopKProcessor
from specrepl.engine.widths import WidthPlan
from specrepl.measure.bench import llamacpp, tables
from specrepl.measure.bench.llamacpp import LlamaCppUnavailable, open_llamacpp, sampling_options
from specrepl.measure.bench.markdown import LLAMACPP_NOTE, run_markdown
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.prompts import BenchError, BenchPrompt
from specrepl.measure.bench.report import BenchReport
from specrepl.measure.bench.runner import Benchmark
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.pair import ModelPair

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def test_sampling_options_follow_the_decoding_rule() -> None:
    greedy = sampling_options(GreedyProcessor())
    assert greedy["temp"] == 0.0
    top_k = sampling_options(TopKProcessor(temperature=0.7, top_k=20))
    assert (top_k["temp"], top_k["top_k"], top_k["top_p"]) == (0.7, 20, 1.0)
    nucleus = sampling_options(NucleusProcessor(temperature=1.2, top_p=0.9))
    assert (nucleus["temp"], nucleus["top_p"]) == (1.2, 0.9)
    # llama-cpp-python's own defaults would filter more than specrepl does.
    for options in (greedy, top_k, nucleus):
        assert options["min_p"] == 0.0 and options["repeat_penalty"] == 1.0


def test_a_target_without_a_gguf_file_reports_the_peer_unavailable(pair: ModelPair) -> None:
    """The tiny pair is built in memory: no GGUF file for llama.cpp to run."""
    settings = Settings(max_new_tokens=4)
    options = BenchOptions(settings, peers=("llamacpp",), warmup=0, tune_widths=False)
    benchmark = Benchmark(pair, options)
    assert [m.name for m in benchmark.methods] == [
        "target",
        "speculative",
        "llamacpp",
        "llamacpp_lookup",
    ]
    records = benchmark.run([BenchPrompt(1, "writing", ("w3 w4 w5 w3 w4",))])
    assert set(benchmark.unavailable) == {"llamacpp", "llamacpp_lookup"}
    assert "not loaded from one" in benchmark.unavailable["llamacpp"]
    assert [set(record.runs) for record in records] == [{"target", "speculative"}]
    console = Console(file=io.StringIO(), width=160, record=True)
    tables.render_report(BenchReport.build(benchmark), console)
    assert "llamacpp did not run: it runs a GGUF file" in console.export_text()


def test_a_missing_binding_names_the_setup_flag(monkeypatch, tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        return None if name == "llama_cpp" else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(llamacpp.importlib.util, "find_spec", find_spec)
    with pytest.raises(LlamaCppUnavailable, match=r"scripts/setup\.sh builds it"):
        open_llamacpp(gguf, context_length=64, draft_tokens=4, end_tokens=[0])
    with pytest.raises(LlamaCppUnavailable, match="is missing"):
        open_llamacpp(tmp_path / "gone.gguf", context_length=64, draft_tokens=4, end_tokens=[0])


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_llamacpp_runs_the_embedded_gguf_beside_specrepl(embedded_pair: ModelPair) -> None:
    """The peer's output on one prompt: plain and prompt lookup both stop within
    the budget, lookup gives plain's greedy tokens, and llama.cpp's quantized
    arithmetic starts the answer as specrepl's float32 target does."""
    assert embedded_pair.target.gguf == embedded_gguf_path()
    options = BenchOptions(
        Settings(max_new_tokens=24, gamma_policy="fixed", gamma=4, drafter_kind="lookup"),
        peers=("llamacpp",),
        warmup=0,
        tune_widths=False,
    )
    benchmark = Benchmark(embedded_pair, options)
    prompt = BenchPrompt(1, "writing", ("List three colours of the rainbow, one per line.",))
    records = benchmark.run([prompt])
    assert benchmark.unavailable == {}, benchmark.unavailable
    runs = records[0].runs
    plain, lookup, target = runs["llamacpp"], runs["llamacpp_lookup"], runs["target"]
    assert 1 <= len(plain.token_ids) <= 24 and plain.seconds > 0
    assert lookup.token_ids == plain.token_ids
    # The 4-bit file starts the answer as the float32 target does, and where
    # it parts from it, it took the target's second choice at a near-tie
    # (after "1. Red" the target's ':' leads '\n' by 0.12: an AVX-512 build
    # of llama.cpp takes '\n', the AVX2 build ':').
    shorter = min(len(plain.token_ids), len(target.token_ids))
    agreed = next((n for n in range(shorter) if plain.token_ids[n] != target.token_ids[n]), shorter)
    assert agreed >= 3, (plain.token_ids, target.token_ids)
    if agreed < shorter:
        seen = benchmark.prompt_ids(prompt.text) + target.token_ids[:agreed]
        with torch.no_grad():
            logits = embedded_pair.target.model(torch.tensor([seen])).logits[0, -1]
        best = torch.topk(logits.float(), 2)
        assert int(best.indices[1]) == plain.token_ids[agreed]
        assert float(best.values[0] - best.values[1]) < 0.5
    # A second run starts from a clean state: the same tokens, no cached prompt reused.
    again = benchmark.run_method(benchmark.methods[2], benchmark.prompt_ids(prompt.text), 24, 0)
    assert again.token_ids == plain.token_ids
    payload = BenchReport.build(benchmark).to_dict()
    settings = next(m["settings"] for m in payload["methods"] if m["name"] == "llamacpp")
    assert settings["gguf"] == embedded_gguf_path().name and settings["llama_cpp_python"]
    assert LLAMACPP_NOTE in run_markdown(payload)
    # A prompt longer than llama.cpp's 512-token batch, with prompt lookup.
    long_ids = benchmark.prompt_ids("Summarize: " + "the cat sat on the mat. " * 120)
    assert len(long_ids) > 600
    lookup_method = next(m for m in benchmark.methods if m.name == "llamacpp_lookup")
    assert len(benchmark.run_method(lookup_method, long_ids, 4, 0).token_ids) == 4


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
def test_a_chat_keeps_the_llamacpp_drafters_state_from_turn_to_turn(
    embedded_pair: ModelPair,
) -> None:
    """`bench --chat` with the drafter model in llama.cpp: each later turn starts from
    what the last one left, in the target's cache and in llama.cpp's, and stays exact."""
    settings = Settings(
        max_new_tokens=6,
        gamma_policy="fixed",
        gamma=3,
        drafter_kind="model",
        drafter_runtime="llamacpp",
    )
    options = BenchOptions(
        settings,
        warmup=1,
        tune_widths=False,
        conversation=True,
    )
    benchmark = Benchmark(embedded_pair, options)
    assert benchmark.drafter_runtime is not None and benchmark.drafter_runtime.llama is not None
    chat = [
        BenchPrompt(1, "writing", ("Name a colour.", "And another one?")),
        BenchPrompt(2, "qa", ("What is two plus two?",)),
    ]
    records = benchmark.run(chat)
    assert [record.key for record in records] == ["writing/1#1", "writing/1#2", "qa/2"]
    for record in records:
        assert record.runs["speculative"].identical, record.key
    for name in ("target", "speculative"):
        assert records[0].runs[name].reused_prompt_tokens == 0  # not the warm-up's
        assert all(record.runs[name].reused_prompt_tokens > 0 for record in records[1:])
    with pytest.raises(BenchError, match="--chat with --gamma-sweep"):
        Benchmark(embedded_pair, replace(options, sweep=(2,)))


@pytest.mark.skipif(not HAS_LLAMA_CPP, reason="llama-cpp-python is not installed")
@pytest.mark.parametrize("takes_keys", [True, False])
def test_bench_and_the_repl_build_the_same_llamacpp_drafter(
    embedded_pair: ModelPair, monkeypatch, takes_keys: bool
) -> None:
    """Same settings, same drafter: kind, runtime, whether it takes the
    target's keys and values (the embedded copy does), and otherwise the
    automatic window the target's timed step gives (bench once built it before
    the widths were timed, and its drafter read long prompts whole while the
    REPL's read a window). The target in torch, whose keys and values the
    copy takes through `probe_importer`'s importer."""
    tuning = embedded_pair.target.tuning
    if not takes_keys:
        monkeypatch.setattr(
            runtime_choice, "probe_importer", lambda llama, target: (None, "refused here")
        )
    tuning.plan = WidthPlan(seconds={1: 0.03, 2: 0.04}, padded={})
    try:
        settings = Settings(
            drafter_kind="hybrid", drafter_runtime="llamacpp", target_runtime="torch"
        )
        repl = ChatSession(embedded_pair, settings)._drafter(settings)
        options = BenchOptions(settings, tune_widths=False)
        bench = Benchmark(embedded_pair, options)._build_drafter(keep_between_prompts=False)
    finally:
        tuning.plan = None
    for drafter in (repl, bench):
        assert isinstance(drafter, HybridDrafter)
        assert isinstance(drafter.model.runtime, LlamaCppDraftRuntime)
        assert (drafter.model.importer is not None) == takes_keys
        assert drafter.uses_target_cache == takes_keys
    assert repl.model.window == bench.model.window
    if takes_keys:
        assert repl.model.window is None  # it sees everything, reading almost nothing
    else:
        assert repl.model.window is not None and repl.model.window >= 32
