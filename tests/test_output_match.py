"""Whether the speculative text equals the target's, said once (output_match.py) and shown
in the REPL's summary, the one-shot `--json` object and bench (tests/test_bench.py)."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from specrepl.app import cli
from specrepl.app.render.repl import Renderer
from specrepl.chat.answers import Answer, GeneratorName, Run
from specrepl.chat.config import AppConfig
from specrepl.chat.settings import Settings
from specrepl.engine.output_match import compare_outputs, first_difference
from specrepl.engine.results import GenerationResult, GeneratorKind
from specrepl.models.pair import ModelPair
from specrepl.models.specs import ModelSpec


def test_first_difference_counts_new_tokens_from_zero() -> None:
    assert first_difference([5, 6, 7], [5, 6, 7]) is None
    assert first_difference([5, 9, 7], [5, 6, 7]) == 1
    assert first_difference([5, 6], [5, 6, 7]) == 2  # one stopped early
    assert first_difference([], []) is None


@pytest.mark.parametrize(
    ("tokens", "greedy", "verdict", "alarming"),
    [
        ([1, 2, 3], True, "identical", False),
        ([1, 2, 4], True, "DIFFERS at token 2", True),
        ([1, 2, 4], False, "differs by design (sampling)", False),
        ([1, 2, 3], False, "identical (sampling)", False),
    ],
)
def test_the_verdict(tokens: list[int], greedy: bool, verdict: str, alarming: bool) -> None:
    match = compare_outputs(tokens, [1, 2, 3], greedy=greedy)
    assert match.describe() == verdict and match.alarming is alarming
    assert match.to_dict()["verdict"] == verdict
    assert match.to_dict()["identical"] is (tokens == [1, 2, 3])


def _answer(speculative: list[int], target: list[int], settings: Settings) -> Answer:
    """An answer built by hand: a speculative and a target-only run with these tokens."""

    def run(generator: GeneratorName, tokens: list[int]) -> Run:
        kind: GeneratorKind = "speculative" if generator == "speculative" else "autoregressive"
        result = GenerationResult(kind, 3, list(tokens), seconds=0.1, steps=len(tokens))
        return Run(generator, result, " ".join(f"w{token}" for token in tokens))

    answer = Answer(prompt="w7 w8", mode="chat", settings=settings, prompt_tokens=3)
    answer.runs = {"speculative": run("speculative", speculative), "target": run("target", target)}
    return answer


def _rendered(answer: Answer) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    Renderer(console).answer(answer)
    return console.export_text()


def test_the_repl_summary_says_whether_the_texts_are_identical() -> None:
    same = _rendered(_answer([9, 10, 11], [9, 10, 11], Settings()))
    assert "speculative vs target-only: identical tokens" in same
    assert "DIFFERS" not in same
    broken = _rendered(_answer([9, 12, 11], [9, 10, 11], Settings()))
    assert "speculative vs target-only: DIFFERS at token 1" in broken
    assert "must give the target's own tokens" in broken
    sampled = _rendered(_answer([9, 12, 11], [9, 10, 11], Settings(processor="topk")))
    assert "speculative vs target-only: differs by design (sampling)" in sampled


def test_the_repl_summary_says_nothing_without_both_runs() -> None:
    answer = _answer([9, 10], [9, 10], Settings())
    del answer.runs["target"]
    assert answer.output_match is None
    assert "speculative vs target-only" not in _rendered(answer)
    interrupted = _answer([9, 10], [9, 10], Settings())
    interrupted.runs["target"].result.stop_reason = "interrupted"
    assert interrupted.output_match is None


def test_the_one_shot_json_says_it(pair: ModelPair) -> None:
    config = AppConfig(ModelSpec("embedded"))
    broken = cli.one_shot_payload(config, pair, _answer([9, 12], [9, 10], Settings()))
    assert json.loads(json.dumps(broken))["speculative_vs_target"] == {
        "identical": False,
        "first_difference": 1,
        "greedy": True,
        "near_tie": None,
        "verdict": "DIFFERS at token 1",
    }
    same = cli.one_shot_payload(config, pair, _answer([9, 10], [9, 10], Settings()))
    assert same["speculative_vs_target"]["verdict"] == "identical"
    sampled = _answer([9, 12], [9, 10], Settings(processor="multinomial"))
    payload = cli.one_shot_payload(config, pair, sampled)
    assert payload["speculative_vs_target"]["verdict"] == "differs by design (sampling)"
    assert sampled.to_dict()["speculative_vs_target"] == payload["speculative_vs_target"]
