"""The benchmark runner on tiny models: prompts, flags, figures, tables, JSON, chart."""

from __future__ import annotations

import argparse
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from specrepl.chat.settings import Settings
from specrepl.engine.gamma import expected_tokens
from specrepl.engine.output_match import compare_outputs
from specrepl.engine.results import StepEvent
from specrepl.measure.bench import command, tables
from specrepl.measure.bench import prompts as bench_prompts
from specrepl.measure.bench import summary as bench_summary
from specrepl.measure.bench.command import parse_sweep
from specrepl.measure.bench.figures import Method, MethodRun, PromptRecord
from specrepl.measure.bench.markdown import format_positions, run_markdown
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.peers import HfPeer
from specrepl.measure.bench.prediction import predict_from_steps, predicted_speedup
from specrepl.measure.bench.prompts import BenchError, BenchPrompt, conversations, load_prompts
from specrepl.measure.bench.report import BenchReport
from specrepl.measure.bench.runner import Benchmark
from specrepl.measure.bench.summary import summarize, summarize_turns
from specrepl.models.pair import ModelPair
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["w10 w11 w12 w13", "second turn"]},
    {"question_id": 2, "category": "writing", "turns": ["w20 w21 w20 w21 w20"]},
    {"question_id": 3, "category": "writing", "turns": ["w9 w9 w9"]},
    {"question_id": 4, "category": "summarization", "turns": ["w14 w15 w16 w14 w15 w16 w14"]},
    {"question_id": 5, "category": "summarization", "turns": ["w30 w8 w30 w8"]},
]


@pytest.fixture(scope="module")
def pair() -> ModelPair:
    target = tiny_llama(32, seed=0)
    return ModelPair.from_models(target, perturbed_copy(target, 0.1, seed=1), tiny_tokenizer(32))


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(json.dumps(item) for item in QUESTIONS) + "\n", encoding="utf-8")
    return path


def _console() -> Console:
    return Console(file=io.StringIO(), width=160, record=True)


# -- prompts ------------------------------------------------------------------


def test_load_prompts_keeps_every_turn_in_file_order(prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file)
    assert [prompt.question_id for prompt in prompts] == [1, 2, 3, 4, 5]
    assert prompts[0] == BenchPrompt(1, "writing", ("w10 w11 w12 w13", "second turn"))
    assert prompts[0].text == "w10 w11 w12 w13"
    assert [turn.key for turn in prompts[0].each_turn()] == ["writing/1#1", "writing/1#2"]
    assert [turn.text for turn in prompts[0].each_turn()] == ["w10 w11 w12 w13", "second turn"]
    assert prompts[3].key == "summarization/4"
    assert [turn.key for turn in prompts[3].each_turn()] == ["summarization/4"]
    assert [[turn.key for turn in chat] for chat in conversations(prompts[:2], one_chat=False)] == [
        ["writing/1#1", "writing/1#2"],
        ["writing/2"],
    ]
    (chat,) = conversations(prompts[:2], one_chat=True)
    assert [turn.key for turn in chat] == ["writing/1#1", "writing/1#2", "writing/2"]


def test_limit_is_per_category_and_categories_filter(prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file, limit=1)
    assert [prompt.question_id for prompt in prompts] == [1, 4]
    prompts = load_prompts(prompts_file, categories=["summarization"], limit=5)
    assert [prompt.question_id for prompt in prompts] == [4, 5]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json\n", "questions.jsonl:1: not valid JSON"),
        ('{"question_id": 1, "category": "x"}\n', "missing turns"),
        ('{"question_id": 1, "category": "x", "turns": []}\n', "turns must be a list"),
        ("[1, 2]\n", "expected a JSON object"),
        ("\n\n", "holds no prompts"),
    ],
)
def test_malformed_prompt_files_are_refused_with_the_line(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BenchError, match=message):
        load_prompts(path)


def test_unknown_category_names_the_available_ones(prompts_file: Path) -> None:
    with pytest.raises(BenchError, match="no prompts in category math; the file has: writing"):
        load_prompts(prompts_file, categories=["math"])
    with pytest.raises(BenchError, match="no such prompts file"):
        load_prompts(prompts_file.parent / "missing.jsonl")


def test_default_prompts_ship_with_the_repository(tmp_path: Path) -> None:
    found, _ = bench_prompts.default_prompts_path()
    assert (
        found
        == Path(bench_prompts.__file__).resolve().parents[3] / "benchmarks" / "spec_bench.jsonl"
    )
    assert len(load_prompts(found)) == 480
    repo = tmp_path / "repo"  # an installed package without the file: the working directory's
    repo.mkdir()
    work = tmp_path / "work"
    found, looked = bench_prompts.default_prompts_path(repo, cwd=work)
    assert found is None
    assert (repo / "benchmarks" / "spec_bench.jsonl").resolve() == looked[0]
    assert (work / "benchmarks" / "spec_bench.jsonl").resolve() == looked[1]
    looked[1].parent.mkdir(parents=True)
    looked[1].write_text("", encoding="utf-8")
    assert bench_prompts.default_prompts_path(repo, cwd=work)[0] == looked[1]


# -- flag values ----------------------------------------------------------------


def test_gamma_flag_values() -> None:
    """`--gamma` (before or after `bench`) takes what `/gamma` takes."""
    from specrepl.chat.flags import gamma_choice

    assert gamma_choice("6") == ("fixed", 6)
    assert gamma_choice("auto") == ("auto", None)
    assert gamma_choice("Auto:8") == ("auto", 8)
    assert gamma_choice("fixed:2") == ("fixed", 2)
    assert Settings(gamma_policy="fixed", gamma=2).gamma_policy_object().next_gamma() == 2
    assert Settings(gamma_policy="confidence", gamma=5).gamma_policy_object().min_confidence > 0
    for bad in ("fast", "auto:x", "1_0", "٣"):
        with pytest.raises(ValueError, match=r"expected an integer|not an integer"):
            gamma_choice(bad)


def test_parse_sweep() -> None:
    assert parse_sweep("1-4") == (1, 2, 3, 4)
    assert parse_sweep("6, 2,1-2") == (1, 2, 6)
    assert parse_sweep(None) == ()
    for bad in ("4-1", "a-b", "0-3", "1-100"):
        with pytest.raises(BenchError, match="--gamma-sweep"):
            parse_sweep(bad)


# -- the prediction ------------------------------------------------------------


def _step(gamma: int, accepted: int, draft: float, target: float) -> StepEvent:
    appended = tuple(range(min(accepted + 1, gamma + 1)))
    return StepEvent((0,) * gamma, accepted, appended, draft, target, 0.0, gamma)


def test_predicted_speedup_is_the_papers_formula() -> None:
    assert predicted_speedup(0.8, 4, 0.5, 1.2) == pytest.approx(
        (1 - 0.8**5) / (1 - 0.8) / (4 * 0.5 + 1.2)
    )
    assert predicted_speedup(1.0, 3, 0.0, 1.0) == 4.0
    assert predicted_speedup(0.0, 3, 0.1, 1.0) == pytest.approx(1 / 1.3)


def test_prediction_from_steps_uses_the_same_runs_costs() -> None:
    # target-only: a prefill step, then 0.1 s per one-token step
    target = [_step(0, 0, 0.0, 0.9), *(_step(0, 0, 0.0, 0.1) for _ in range(5))]
    # speculative, gamma 4: 0.02 s per draft, 0.12 s per verification, 3 of 4 accepted
    speculative = [_step(4, 3, 0.5, 0.9), *(_step(4, 3, 0.08, 0.12) for _ in range(4))]
    prediction = predict_from_steps(speculative, target)
    assert prediction is not None
    assert prediction.alpha == pytest.approx(15 / 20)  # 15 accepted, 5 rejections
    assert prediction.draft_cost == pytest.approx(0.2)
    assert prediction.verify_cost == pytest.approx(1.2)
    assert prediction.mean_gamma == 4
    assert prediction.speedup == pytest.approx(predicted_speedup(0.75, 4, 0.2, 1.2))
    # a policy that varies gamma: expected tokens are averaged step by step
    varying = [_step(2, 2, 0.1, 0.5), _step(2, 2, 0.04, 0.11), _step(6, 3, 0.12, 0.13)]
    prediction = predict_from_steps(varying, target)
    assert prediction is not None
    a = 7 / 8  # the gamma-2 steps were accepted in full: one rejection in all
    tokens = (expected_tokens(a, 2) + expected_tokens(a, 6)) / 2
    assert prediction.speedup == pytest.approx(tokens / (4 * (0.16 / 8 / 0.1) + 1.2))
    assert predict_from_steps(speculative[:1], target) is None


def _record(category: str, runs: dict[str, MethodRun]) -> PromptRecord:
    return PromptRecord(BenchPrompt(1, category, ("x",)), 3, 9, list(runs), runs)


def _method(name: str) -> Method:
    return Method(name, name, "specrepl", speculative=name != "target")


def test_first_draft_acceptance_and_draft_cost_per_target_step() -> None:
    target_steps = [_step(0, 0, 0.0, 0.9), *(_step(0, 0, 0.0, 0.1) for _ in range(4))]
    # the first step also reads the prompt: its drafting time is left out of the cost
    steps = [
        _step(4, 0, 1.0, 0.9),
        _step(4, 4, 0.02, 0.12),
        _step(2, 0, 0.01, 0.11),
        _step(0, 0, 0.0, 0.1),  # gamma 0: no first draft to count
        _step(3, 1, 0.015, 0.11),
    ]
    target = MethodRun("target", [1] * 5, 1.3, steps=5, events=target_steps)
    speculative = MethodRun(
        "speculative", [1] * 9, 1.0, steps=5, drafted=13, accepted=5, events=steps
    )
    assert speculative.first_drafts == (2, 4)
    assert speculative.seconds_per_draft == pytest.approx(0.045 / 9)
    assert target.target_step_seconds == pytest.approx(0.1)
    assert target.first_drafts is None
    speculative.draft_cost_vs_target = 0.045 / 9 / 0.1
    other = MethodRun(
        "speculative",
        [1] * 3,
        1.0,
        steps=2,
        drafted=2,
        accepted=2,
        events=[_step(1, 1, 0.5, 0.9), _step(1, 1, 0.01, 0.1)],
    )
    other.draft_cost_vs_target = 0.1
    summary = summarize(
        [
            _record("a", {"target": target, "speculative": speculative}),
            _record("a", {"target": target, "speculative": other}),
        ],
        [_method("target"), _method("speculative")],
    )["overall"]
    assert summary["speculative"].first_draft_acceptance == pytest.approx(4 / 6)
    assert summary["speculative"].draft_cost_vs_target == pytest.approx((0.05 + 0.1) / 2)
    assert summary["target"].first_draft_acceptance is None


def test_first_draft_acceptance_is_told_apart_by_draft_source() -> None:
    """A hybrid's steps drafted by prompt lookup and by its head are counted
    apart, pooled over prompts, with each source's share of drafting steps."""
    from dataclasses import replace

    from specrepl.measure.bench.markdown import format_sources

    def step(source: str, gamma: int, accepted: int) -> StepEvent:
        return replace(_step(gamma, accepted, 0.01, 0.1), source=source)

    one = [step("lookup", 4, 4), step("head", 3, 0), step("head", 3, 2), step("", 0, 0)]
    two = [step("head", 2, 1), step("lookup", 4, 0)]
    runs = [
        MethodRun("speculative", [1] * 9, 1.0, steps=4, drafted=10, accepted=6, events=one),
        MethodRun("speculative", [1] * 3, 1.0, steps=2, drafted=6, accepted=1, events=two),
    ]
    assert runs[0].first_drafts_by_source == {"lookup": (1, 1), "head": (1, 2)}
    target = MethodRun("target", [1] * 5, 1.3, steps=5, events=[_step(0, 0, 0.0, 0.1)] * 5)
    assert target.first_drafts_by_source is None
    summary = summarize(
        [_record("a", {"target": target, "speculative": run}) for run in runs],
        [_method("target"), _method("speculative")],
    )["overall"]["speculative"]
    assert summary.first_draft_acceptance_by_source == {
        "head": pytest.approx(2 / 3),
        "lookup": pytest.approx(1 / 2),
    }
    assert summary.drafting_steps_by_source == {"head": 0.6, "lookup": 0.4}
    assert format_sources(summary.first_draft_acceptance_by_source) == "head 67% lookup 50%"


def test_acceptance_by_draft_position_counts_only_positions_reached(monkeypatch) -> None:
    # (gamma, accepted): position 2 is tried only where draft 1 was accepted
    steps = [_step(3, 0, 0.01, 0.1), _step(3, 2, 0.01, 0.1), _step(3, 3, 0.01, 0.1)]
    steps += [_step(1, 1, 0.01, 0.1), _step(0, 0, 0.0, 0.1)]
    run = MethodRun("speculative", [1] * 10, 1.0, steps=5, drafted=10, accepted=6, events=steps)
    assert run.position_drafts == [(3, 4), (2, 2), (1, 2)]
    assert MethodRun("target", [1], 1.0, steps=1, events=steps[-1:]).position_drafts is None
    monkeypatch.setattr(bench_summary, "MIN_POSITION_TRIES", 2)
    summary = summarize(
        [_record("a", {"speculative": run}), _record("b", {"speculative": run})],
        [_method("speculative")],
    )["overall"]["speculative"]
    assert summary.acceptance_by_position == pytest.approx((3 / 4, 1.0, 0.5))
    monkeypatch.setattr(bench_summary, "MIN_POSITION_TRIES", 5)  # position 2 tried 4 times
    summary = summarize(
        [_record("a", {"speculative": run}), _record("b", {"speculative": run})],
        [_method("speculative")],
    )["overall"]["speculative"]
    assert summary.acceptance_by_position == pytest.approx((3 / 4,))
    assert format_positions((0.914, 0.8, 0.5)) == "91 80 50"


# -- running methods on tiny models ----------------------------------------------


def test_benchmark_greedy_with_peers_and_sweep(pair: ModelPair, prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file, limit=2)
    options = BenchOptions(
        Settings(max_new_tokens=12, gamma_policy="fixed", gamma=3),
        peers=("hf",),
        sweep=(1, 2),
        warmup=1,
    )
    benchmark = Benchmark(pair, options)
    names = [method.name for method in benchmark.methods]
    assert names == [
        "target",
        "speculative",
        "speculative_g1",
        "speculative_g2",
        "hf_generate",
        "hf_assisted",
        "hf_assisted_matched",
        "hf_lookup",
    ]
    seen: list[tuple[int, int, str]] = []
    records = benchmark.run(prompts, lambda done, total, what: seen.append((done, total, what)))
    assert [record.key for record in records] == [
        "writing/1#1",
        "writing/1#2",  # question 1 has two turns: each is measured
        "writing/2",
        "summarization/4",
        "summarization/5",
    ]
    assert seen[-1] == (benchmark.total_runs(prompts),) * 2 + ("done",)
    assert records[0].order == names and records[1].order == names[::-1]  # alternating
    for record in records:
        target = record.runs["target"]
        assert 1 <= target.new_tokens <= 12
        for name, run in record.runs.items():
            assert run.seconds > 0
            assert run.tokens_per_second == pytest.approx(run.new_tokens / run.seconds)
            if name != "target":
                assert run.identical, (record.prompt.key, name, run.first_mismatch)
                assert run.token_ids == target.token_ids
        speculative = record.runs["speculative"]
        assert speculative.drafted is not None and speculative.drafted > 0
        assert speculative.acceptance is not None and 0 <= speculative.acceptance <= 1
        assert speculative.other_seconds is not None
        assert record.runs["hf_generate"].acceptance is None
    # the matched assistant's settings were put back after every run
    assert pair.drafter is not None
    assert pair.drafter.model.generation_config.num_assistant_tokens is None

    summary = summarize(records, benchmark.methods)
    assert list(summary) == ["writing", "summarization", "overall"]
    overall = summary["overall"]
    assert overall["target"].speedup_vs_target == pytest.approx(1.0)
    assert overall["hf_generate"].speedup_vs_hf == pytest.approx(1.0)
    assert overall["speculative"].identical == overall["speculative"].compared == 5
    assert overall["speculative"].acceptance is not None
    shares = overall["speculative"]
    assert shares.draft_share + shares.target_share + shares.other_share == pytest.approx(
        1.0, abs=1e-6
    )
    assert summary["writing"]["speculative"].prompts == 3
    assert overall["speculative"].fallback_share == 0.0  # a fixed gamma never chooses 0
    assert overall["target"].fallback_share is None

    report = BenchReport.build(benchmark, config={"config_file": None})
    payload = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert payload["schema"] == "specrepl-bench/1"
    assert payload["machine"]["torch_threads"] >= 1 and payload["machine"]["cpu"]
    assert set(payload["versions"]) == {"specrepl", "torch", "transformers"}
    assert payload["config"]["gamma"] == {"policy": "fixed", "value": 3, "confidence": 0.4}
    plan = payload["config"]["width_plans"]["target"]  # widths 1 to the largest gamma + 1
    assert sorted(plan["ms_per_width"]) == ["1", "2", "3", "4"]
    assert [point["gamma"] for point in payload["gamma_sweep"]] == [1, 2]
    first = payload["prompts"][0]
    assert first["category"] == "writing" and first["question_id"] == 1
    assert first["methods"]["speculative"]["identical_to_target"] is True
    assert (
        1
        <= first["methods"]["speculative"]["first_drafts"]
        <= first["methods"]["speculative"]["steps"]
    )
    assert first["methods"]["speculative"]["draft_cost_vs_target"] > 0
    assert first["methods"]["target"]["first_drafts"] is None
    assert (
        first["methods"]["hf_assisted_matched"]["new_tokens"]
        == first["methods"]["target"]["new_tokens"]
    )
    matched = next(m for m in payload["methods"] if m["name"] == "hf_assisted_matched")
    assert matched["settings"]["assistant_generation_config"] == {
        "num_assistant_tokens": 3,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }

    console = _console()
    tables.render_report(report, console)
    text = console.export_text()
    for expected in ("writing (3 prompts)", "overall (5 prompts)", "gamma sweep", "5/5"):
        assert expected in text
    assert "later turns (1 prompt)" in text and "first turns (4 prompts)" in text
    row = next(line.split() for line in text.splitlines() if "writing/1#2" in line)
    assert row[:2] == ["writing/1#2", "later"] and row[-1] == "identical"
    assert "differ from specrepl target-only" not in text


@pytest.mark.parametrize("kind", ["ngram", "lookup", "hybrid"])
def test_other_drafters_and_sampling(pair: ModelPair, prompts_file: Path, kind) -> None:
    prompts = load_prompts(prompts_file, categories=["summarization"], limit=1)
    greedy = Benchmark(pair, BenchOptions(Settings(max_new_tokens=10, drafter_kind=kind), warmup=0))
    (record,) = greedy.run(prompts)
    assert record.runs["speculative"].identical
    sampled = Benchmark(
        pair,
        BenchOptions(
            Settings(
                max_new_tokens=10, drafter_kind=kind, processor="multinomial", temperature=0.8
            ),
            peers=("hf",),
            warmup=0,
        ),
    )
    (record,) = sampled.run(prompts)
    assert all(run.identical is None for run in record.runs.values())
    match = record.runs["speculative"].match
    assert match is not None and not match.greedy and not match.alarming
    assert match.describe() in ("differs by design (sampling)", "identical (sampling)")
    assert sampled.hf.generate_options["do_sample"] is True
    assert sampled.hf.generate_options["top_k"] == 0 and sampled.hf.generate_options["top_p"] == 1.0


def test_mismatches_are_reported_not_hidden(pair: ModelPair, prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file, categories=["summarization"], limit=2)
    benchmark = Benchmark(pair, BenchOptions(Settings(max_new_tokens=8), warmup=0))
    records = benchmark.run(prompts)
    broken = records[0].runs["speculative"]
    target = records[0].runs["target"].token_ids
    broken.token_ids = [*target[:2], 31 if target[2] != 31 else 30, *target[3:]]
    broken.match = compare_outputs(broken.token_ids, target, greedy=True)
    assert broken.identical is False and broken.first_mismatch == 2
    report = BenchReport.build(benchmark)
    assert report.summary["overall"]["speculative"].identical == 1
    console = _console()
    tables.render_report(report, console)
    text = console.export_text()
    assert "1 greedy output(s) differ" in text
    assert "summarization/4 speculative: DIFFERS at token 2" in text
    row = next(line for line in text.splitlines() if line.strip().startswith("summarization/4"))
    assert row.rstrip().endswith("DIFFERS at token 2")  # the per-prompt table says it too
    payload = report.to_dict()["prompts"]
    assert payload[0]["methods"]["speculative"]["output_vs_target"] == "DIFFERS at token 2"
    assert payload[1]["methods"]["speculative"]["output_vs_target"] == "identical"
    markdown = run_markdown(json.loads(json.dumps(report.to_dict())))
    assert "| summarization/4 | first |" in markdown and "**DIFFERS at token 2** |" in markdown


# -- turns and chats ------------------------------------------------------------


def _ids_per_method(benchmark: Benchmark, monkeypatch) -> list[dict[str, list[int]]]:
    """The prompt ids each method was given, one dict per measured turn (warm-up left out)."""
    seen: list[dict[str, list[int]]] = []
    real = Benchmark.run_method

    def recording(self, method, ids, budget, seed):
        if not seen or method.name in seen[-1]:
            seen.append({})
        seen[-1][method.name] = list(ids)
        return real(self, method, ids, budget, seed)

    monkeypatch.setattr(Benchmark, "run_method", recording)
    return seen


def test_a_two_turn_question_runs_as_two_turns_with_the_first_answer_in_context(
    pair: ModelPair, prompts_file: Path, monkeypatch
) -> None:
    prompts = load_prompts(prompts_file, limit=1, categories=["writing"])
    benchmark = Benchmark(pair, BenchOptions(Settings(max_new_tokens=8), peers=("hf",), warmup=0))
    given = _ids_per_method(benchmark, monkeypatch)
    first, second = benchmark.run(prompts)
    assert (first.key, second.key) == ("writing/1#1", "writing/1#2")
    assert (first.turn, second.turn) == (1, 2)
    assert first.first_turn and not second.first_turn
    assert (second.earlier_turns, second.history_turns) == (1, 1)
    assert second.prompt.category == "writing"
    # every method got the same turn-2 ids: turn 1, its target-only answer, then turn 2
    assert len({tuple(ids) for ids in given[1].values()}) == 1
    ids = given[1]["target"]
    history = [
        {"role": "user", "content": "w10 w11 w12 w13"},
        {"role": "assistant", "content": first.text},
    ]
    assert ids == benchmark.prompt_ids("second turn", history)
    assert second.prompt_tokens == len(ids) > first.prompt_tokens
    special = set(pair.tokenizer.all_special_ids)
    answer = [token for token in first.runs["target"].token_ids if token not in special]
    assert answer and any(
        ids[start : start + len(answer)] == answer for start in range(len(ids))
    ), "turn 2's prompt holds turn 1's reference answer"
    assert ids[: len(given[0]["target"]) - 2] == given[0]["target"][:-2]  # turn 1 leads
    assert all(run.identical for run in second.runs.values() if run.method != "target")
    assert all(run.reused_prompt_tokens == 0 for run in second.runs.values() if run.steps)


def test_chat_keeps_caches_from_turn_to_turn(pair: ModelPair, prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file, limit=1)
    settings = Settings(max_new_tokens=8, gamma_policy="fixed", gamma=3)
    options = BenchOptions(settings, sweep=(2,), warmup=1)
    benchmark = Benchmark(pair, replace(options, conversation=True))
    records = benchmark.run(prompts)
    assert [record.key for record in records] == [
        "writing/1#1",
        "writing/1#2",
        "summarization/4",
    ]
    assert [record.earlier_turns for record in records] == [0, 1, 2]
    assert [record.history_turns for record in records] == [0, 1, 2]
    for name in ("target", "speculative", "speculative_g2"):
        assert records[0].runs[name].reused_prompt_tokens == 0  # the warm-up left nothing
        for record in records[1:]:  # each later turn starts from what the last one left
            assert record.runs[name].reused_prompt_tokens > 0, (record.key, name)
    assert all(
        run.identical
        for record in records
        for run in record.runs.values()
        if run.method != "target"
    )
    payload = BenchReport.build(benchmark).to_dict()
    assert payload["config"]["conversation"] is True
    assert payload["prompts"][2]["methods"]["speculative"]["reused_prompt_tokens"] > 0
    assert [record["groups"] for record in payload["prompts"]] == [
        ["first turns"],
        ["later turns"],
        ["later turns"],
    ]
    # without --chat every question is its own chat and nothing is kept
    alone = Benchmark(pair, options).run(prompts)
    assert [record.earlier_turns for record in alone] == [0, 1, 0]
    assert all(run.reused_prompt_tokens == 0 for r in alone for run in r.runs.values() if run.steps)
    assert [r.runs["target"].token_ids for r in alone[:2]] == [
        r.runs["target"].token_ids for r in records[:2]
    ]


def test_a_chat_that_outgrows_the_context_drops_its_oldest_turns(pair: ModelPair) -> None:
    prompt = BenchPrompt(1, "writing", tuple(f"w{n} w{n + 1} w{n + 2}" for n in range(8, 28, 2)))
    room = pair.context_length - 40
    options = BenchOptions(Settings(max_new_tokens=room), warmup=0, tune_widths=False)
    benchmark = Benchmark(pair, options)
    records = benchmark.run([prompt])
    assert len(records) == 10 and not benchmark.skipped
    assert [record.earlier_turns for record in records] == list(range(10))
    assert any(record.history_turns < record.earlier_turns for record in records)
    assert all(record.prompt_tokens + room <= pair.context_length for record in records)
    assert all(record.runs["speculative"].identical for record in records)


def test_speedups_over_llamacpp_alone_are_over_its_faster_run_by_category() -> None:
    """Each prompt's speculative tokens/s over the faster of llama.cpp alone's
    two runs (flash attention off and on), whichever that is on the prompt; the
    stated figure is the median over categories of the category medians, with
    the lowest category."""
    from specrepl.measure.bench.figures import compare_with_target
    from specrepl.measure.bench.summary import over_llamacpp_by_category

    def record(category: str, speculative: float, plain: float, flash: float) -> PromptRecord:
        runs = {  # 10 tokens each: tokens/s is 10 / seconds
            "target": MethodRun("target", [1] * 10, 1.0),
            "speculative": MethodRun("speculative", [1] * 10, 10 / speculative),
            "llamacpp_exact": MethodRun("llamacpp_exact", [1] * 10, 10 / plain),
            "llamacpp_exact_flash": MethodRun("llamacpp_exact_flash", [1] * 10, 10 / flash),
        }
        compare_with_target(runs, greedy=True)
        return _record(category, runs)

    records = [
        record("qa", 30.0, 20.0, 15.0),  # the plain run is the faster: 1.5x
        record("qa", 30.0, 10.0, 25.0),  # flash attention is: 1.2x
        record("rag", 18.0, 20.0, 12.0),  # 0.9x
        record("math", 40.0, 20.0, 20.0),  # 2.0x
    ]
    assert records[1].runs["speculative"].speedup_vs_llamacpp == pytest.approx(1.2)
    assert records[0].runs["speculative"].to_dict()["speedup_vs_llamacpp_alone"] == 1.5
    methods = [_method("target"), _method("speculative")]
    methods += [
        Method(name, name, "llamacpp") for name in ("llamacpp_exact", "llamacpp_exact_flash")
    ]
    summary = summarize(records, methods)
    assert summary["qa"]["speculative"].speedup_vs_llamacpp == pytest.approx(1.35)
    over = over_llamacpp_by_category(summary, "speculative")
    assert over is not None
    assert (over.median, over.lowest_category, over.categories) == (pytest.approx(1.35), "rag", 3)
    assert over.lowest == pytest.approx(0.9)
    assert "median over 3 categories 1.35×, lowest rag 0.90×" in over.in_words("spec")
    alone_only = {"target": MethodRun("target", [1] * 10, 1.0)}
    compare_with_target(alone_only, greedy=True)
    assert alone_only["target"].speedup_vs_llamacpp is None  # no llama.cpp run: no figure
    assert (
        over_llamacpp_by_category(summarize([_record("qa", alone_only)], methods[:1]), "target")
        is None
    )


def test_turn_groups_are_summed_up_apart() -> None:
    def record(earlier: int, long_input: bool, speedup: float) -> PromptRecord:
        target = MethodRun("target", [1] * 4, 1.0, speedup_vs_target=1.0)
        fast = MethodRun("speculative", [1] * 4, 1.0, speedup_vs_target=speedup)
        runs = {"target": target, "speculative": fast}
        prompt = BenchPrompt(earlier, "qa", ("a", "b"))
        return PromptRecord(
            prompt, 600 if long_input else 9, 4, list(runs), runs,
            turn=2 if earlier else 1, earlier_turns=earlier, long_input=long_input,
        )  # fmt: skip

    records = [record(0, False, 2.0), record(0, True, 1.0), record(1, False, 3.0)]
    records += [record(1, True, 1.5), record(2, False, 2.5)]
    groups = summarize_turns(records, [_method("target"), _method("speculative")])
    assert list(groups) == ["first turns", "later turns", "long input"]
    assert [groups[name]["speculative"].prompts for name in groups] == [2, 3, 2]
    assert groups["first turns"]["speculative"].speedup_vs_target == pytest.approx(1.5)
    assert groups["later turns"]["speculative"].speedup_vs_target == pytest.approx(2.5)
    assert groups["long input"]["speculative"].speedup_vs_target == pytest.approx(1.25)
    assert records[3].key == "qa/1#2" and records[3].groups == ["later turns", "long input"]
    assert list(summarize_turns(records[:1], [_method("target")])) == ["first turns"]


def test_turn_groups_in_the_tables_markdown_and_json(pair: ModelPair, prompts_file: Path) -> None:
    prompts = load_prompts(prompts_file, limit=1)
    options = BenchOptions(Settings(max_new_tokens=6), warmup=0, long_input_tokens=20)
    benchmark = Benchmark(pair, options)
    benchmark.run(prompts)
    report = BenchReport.build(benchmark)
    payload = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert payload["config"]["long_input_tokens"] == 20
    turns = payload["summary_by_turn"]
    assert list(turns) == ["first turns", "later turns", "long input"]
    assert turns["later turns"]["speculative"]["prompts"] == 1  # writing/1#2, also long
    assert turns["long input"]["speculative"]["speedup_vs_target"] is not None
    console = _console()
    tables.render_report(report, console)
    text = console.export_text()
    assert "first turns (2 prompts)" in text and "later turns (1 prompt)" in text
    assert "long input, ≥ 20 prompt tokens (1 prompt)" in text
    markdown = run_markdown(payload)
    assert (
        "**× specrepl target-only, by kind of turn** (prompts: first turns 2, later turns 1"
        in markdown
    )
    assert "| method | first turns | later turns | long input |" in markdown
    assert "| writing/1#2 | later, long |" in markdown
    with pytest.raises(BenchError, match="--long-input must be >= 1"):
        BenchOptions(long_input_tokens=0)


def test_model_drafter_needs_a_drafter_model(pair: ModelPair) -> None:
    alone = ModelPair.from_models(pair.target.model, None, pair.tokenizer)
    with pytest.raises(BenchError, match="needs a drafter model"):
        Benchmark(alone, BenchOptions(Settings(drafter_kind="model")))
    lookup = BenchOptions(Settings(drafter_kind="lookup"), peers=("hf",))
    methods = Benchmark(alone, lookup).methods
    assert [method.name for method in methods] == [
        "target",
        "speculative",
        "hf_generate",
        "hf_lookup",
    ]


# -- the command ------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_shared_with_the_main_parser_do_not_overwrite_it() -> None:
    from specrepl.app import cli

    args = cli.parse_arguments(["--gamma", "5", "bench", "--json", "out.json"])
    assert args.gamma == ("fixed", 5) and args.json_out == "out.json"
    args = cli.parse_arguments(["--gamma", "5", "bench", "--gamma", "auto:6"])
    assert args.gamma == ("auto", 6)


def test_the_confidence_policy_runs_with_the_threshold_asked_for(
    pair: ModelPair, prompts_file: Path
) -> None:
    args = _parse(
        "--prompts", str(prompts_file), "--gamma-policy", "confidence", "--confidence", "0.7"
    )
    options = command._plan(args).options
    assert options.settings.gamma_policy == "confidence"
    assert options.to_dict()["gamma"]["confidence"] == 0.7
    benchmark = Benchmark(pair, options)
    (speculative,) = [method for method in benchmark.methods if method.name == "speculative"]
    policy = benchmark._policy(speculative)
    assert policy.min_confidence == 0.7  # the REPL's flag, not the default
    session_policy = Settings(gamma_policy="confidence", confidence=0.7).gamma_policy_object()
    assert policy.min_confidence == session_policy.min_confidence
    assert benchmark.hf.matched_assistant()["assistant_confidence_threshold"] == 0.7


def test_run_end_to_end(pair: ModelPair, prompts_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = _parse(
        "--prompts",
        str(prompts_file),
        "--limit",
        "1",
        "--max-new-tokens",
        "8",
        "--peers",
        "hf",
        "--gamma",
        "auto:4",
        "--gamma-sweep",
        "1-2",
        "--warmup",
        "1",
        "--json",
        str(out),
    )
    console = _console()
    assert command.run(args, console, pair=pair) == 0
    text = console.export_text()
    assert "speculative (hybrid, γ auto≤4)" in text  # the default config's drafter kind
    assert "summarization (1 prompt)" in text
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["config"]["prompts_file"] == str(prompts_file)
    assert payload["config"]["max_new_tokens"] == 8
    assert [record["key"] for record in payload["prompts"]] == [
        "writing/1#1",
        "writing/1#2",
        "summarization/4",
    ]
    assert [record["first_turn"] for record in payload["prompts"]] == [True, False, True]
    assert set(payload["summary_by_turn"]) == {"first turns", "later turns"}
    for record in payload["prompts"]:
        for figures in record["methods"].values():
            assert figures["new_tokens"] == len(figures["token_ids"])
            assert math.isfinite(figures["seconds"])


def test_run_chat_flag(pair: ModelPair, prompts_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "chat.json"
    flags = "--limit 1 --max-new-tokens 4 --warmup 0 --widths off --chat --long-input 25"
    args = _parse("--prompts", str(prompts_file), "--json", str(out), *flags.split())
    console = _console()
    assert command.run(args, console, pair=pair) == 0
    assert "2 prompts (3 turns), one chat with caches kept" in console.export_text()
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["config"]["conversation"] is True and payload["config"]["turns"] == 3
    assert payload["config"]["long_input_tokens"] == 25
    assert [record["earlier_turns"] for record in payload["prompts"]] == [0, 1, 2]
    assert payload["prompts"][2]["methods"]["target"]["reused_prompt_tokens"] > 0


def test_run_chart(pair: ModelPair, prompts_file: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "chart.png"
    flags = "--limit 1 --max-new-tokens 6 --peers hf --gamma-sweep 1-2 --warmup 0"
    args = _parse("--prompts", str(prompts_file), "--chart", str(chart), *flags.split())
    assert command.run(args, _console(), pair=pair) == 0
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "{missing}"], "no such prompts file"),
        (["--categories", "math"], "no prompts in category math"),
        (["--gamma", "99"], "--gamma: gamma must be an integer >= 1 and <= 64"),
        (["--gamma-sweep", "8-1"], "--gamma-sweep"),
        (["--max-new-tokens", "0"], "max_new_tokens must be"),
        (["--warmup", "-1"], "--warmup must be >= 0"),
        (["--long-input", "0"], "--long-input must be >= 1"),
    ],
)
def test_run_refuses_bad_input_before_loading(
    prompts_file: Path, argv: list[str], message: str
) -> None:
    argv = [part.replace("{missing}", str(prompts_file.parent / "nope.jsonl")) for part in argv]
    if "--prompts" not in argv:
        argv = ["--prompts", str(prompts_file), *argv]
    console = _console()
    assert command.run(_parse(*argv), console) == 2  # no pair: it would load one if it got that far
    assert message in console.export_text()


def test_chart_needs_matplotlib(monkeypatch, prompts_file: Path, tmp_path: Path) -> None:
    monkeypatch.setattr(tables.importlib.util, "find_spec", lambda name: None)
    assert "pip install matplotlib==" in (tables.chart_unavailable() or "")
    console = _console()
    args = _parse("--prompts", str(prompts_file), "--chart", str(tmp_path / "c.png"))
    assert command.run(args, console) == 2
    assert "needs matplotlib" in console.export_text()


def test_lookup_peers_only(pair: ModelPair) -> None:
    options = BenchOptions(Settings(drafter_kind="lookup"), peers=("hf-lookup",))
    methods = Benchmark(pair, options).methods
    assert [method.name for method in methods] == [
        "target",
        "speculative",
        "hf_generate",
        "hf_lookup",
    ]


def test_peers_flag_takes_a_list() -> None:
    assert command.parse_peers(None) == ("llamacpp-exact",)  # the fastest plain run, by default
    assert command.parse_peers("none") == ()
    assert command.parse_peers("hf-compiled, hf,hf-compiled") == ("hf-compiled", "hf")
    for bad in ("hf,llama", ",", "HF"):
        with pytest.raises(BenchError, match="--peers: expected some of hf, hf-lookup"):
            command.parse_peers(bad)


def test_compiled_peer_is_compiled_first_and_matches_the_target(
    pair: ModelPair, prompts_file: Path
) -> None:
    """transformers generate() with a static cache and torch.compile, for real:
    compiled once before the timed runs (its seconds reported apart), then
    timed like every method, with the target's greedy tokens."""
    prompts = load_prompts(prompts_file, limit=1)
    settings = Settings(max_new_tokens=8)
    options = BenchOptions(settings, peers=("hf-compiled",), warmup=0, tune_widths=False)
    benchmark = Benchmark(pair, options)
    assert [m.name for m in benchmark.methods] == [
        "target",
        "speculative",
        "hf_generate",
        "hf_compiled",
    ]
    records = benchmark.run(prompts)
    assert benchmark.unavailable == {}, benchmark.unavailable
    assert benchmark.compile_seconds is not None and benchmark.compile_seconds > 0
    for record in records:
        compiled = record.runs["hf_compiled"]
        assert compiled.identical and compiled.token_ids == record.runs["target"].token_ids
    payload = BenchReport.build(benchmark).to_dict()
    assert payload["compile_seconds"] == benchmark.compile_seconds
    assert payload["methods"][-1]["settings"]["cache_implementation"] == "static"


def test_a_peer_that_cannot_compile_is_dropped_with_the_reason(
    pair: ModelPair, prompts_file: Path
) -> None:
    prompts = load_prompts(prompts_file, limit=1)
    options = BenchOptions(
        Settings(max_new_tokens=4),
        peers=("hf-compiled",),
        warmup=0,
        tune_widths=False,
        compile_backend="no-such-backend",
    )
    benchmark = Benchmark(pair, options)
    records = benchmark.run(prompts)
    assert "hf_compiled" in benchmark.unavailable
    assert "torch.compile failed here" in benchmark.unavailable["hf_compiled"]
    assert "no-such-backend" in benchmark.unavailable["hf_compiled"]
    assert all("hf_compiled" not in record.runs for record in records)
    assert len(records) == 3 and all("hf_generate" in record.runs for record in records)
    report = BenchReport.build(benchmark)
    console = _console()
    tables.render_report(report, console)
    assert "hf_compiled did not run: torch.compile failed here" in console.export_text()


def test_a_peer_that_fails_midway_is_dropped_and_the_rest_goes_on(
    pair: ModelPair, prompts_file: Path, monkeypatch
) -> None:
    """A third-party failure on a later prompt costs that peer, not the benchmark:
    its earlier runs go too (no figure from part of the prompts), with the reason."""
    prompts = load_prompts(prompts_file)
    settings = Settings(max_new_tokens=4)
    options = BenchOptions(settings, peers=("hf-lookup",), warmup=1, tune_widths=False)
    benchmark = Benchmark(pair, options)
    real_hf = HfPeer.run
    calls = {"lookup": 0}

    def flaky_hf(self, method, ids, budget, seed):
        if method.name == "hf_lookup":
            calls["lookup"] += 1
            if calls["lookup"] == 3:  # the warm-up, the first prompt, then this
                raise RuntimeError("the library crashed\nwith a long trace")
        return real_hf(self, method, ids, budget, seed)

    monkeypatch.setattr(HfPeer, "run", flaky_hf)
    records = benchmark.run(prompts)
    assert len(records) == sum(len(prompt.turns) for prompt in prompts)
    assert benchmark.unavailable == {  # the second turn of the first question
        "hf_lookup": "failed on writing/1#2 (RuntimeError: the library crashed)"
    }
    assert all(set(record.runs) == {"target", "speculative", "hf_generate"} for record in records)
    report = BenchReport.build(benchmark)
    assert "hf_lookup" not in report.summary["overall"]
