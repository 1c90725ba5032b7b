"""A hybrid's head "auto": the head trained for the target or the drafter model, by timing.

On the tiny pair: a head trained for its target is kept under the cache
directory (where "auto" finds a user's heads); the REPL's session and `bench`
time both hybrids, keep the verdict in the store, take it at the next start,
and whichever drafts, the output is the target's.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from specrepl.app.commands.registry import REGISTRY
from specrepl.app.commands.results import ShowDraftSource
from specrepl.app.render.models import models_table
from specrepl.chat.answers import Answer
from specrepl.chat.draft_choice import MAX_CHOICE_AGE_DAYS, choice_key, choose_draft_source
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import find_head_for, save_head, target_fingerprint
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.prompts import BenchPrompt
from specrepl.measure.bench.runner import Benchmark
from specrepl.models.pair import ModelPair
from specrepl.store.paths import draft_choices_file, kept_heads_dir
from specrepl.testing import tiny_head

AUTO = Settings(drafter_kind="hybrid", drafter_head="auto", max_new_tokens=12)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache directory of this test's own: its kept heads and its store."""
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def trained(pair: ModelPair):
    return tiny_head(pair.target.model, draft_vocab=24, tokens=11_000)


def keep_head(pair: ModelPair, head) -> Path:
    """Save `head` among the user's kept heads, as trained for the tiny target."""
    directory = kept_heads_dir() / "tiny"
    target = pair.target.model
    save_head(
        head, directory, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    return directory


def identical(answer: Answer) -> bool:
    assert answer.refusal is None, answer.refusal
    runs = answer.runs
    return runs["speculative"].result.token_ids == runs["target"].result.token_ids


def drafts_with(session: ChatSession) -> type:
    drafter = session._drafter(session.settings)
    assert isinstance(drafter, HybridDrafter)
    return type(drafter.model)


def test_auto_options_wait_for_the_choice() -> None:
    hybrid = DrafterOptions(kind="hybrid", head="auto")
    assert hybrid.chooses_head and hybrid.needs_model and not hybrid.needs_head
    head = DrafterOptions(kind="head", head="Auto")
    assert not head.chooses_head and head.needs_head and not head.needs_model
    named = DrafterOptions(kind="hybrid", head="embedded")
    assert not named.chooses_head and named.needs_head and not named.needs_model


def test_auto_finds_a_kept_head_trained_for_the_target(
    pair: ModelPair, cache: Path, trained
) -> None:
    assert find_head_for(pair.target.model) is None
    directory = keep_head(pair, trained)
    assert find_head_for(pair.target.model) == directory
    (kept_heads_dir() / "broken").mkdir()  # unreadable directories are passed over
    assert find_head_for(pair.target.model) == directory


def test_the_session_times_both_and_the_next_start_takes_the_verdict(
    pair: ModelPair, cache: Path, trained
) -> None:
    directory = keep_head(pair, trained)
    session = ChatSession(pair, AUTO)
    assert identical(session.answer("w5 w6 w7 w8"))
    choice = session.drafters.choice(session.settings)
    assert not choice.stored and choice.head_path == str(directory)
    assert set(choice.seconds) == {"head", "model"} and min(choice.seconds.values()) > 0
    assert choice.tokens > 0 and choice.head == (choice.seconds["head"] < choice.seconds["model"])
    assert drafts_with(session) is (HeadDrafter if choice.head else ModelDrafter)
    stored = json.loads(draft_choices_file().read_text(encoding="utf-8"))
    assert [entry["source"] for entry in stored.values()] == [choice.source]

    again = ChatSession(pair, AUTO)
    kept = again.drafters.choice(again.settings)
    assert kept.stored and kept.head == choice.head and kept.seconds == choice.seconds
    summary = again.head_summary() if kept.head else {"chosen": again.runtime_summary()}
    assert summary is not None and "by timing" in summary["chosen"]
    assert "timed at an earlier start" in summary["chosen"]
    assert identical(again.answer("w9 w10 w11"))


@pytest.mark.parametrize("source", ["head", "model"])
def test_whichever_drafts_the_output_is_the_targets(
    pair: ModelPair, cache: Path, trained, source: str
) -> None:
    directory = keep_head(pair, trained)
    key = choice_key(pair, AUTO, directory, "torch")
    entry = {"source": source, "seconds": {"head": 1.0, "model": 1.0}, "tokens": 9}
    draft_choices_file().write_text(json.dumps({key: {**entry, "measured_at": time.time()}}))
    session = ChatSession(pair, AUTO)
    for prompt in ("w5 w6 w7 w8", "w12 w13", "w20 w21 w22 w20 w21"):
        assert identical(session.answer(prompt)), (source, prompt)
    assert session.drafters.choice(session.settings).stored
    assert drafts_with(session) is (HeadDrafter if source == "head" else ModelDrafter)


def test_a_stored_verdict_is_timed_again_when_old_damaged_or_asked(
    pair: ModelPair, cache: Path
) -> None:
    class Timed(Exception):
        pass

    def build(with_head: bool):
        raise Timed  # building a drafter is the first thing timing does

    store = draft_choices_file()
    fresh = {"source": "head", "seconds": {"head": 1.0, "model": 2.0}, "tokens": 9}
    entries = {
        "fresh": {**fresh, "measured_at": time.time()},
        "old": {**fresh, "measured_at": time.time() - (MAX_CHOICE_AGE_DAYS + 1) * 86400},
        "damaged": {"source": "head", "seconds": "fast"},
        "unknown source": {**fresh, "source": "medusa", "measured_at": time.time()},
    }
    store.write_text(json.dumps(entries))
    choice = choose_draft_source(pair, AUTO, build, "fresh", store=store)
    assert choice.stored and choice.head and "0.50 of the model's time" in choice.describe()
    for key in ("old", "damaged", "unknown source", "missing"):
        with pytest.raises(Timed):
            choose_draft_source(pair, AUTO, build, key, store=store)
    with pytest.raises(Timed):
        choose_draft_source(pair, AUTO, build, "fresh", store=store, retime=True)


def test_without_a_head_for_the_target_the_model_drafts(pair: ModelPair, cache: Path) -> None:
    session = ChatSession(pair, AUTO)
    assert identical(session.answer("w5 w6 w7 w8"))
    choice = session.drafters.choice(session.settings)
    assert not choice.head and not choice.seconds and not draft_choices_file().exists()
    assert "no draft head trained for this target" in choice.describe()
    assert drafts_with(session) is ModelDrafter
    with pytest.raises(SettingError, match="no draft head trained for this target"):
        session.update(drafter_kind="head")  # the head kind has nothing to draft with
    assert session.settings == AUTO


def test_bench_chooses_as_the_session_does(pair: ModelPair, cache: Path, trained) -> None:
    keep_head(pair, trained)
    session = ChatSession(pair, AUTO)
    chosen = session.drafters.choice(session.settings)
    benchmark = Benchmark(pair, BenchOptions(AUTO, warmup=0, tune_widths=False))
    records = benchmark.run([BenchPrompt(1, "writing", ("w5 w6 w7 w8",))])
    assert benchmark.draft_choice is not None and benchmark.draft_choice.stored
    assert benchmark.draft_choice.head == chosen.head
    speculative = next(method for method in benchmark.methods if method.speculative)
    assert "by timing" in speculative.settings["draft_source"]
    inner = benchmark.drafter.model  # type: ignore[attr-defined]
    assert isinstance(inner, HeadDrafter if chosen.head else ModelDrafter)
    assert all(record.runs["speculative"].identical for record in records)


def test_the_draft_source_command_shows_the_verdict_and_times_again(
    pair: ModelPair, cache: Path, trained
) -> None:
    keep_head(pair, trained)
    session = ChatSession(pair, AUTO)
    first = session.drafters.choice(session.settings)
    shown = REGISTRY.dispatch(session, "/draft_source")
    assert isinstance(shown, ShowDraftSource) and shown.verdict is not None
    assert "by timing" in shown.verdict and session.drafters.choice(session.settings) is first
    assert shown.verdict.startswith("the draft head" if first.head else "the drafter model")
    models = REGISTRY.dispatch(session, "/models")
    console = Console(file=io.StringIO(), width=240, record=True)
    console.print(models_table(models.pair, models.head, models.runtime))
    text = console.export_text()
    assert "by timing" in text and ("the draft head drafts instead" in text) == first.head
    assert isinstance(REGISTRY.dispatch(session, "/draft_source retime"), ShowDraftSource)
    again = session.drafters.choice(session.settings)
    assert not again.stored and again.measured_at > first.measured_at
    other = ChatSession(pair, Settings(drafter_kind="hybrid", max_new_tokens=8))
    stored = draft_choices_file().read_text(encoding="utf-8")
    untimed = REGISTRY.dispatch(other, "/draft_source retime")
    assert isinstance(untimed, ShowDraftSource) and untimed.verdict is None
    assert untimed.drafter == "hybrid, head none"
    assert untimed.hint == "/drafter_kind hybrid 3 0 auto"
    assert draft_choices_file().read_text(encoding="utf-8") == stored  # nothing was timed
    REGISTRY.dispatch(other, "/drafter_kind hybrid 3 0 auto")
    assert other.settings.drafter_head == "auto" and other.drafters.choice(other.settings).stored
