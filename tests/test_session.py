"""The chat session: prompt building, the generators in turn, history, refusals, Ctrl-C."""

from __future__ import annotations

from typing import Any

import pytest

from specrepl.models import ModelPair
from specrepl.session import (
    ChatSession,
    RunFinished,
    RunStarted,
    RunStep,
    SessionEvent,
)
from specrepl.settings import Settings
from specrepl.testing import interrupt_on_call, tiny_llama, tiny_tokenizer

PROMPT = "w7 w8 w9"


def new_session(pair: ModelPair, **settings: Any) -> ChatSession:
    return ChatSession(pair, Settings(**{"max_new_tokens": 10, **settings}))


def test_chat_prompt_uses_the_template_with_system_prompt_and_history(pair: ModelPair) -> None:
    session = new_session(pair, system_prompt="w20 w21")
    session.history = [
        {"role": "user", "content": "w7"},
        {"role": "assistant", "content": "w8 w9"},
    ]
    expected = pair.tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "w20 w21"},
            {"role": "user", "content": "w7"},
            {"role": "assistant", "content": "w8 w9"},
            {"role": "user", "content": PROMPT},
        ],
        add_generation_prompt=True,
        return_dict=False,
    )
    assert session.prompt_ids(PROMPT) == list(expected)
    text = pair.tokenizer.decode(session.prompt_ids(PROMPT))
    assert text.endswith("<|im_start|> user w7 w8 w9 <|im_end|> <|im_start|> assistant")


def test_without_a_system_prompt_none_is_sent(pair: ModelPair) -> None:
    session = new_session(pair)
    assert session.messages(PROMPT) == [{"role": "user", "content": PROMPT}]


def test_raw_mode_continues_the_text(pair: ModelPair) -> None:
    session = new_session(pair, chat=False)
    assert session.prompt_ids(PROMPT) == pair.tokenizer.encode(PROMPT)
    answer = session.answer(PROMPT)
    assert answer.mode == "raw"
    assert answer.prompt_tokens == len(pair.tokenizer.encode(PROMPT))
    assert session.history == []


def test_generators_run_in_order_with_the_same_seed(pair: ModelPair) -> None:
    session = new_session(pair, drafter_gen=True)
    answer = session.answer(PROMPT)
    assert list(answer.runs) == ["speculative", "target", "drafter"]
    speculative, target, drafter = (answer.runs[name] for name in answer.runs)
    assert speculative.result.kind == "speculative"
    assert target.result.kind == drafter.result.kind == "autoregressive"
    # greedy speculative decoding is the target's greedy output, token for token
    assert speculative.result.token_ids == target.result.token_ids
    assert speculative.text == target.text
    # and the drafter alone is a different model
    assert drafter.result.token_ids != target.result.token_ids
    ids = session.prompt_ids("w10")
    expected_drafter = pair.tokenizer.decode(drafter.result.token_ids, skip_special_tokens=True)
    assert drafter.text == expected_drafter
    assert ids  # the history changed the next prompt
    for run in answer.runs.values():
        assert run.result.new_tokens == len(run.result.token_ids) <= 10
        assert run.result.text == run.text
        assert "<|im_end|>" not in run.text


def test_sampling_answers_are_reproducible(pair: ModelPair) -> None:
    settings = {"processor": "topk", "temperature": 1.5, "top_k": 8, "seed": 7}
    first = new_session(pair, **settings).answer(PROMPT)
    second = new_session(pair, **settings).answer(PROMPT)
    for name in ("speculative", "target"):
        assert first.runs[name].result.token_ids == second.runs[name].result.token_ids
    other = new_session(pair, **{**settings, "seed": 8}).answer(PROMPT)
    assert any(
        other.runs[name].result.token_ids != first.runs[name].result.token_ids
        for name in ("speculative", "target")
    )


def test_speedup_is_speculative_over_target_tokens_per_second(pair: ModelPair) -> None:
    answer = new_session(pair).answer(PROMPT)
    speculative = answer.runs["speculative"].result
    target = answer.runs["target"].result
    assert speculative.tokens_per_second is not None
    assert target.tokens_per_second is not None
    assert answer.speedup == pytest.approx(speculative.tokens_per_second / target.tokens_per_second)
    assert speculative.seconds != target.seconds  # each run has its own timer


def test_speedup_needs_both_runs(pair: ModelPair) -> None:
    assert new_session(pair, target_gen=False).answer(PROMPT).speedup is None
    answer = new_session(pair, speculative=False).answer(PROMPT)
    assert list(answer.runs) == ["target"]
    assert answer.speedup is None


def test_the_speculative_answer_becomes_the_assistant_turn(pair: ModelPair) -> None:
    session = new_session(pair, drafter_gen=True)
    first = session.answer(PROMPT)
    assert session.history == [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": first.runs["speculative"].text},
    ]
    second = session.answer("w10 w11")
    assert len(session.history) == 4
    assert session.history[3]["content"] == second.runs["speculative"].text
    # the second prompt was built on the first turn
    assert second.prompt_tokens > first.prompt_tokens


def test_without_speculation_the_target_answers(pair: ModelPair) -> None:
    session = new_session(pair, speculative=False, drafter_gen=True)
    answer = session.answer(PROMPT)
    assert session.history[1]["content"] == answer.runs["target"].text


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t"])
def test_an_empty_prompt_is_refused_politely(pair: ModelPair, prompt: str) -> None:
    session = new_session(pair)
    events: list[SessionEvent] = []
    answer = session.answer(prompt, events.append)
    assert answer.refusal == "Nothing to answer: the prompt is empty."
    assert answer.runs == {}
    assert events == []
    assert session.history == []


def test_all_generators_off_is_refused(pair: ModelPair) -> None:
    session = new_session(pair, speculative=False, target_gen=False)
    answer = session.answer(PROMPT)
    assert answer.refusal is not None and "/speculative" in answer.refusal
    assert answer.runs == {}


def test_a_prompt_longer_than_the_context_is_refused(pair: ModelPair) -> None:
    session = new_session(pair)
    session.history = [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
    answer = session.answer(" ".join(["w9"] * 300))
    assert answer.refusal is not None
    assert "too long" in answer.refusal and "256" in answer.refusal
    assert "/reset" in answer.refusal
    assert answer.runs == {}
    assert len(session.history) == 2
    assert session.answer(PROMPT).refusal is None


def test_events_stream_every_run(pair: ModelPair) -> None:
    session = new_session(pair, drafter_gen=True)
    events: list[SessionEvent] = []
    answer = session.answer(PROMPT, events.append)
    for name, run in answer.runs.items():
        mine = [event for event in events if event.generator == name]
        assert isinstance(mine[0], RunStarted)
        assert mine[0].prompt_tokens == answer.prompt_tokens
        assert isinstance(mine[-1], RunFinished) and mine[-1].run is run
        steps = [event for event in mine if isinstance(event, RunStep)]
        assert len(steps) == run.result.steps
        assert [t for step in steps for t in step.step.appended] == run.result.token_ids
        assert "".join(step.text for step in steps) == run.text
        assert all(step.pieces is None for step in steps)  # debug is off
    order = [event.generator for event in events if isinstance(event, RunStarted)]
    assert order == ["speculative", "target", "drafter"]


def test_debug_pieces_describe_each_step(pair: ModelPair) -> None:
    session = new_session(pair, debug=True, max_new_tokens=30)
    events: list[SessionEvent] = []
    answer = session.answer(PROMPT, events.append)
    tokenizer = pair.tokenizer
    steps = [e for e in events if isinstance(e, RunStep) and e.generator == "speculative"]
    assert steps
    for event in steps:
        step, pieces = event.step, event.pieces
        assert pieces is not None
        shown = [*pieces.accepted, *([pieces.target] if pieces.target is not None else [])]
        assert shown == [tokenizer.decode([t]) for t in step.appended]
        if step.accepted < step.gamma and len(step.appended) > step.accepted:
            assert pieces.rejected == tokenizer.decode([step.drafts[step.accepted]])
        else:
            assert pieces.rejected is None
    run = answer.runs["speculative"]
    assert any(event.pieces and event.pieces.rejected for event in steps)
    assert sum(run.result.drafted_per_position) == run.result.drafted
    assert all(rate is not None and 0 <= rate <= 1 for rate in run.result.acceptance_per_position)
    # a draft is accepted only after every earlier one was
    accepted = run.result.accepted_per_position
    assert accepted == sorted(accepted, reverse=True)


def test_ctrl_c_keeps_the_partial_run_and_the_session(pair: ModelPair) -> None:
    session = new_session(pair, max_new_tokens=20, chat=True)
    session.history = [{"role": "user", "content": "w7"}, {"role": "assistant", "content": "w8"}]
    history = list(session.history)
    events: list[SessionEvent] = []
    with interrupt_on_call(pair.target.model, 3):
        answer = session.answer("w10 w11 w12 w13", events.append)
    assert answer.interrupted
    assert list(answer.runs) == ["speculative"]  # the rest was not started
    run = answer.runs["speculative"]
    assert run.interrupted and run.result.stop_reason == "interrupted"
    assert 0 < run.result.new_tokens < 20
    assert run.text == pair.tokenizer.decode(run.result.token_ids, skip_special_tokens=True)
    assert isinstance(events[-1], RunFinished) and events[-1].run.interrupted
    assert answer.speedup is None
    assert session.history == history  # no half answer in the history
    # the session goes on, and answers as a fresh one would
    again = session.answer("w10 w11 w12 w13")
    fresh = new_session(pair, max_new_tokens=20)
    fresh.history = list(history)
    assert (
        again.runs["speculative"].result.token_ids
        == fresh.answer("w10 w11 w12 w13").runs["speculative"].result.token_ids
    )


def test_ctrl_c_in_the_target_run_keeps_the_speculative_one(pair: ModelPair) -> None:
    session = new_session(pair, speculative=True)
    first = session.answer(PROMPT)
    speculative_calls = first.runs["speculative"].result.steps
    session.reset()
    with interrupt_on_call(pair.target.model, speculative_calls + 2):
        answer = session.answer(PROMPT)
    assert not answer.runs["speculative"].interrupted
    assert answer.runs["target"].interrupted
    assert answer.interrupted and answer.speedup is None
    assert session.history == []


def test_settings_changed_through_the_session_are_validated(pair: ModelPair) -> None:
    session = new_session(pair)
    changes = session.update(gamma=6, processor="nucleus")
    assert [(c.name, c.old, c.new) for c in changes] == [
        ("gamma", 4, 6),
        ("processor", "greedy", "nucleus"),
    ]
    before = session.settings
    with pytest.raises(ValueError, match="gamma must be"):
        session.update(gamma=0, seed=3)
    assert session.settings is before


def test_a_pair_without_drafter_runs_the_target(pair: ModelPair) -> None:
    alone = ModelPair.from_models(pair.target.model, None, pair.tokenizer)
    session = ChatSession(alone, Settings(max_new_tokens=6, drafter_gen=True))
    answer = session.answer(PROMPT)
    assert list(answer.runs) == ["target"]


def test_warm_up_changes_nothing(pair: ModelPair) -> None:
    session = new_session(pair, gamma=3)
    settings = session.settings
    session.warm_up()
    assert session.settings is settings
    assert session.history == []


def test_answer_to_dict_is_plain_data(pair: ModelPair) -> None:
    answer = new_session(pair).answer(PROMPT)
    data = answer.to_dict()
    assert data["speedup"] == answer.speedup
    runs = data["runs"]
    assert isinstance(runs, dict)
    assert runs["speculative"]["text"] == answer.runs["speculative"].text
    assert runs["target"]["acceptance_rate"] is None
    assert runs["target"]["drafted"] is None
    assert runs["speculative"]["drafted"] == answer.runs["speculative"].result.drafted


@pytest.mark.parametrize("kind", ["model", "ngram", "lookup"])
@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_every_drafter_kind_answers_with_the_target_text(pair: ModelPair, kind, policy) -> None:
    session = new_session(pair, drafter_kind=kind, gamma_policy=policy, max_new_tokens=24)
    for prompt in (PROMPT, "w10 w11 w10 w11 w10"):  # two turns: n-gram state carries over
        answer = session.answer(prompt)
        assert answer.refusal is None
        assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids


def test_without_a_drafter_model_the_ngram_drafters_still_speculate() -> None:
    target = tiny_llama(32, seed=4)
    alone = ModelPair.from_models(target, None, tiny_tokenizer(32))
    session = ChatSession(alone, Settings(max_new_tokens=8))
    assert not session.settings.speculative  # the model drafter has no model
    with pytest.raises(ValueError, match="drafter_kind ngram or lookup"):
        session.update(speculative=True)
    session.update(drafter_kind="lookup", speculative=True)
    answer = session.answer(PROMPT)
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids
    with pytest.raises(ValueError, match="needs a drafter model"):
        session.update(drafter_kind="model")
    assert session.settings.drafter_kind == "lookup"


def test_reset_forgets_kept_ngram_counts(pair: ModelPair) -> None:
    session = new_session(pair, drafter_kind="ngram", ngram_keep=True)
    session.answer(PROMPT)
    kept = session._drafter(session.settings)
    assert kept is session._drafter(session.settings) and kept.counts
    session.reset()
    assert session._drafter(session.settings) is not kept
