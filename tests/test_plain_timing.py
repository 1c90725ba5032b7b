"""The auto gamma policy times the target alone itself where its price matters.

Its one-token step is otherwise inferred from the start-up width timings,
which a CPU whose speed wanders can overstate; a policy that overprices the
target alone drafts where drafting loses (seen on an AMD EPYC 26/2: one draft
a step at 32 ms for 1.9 tokens, against 14 ms a token for the target alone)."""

from __future__ import annotations

import itertools

from specrepl.engine.gamma import AutoGamma
from specrepl.engine.results import Offer, StepEvent

PRIMED = {0: 0.022, **{k: 0.024 + 0.002 * k for k in range(1, 9)}}
"""Start-up timings that put the target alone at 22 ms a step."""
ONE_TOKEN = 0.014
"""What a step of the target alone really costs in these runs."""


def _step(gamma: int, accepted: int, draft: float, verify: float) -> StepEvent:
    return StepEvent(
        drafts=tuple(range(gamma)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=draft,
        target_seconds=verify,
        seconds_since_start=0.0,
        requested_gamma=gamma,
        source="model" if gamma else "",
        read_seconds=0.009 if gamma else 0.0,
        read_tokens=1 if gamma else 0,
    )


def _run(time_plain_every: int | None, steps: int = 60) -> list[tuple[int, str]]:
    """A copy whose first draft is right and whose second is not, at 9 ms a
    draft; its verification costs what the primed widths say, plus 1 ms."""
    policy = AutoGamma(8, time_plain_every=time_plain_every)
    policy.prime(PRIMED)
    policy.observe(_step(0, 0, 0.0, 0.2))  # the prompt pass
    choices = []
    for _ in range(steps):
        choice = policy.choose([Offer("model", 8, unread=1)], budget=200)
        choices.append((choice.gamma, choice.reason))
        if choice.gamma == 0:
            policy.observe(_step(0, 0, 0.0, ONE_TOKEN))
        else:
            verify = PRIMED[choice.gamma] + 0.001
            policy.observe(_step(choice.gamma, 1, 0.009 * choice.gamma, verify))
    return choices


def test_a_policy_that_times_the_target_alone_stops_drafting_where_it_loses() -> None:
    untimed = _run(None)
    timed = _run(64)
    # without timing it, the policy never tries the target alone: it prices it at
    # the primed 22 ms and one right draft a step looks better
    assert all(gamma > 0 for gamma, _ in untimed[-20:])
    assert sum(reason.startswith(AutoGamma.TIMING_PLAIN) for _, reason in timed) == 1
    assert [gamma for gamma, _ in timed[-20:]].count(0) >= 18  # the probes aside


def test_drafting_that_clearly_pays_is_not_interrupted_to_time_the_target_alone() -> None:
    policy = AutoGamma(8)
    policy.prime(PRIMED)
    policy.observe(_step(0, 0, 0.0, 0.2))
    for _ in range(200):
        choice = policy.choose([Offer("model", 8, unread=1)], budget=400)
        assert not choice.reason.startswith(AutoGamma.TIMING_PLAIN)
        gamma = choice.gamma
        policy.observe(_step(gamma, gamma, 0.001 * gamma, PRIMED[gamma]))


def test_the_target_alone_is_timed_again_after_a_long_stretch_of_drafting() -> None:
    policy = AutoGamma(8, time_plain_every=10)
    policy.prime(PRIMED)
    policy.observe(_step(0, 0, 0.0, 0.2))
    reasons = []
    for _ in range(40):
        choice = policy.choose([Offer("model", 8, unread=1)], budget=400)
        reasons.append(choice.reason)
        if choice.gamma == 0:
            policy.observe(_step(0, 0, 0.0, 0.030))  # the target alone: slow here
        else:  # drafting pays, but not twice over: the target alone's price matters
            g = choice.gamma
            policy.observe(_step(g, 1, 0.009 * g, PRIMED[g]))
    timings = [i for i, reason in enumerate(reasons) if reason.startswith(AutoGamma.TIMING_PLAIN)]
    assert len(timings) >= 3
    assert all(later - earlier > 10 for earlier, later in itertools.pairwise(timings))
