"""One drafter builder: every entry point builds its drafter through
`builder.build_drafter`, so the REPL's session and `bench` build the same
drafter from the same settings (kind, runtime, window, cache policy, the
head's dtype), and the builder refuses what it cannot build. The llama.cpp
runtime's side of the same check is in test_bench_llamacpp.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import specrepl.engine.drafters.builder as builder
from specrepl.chat.drafting import keeps_drafter_state
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.builder import DrafterSpec, build_drafter, load_drafter_head
from specrepl.engine.drafters.head_store import save_head, target_fingerprint
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DRAFTER_KINDS, DrafterOptions
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.runner import Benchmark
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_head


@pytest.fixture(scope="module")
def head_dir(pair: ModelPair, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = pair.target.model
    directory = tmp_path_factory.mktemp("head")
    head = tiny_head(target, draft_vocab=24, tokens=11_000)
    save_head(
        head, directory, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    return directory


def described(drafter: Drafter) -> dict[str, Any]:
    """What makes a drafter the one it is, for comparing two built apart."""
    inner = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    head = getattr(inner, "head", None)
    return {
        "class": type(drafter).__name__,
        "drafts with": type(inner).__name__,
        "model": id(getattr(inner, "model", None)),
        "window": getattr(inner, "window", None),
        "use_cache": getattr(inner, "use_cache", None),
        "keeps its state": getattr(inner, "keep_between_prompts", None),
        "needs": (drafter.uses_target_features, drafter.uses_target_cache),
        "head dtype": None if head is None else head.output_rows.dtype,
        "tuning": id(getattr(inner, "tuning", None)),
        "lookup": None
        if not isinstance(drafter, HybridDrafter)
        else (drafter.lookup.max_ngram, drafter.lookup.min_ngram),
        "ngram": None
        if not isinstance(drafter, NgramDrafter)
        else (drafter.max_order, drafter.top_k_filler, drafter.keep_between_prompts),
    }


@pytest.mark.parametrize("processor", ["greedy", "topk"])
@pytest.mark.parametrize("kind", [*DRAFTER_KINDS, "hybrid-head"])
def test_bench_and_the_repl_build_the_same_drafter(
    pair: ModelPair, head_dir: Path, monkeypatch: pytest.MonkeyPatch, kind: str, processor: str
) -> None:
    # a head in float32 on the CPU drafts in the dtype timed fastest: both load it so
    monkeypatch.setattr(builder, "fastest_dtype", lambda head, dtypes: (torch.bfloat16, {}))
    settings = Settings(
        drafter_kind=kind.removesuffix("-head"),
        drafter_head=str(head_dir) if "head" in kind else None,
        drafter_runtime="torch",
        drafter_window=5,
        lookup_max_ngram=2,
        ngram_order=4,
        processor=processor,
    )
    session = ChatSession(pair, settings)
    repl = session._drafter(settings)
    bench = Benchmark(pair, BenchOptions(settings, warmup=0, tune_widths=False))
    # bench's drafter for one prompt reads it afresh; for a chat (`--chat`) it
    # keeps its state as the REPL's does
    kept = bench._build_drafter(keep_between_prompts=keeps_drafter_state(settings))
    assert described(kept) == described(repl)
    fresh = {**described(repl), "keeps its state": described(bench.drafter)["keeps its state"]}
    assert described(bench.drafter) == fresh
    if "head" in kind:
        assert described(repl)["head dtype"] == torch.bfloat16
    assert bench.drafter_runtime == session.drafter_runtime()
    if kind not in ("ngram", "lookup"):  # these keep counts, or nothing, by their options
        assert described(repl)["keeps its state"] == (processor == "greedy")


def test_the_builder_refuses_what_it_cannot_build(pair: ModelPair) -> None:
    with pytest.raises(ValueError, match="unknown drafter kind 'medusa'"):
        build_drafter(DrafterSpec(DrafterOptions(kind="medusa")))
    with pytest.raises(ValueError, match="needs a drafter model"):
        build_drafter(DrafterSpec(DrafterOptions(kind="model")), target=pair.target.model)
    with pytest.raises(ValueError, match="needs a draft head"):
        build_drafter(DrafterSpec(DrafterOptions(kind="head", head="somewhere")))


def test_a_loaded_head_says_which_dtype_drafts_fastest(pair: ModelPair, head_dir: Path) -> None:
    head, description = load_drafter_head(str(head_dir), pair.target.model)
    assert str(head.output_rows.dtype).removeprefix("torch.") == description["dtype"]
    assert set(description["draft_seconds"]) == {"float32", "bfloat16"}
