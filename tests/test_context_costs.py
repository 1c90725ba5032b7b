"""Costs that follow the context: a chat's long turns are not priced by its short ones.

At a long context a wide target pass and a draft both cost more, and not in
the proportions of a short one (on a 2-core AMD EPYC, 15 drafts cost 78 ms
after 48 tokens and about 200 after 2,700, 7 drafts 65 and about 140; a
llama.cpp draft 10 ms and 25). The width plan is timed after a short and a
long context, and the auto policy carries what it measured to the context of
the step it decides.
"""

from __future__ import annotations

import pytest

from specrepl.engine import widths
from specrepl.engine.gamma import AutoGamma
from specrepl.engine.results import Offer, StepEvent
from specrepl.engine.step_estimates import SourceEstimates, StepEstimates
from specrepl.models import width_plans
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_llama, tiny_tokenizer

SHORT = {0: 0.045, **{k: 0.065 for k in range(1, 8)}, **{k: 0.078 for k in range(8, 16)}}
"""Seconds of a step with k drafts after 48 tokens (widths padded: 8 and 16)."""
LONG = {0: 0.050, **{k: 0.085 for k in range(1, 8)}, **{k: 0.120 for k in range(8, 16)}}
"""The same after 1,024 tokens."""


def event(gamma: int, accepted: int, draft: float, verify: float, context: int) -> StepEvent:
    return StepEvent(
        drafts=tuple(range(gamma)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=gamma * draft,
        target_seconds=verify,
        seconds_since_start=0.0,
        requested_gamma=gamma,
        source="model",
        context=context,
    )


def on_the_line(k: int, context: int) -> float:
    short, long = SHORT[k], LONG[k]
    return short + (long - short) * max(context - 48, 0) / (1024 - 48)


def test_the_timed_cost_lies_on_the_line_through_both_timings() -> None:
    estimates = StepEstimates(15)
    estimates.prime(SHORT, LONG, (48, 1024))
    assert estimates.prior_at(15, 48) == pytest.approx(0.078)
    assert estimates.prior_at(15, 1024) == pytest.approx(0.120)
    assert estimates.prior_at(15, 2700) == pytest.approx(on_the_line(15, 2700))
    assert estimates.prior_at(15, 10) == pytest.approx(0.078)  # never below the short timing
    assert estimates.prior_at(15, None) == pytest.approx(0.078)
    assert estimates.prior_at(16, 500) is None  # not timed
    falling = StepEstimates(15)
    falling.prime(SHORT, {k: 0.5 * t for k, t in SHORT.items()}, (48, 1024))  # noise
    assert falling.prior_at(7, 5000) == pytest.approx(SHORT[7])
    alone = StepEstimates(15)
    alone.prime(SHORT)  # a plan stored before the long timing: as before
    assert alone.prior_at(15, 2700) == pytest.approx(0.078)


def test_a_cost_measured_at_one_context_is_carried_to_another() -> None:
    estimates = StepEstimates(15)
    estimates.prime(SHORT, LONG, (48, 1024))
    for _ in range(3):  # the first step's timings are the prompt pass's: left out
        estimates.observe(event(15, 15, 0.010, 1.2 * on_the_line(15, 100), context=100))
    estimates.context = 100
    assert estimates.verify_cost(15) == pytest.approx(1.2 * on_the_line(15, 100))
    estimates.context = 2700
    assert estimates.verify_cost(15) == pytest.approx(1.2 * on_the_line(15, 2700))
    # a width not measured: its timing at this context, scaled as the measured ones
    assert estimates.verify_cost(7) == pytest.approx(1.2 * on_the_line(7, 2700))


def test_a_drafts_cost_follows_the_line_its_steps_draw_against_the_context() -> None:
    source = SourceEstimates(15, decay=0.9)
    for context, seconds in ((100, 0.010), (400, 0.012), (1000, 0.016), (1300, 0.018)):
        source.observe_costs(event(8, 8, seconds, 0.1, context), catching_up=False)
    slope = (0.018 - 0.010) / 1200
    at_2700 = source.draft_cost_at(2700)
    assert at_2700 is not None and source.draft_cost is not None
    assert at_2700 > source.draft_cost
    expected = source.draft_cost + slope * (2700 - (source.cost_context or 0.0))
    assert at_2700 == pytest.approx(expected, rel=0.05)
    assert source.draft_cost_at(None) == source.draft_cost
    near = SourceEstimates(15, decay=0.9)  # contexts too close together to tell a slope
    for context in (500, 510, 520):
        near.observe_costs(event(8, 8, 0.010 + context * 1e-6, 0.1, context), catching_up=False)
    assert near.draft_cost_at(3000) == near.draft_cost


def test_auto_drafts_fewer_at_a_long_context_where_wide_passes_cost_more() -> None:
    """The chat of docs/gamma.md: 15 drafts pay after 100 tokens; after 2,700,
    with a draft at 25 ms and one rejection, 7 do. Without the long timing the
    policy kept the proportions of the short context and drafted 12 or more."""

    def run(long_timed: bool) -> tuple[int, int]:
        policy = AutoGamma(15)
        policy.prime(SHORT, LONG if long_timed else None, (48, 1024) if long_timed else None)
        policy.observe(event(4, 4, 0.010, 0.5, context=100))  # the prompt pass: no costs
        for index in range(10):
            context = 100 + 16 * index
            kept = 13 if index % 4 == 0 else 15
            policy.observe(event(15, kept, 0.010, on_the_line(15, context), context))
        short_turn = policy.choose([Offer("model", 15)], context=260).gamma
        for index, kept in enumerate((15, 10)):  # a pasted document: 2,700 tokens in
            context = 2700 + 16 * index
            policy.observe(event(15, kept, 0.025, on_the_line(15, context), context))
        return short_turn, policy.choose([Offer("model", 15)], context=2760).gamma

    short_turn, long_turn = run(long_timed=True)
    assert short_turn == 15 and long_turn <= 8
    assert run(long_timed=False)[1] >= 12


def test_plans_are_timed_after_a_long_context_too_and_stored_with_it(tmp_path, monkeypatch) -> None:
    contexts: list[int] = []

    def timed(model, max_width, *, context=48, **kwargs):
        contexts.append(context)
        scale = 1.0 if context < 100 else 1.5
        return {w: [scale * 0.01 * w] * 5 for w in range(1, max_width + 1)}

    monkeypatch.setattr(widths, "measure_width_samples", timed)
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))
    store = tmp_path / "widths.json"
    plan = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    long_context = min(width_plans.LONG_CONTEXT, 256 - 4 - 1)  # tiny_llama: 256 positions
    assert long_context in contexts and plan.contexts == (48, long_context)
    assert plan.long_seconds == pytest.approx({w: 0.015 * w for w in range(1, 5)})
    assert plan.long_step_seconds()[3] == pytest.approx(plan.long_seconds[plan.padded[4]])
    assert plan.to_dict()["contexts"] == [48, long_context]

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the store has it")

    monkeypatch.setattr(widths, "measure_width_samples", no_measuring)
    again = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    assert again == plan
