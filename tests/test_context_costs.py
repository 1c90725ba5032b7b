"""Costs priced at the context of the step being decided (`context_costs`, `step_estimates`)."""

from __future__ import annotations

import random

import pytest

from specrepl.engine.context_costs import ContextSlope
from specrepl.engine.results import StepEvent
from specrepl.engine.step_estimates import StepEstimates


def true_verify(k: int, positions: int) -> float:
    """A target step's seconds: a level per width, and attention over the context
    that grows with the positions fed (the shape llama.cpp shows on a CPU)."""
    return 0.019 + 0.003 * k + positions * (5e-6 + 1e-6 * k)


def true_draft(positions: int) -> float:
    return 0.008 + positions * 4.5e-6


def test_the_slope_is_recovered_per_width_and_as_a_line_in_k() -> None:
    rng = random.Random(0)
    slope = ContextSlope()
    for _ in range(400):
        k = rng.choice((0, 2, 4, 8))
        n = rng.randrange(50, 3000)
        slope.observe(k, n, true_verify(k, n) * (1 + rng.gauss(0, 0.02)))
    for k in (0, 4, 8, 12):  # 12 never seen: the line in k
        assert slope.slope(k) == pytest.approx(5e-6 + 1e-6 * k, rel=0.1)


def test_no_slope_without_spread_of_context() -> None:
    slope = ContextSlope()
    for step in range(50):
        slope.observe(step % 3, 1000 + step % 4, 0.03 + 0.001 * (step % 5))
    assert slope.slope(0) == 0.0
    slope.observe(0, 0, 5.0)  # an unknown context says nothing
    assert slope.slope(0) == 0.0


def chat_events(positions_known: bool) -> StepEstimates:
    """A chat whose context grows from 100 to 3,000 positions over turns; plain
    steps and steps of 4 drafts all along, steps of 8 drafts in the first turn
    only."""
    estimates = StepEstimates(max_gamma=8)
    rng = random.Random(1)
    position = 100
    for turn in range(8):
        estimates.new_generation()
        first = StepEvent((), 0, (1,), 0.0, 0.5, 0.0, positions=position if positions_known else 0)
        estimates.observe(first)
        position += 1
        for step in range(30):
            k = 8 if turn == 0 and step % 3 == 0 else (4 if step % 2 else 0)
            seconds = true_verify(k, position) * (1 + rng.gauss(0, 0.02))
            drafts = tuple(range(k))
            draft = true_draft(position) * k
            event = StepEvent(
                drafts,
                k,
                (*drafts, 1),
                draft,
                seconds,
                0.0,
                requested_gamma=k,
                source="model" if k else "",
                positions=position if positions_known else 0,
            )
            estimates.observe(event)
            position += k + 1
        position += 300  # the next turn's prompt (a pasted text now and then)
    return estimates


def test_a_cost_measured_turns_ago_is_priced_at_todays_context() -> None:
    estimates = chat_events(positions_known=True)
    assert estimates.positions > 2900
    for k in (0, 4, 8):
        expected = true_verify(k, estimates.positions)
        assert estimates.verify_cost(k) == pytest.approx(expected, rel=0.08), k
    drafting = estimates.source("model").drafting_seconds(4, 0, positions=estimates.positions)
    assert drafting == pytest.approx(4 * true_draft(estimates.positions), rel=0.08)


def test_without_positions_the_old_figures_stay_where_they_were_measured() -> None:
    """The negative control: the same chat with no context known prices a step
    of 8 drafts at the first turn's context, far below what it costs now."""
    estimates = chat_events(positions_known=False)
    known = chat_events(positions_known=True)
    now = known.positions
    assert estimates.verify_cost(8) < 0.7 * true_verify(8, now)
    assert known.verify_cost(8) > 0.9 * true_verify(8, now)
