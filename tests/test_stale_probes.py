"""Auto gamma probes a model passed over for long (`AutoGamma._stale`): a
hybrid whose model's rates sank on a hard stretch is tried again where the
target alone would be chosen, though prompt lookup's offers keep coming; and
a gamma held down by one rejection past it while every draft is kept is
probed longer now and then."""

from __future__ import annotations

from specrepl.engine.gamma import AutoGamma
from specrepl.engine.results import Offer, StepEvent
from specrepl.engine.step_estimates import StepEstimates

# what the target keeps is 0, 1, 2, ...: these lookup drafts are always wrong
WRONG_LOOKUP = Offer("lookup", 8, tokens=(9,) * 8, profile="match 2-3")
MODEL = Offer("model", 8, unread=1)


def _step(source: str, gamma: int, accepted: int) -> StepEvent:
    return StepEvent(
        drafts=tuple(range(gamma)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=0.004 * gamma if source == "model" else 0.0,
        target_seconds=0.02 + 0.005 * gamma,
        seconds_since_start=0.0,
        requested_gamma=gamma,
        source=source if gamma else "",
        read_seconds=0.01 if source == "model" and gamma else 0.0,
        read_tokens=1 if source == "model" and gamma else 0,
    )


def _policy_after_a_hard_stretch() -> AutoGamma:
    """The model's drafts all rejected for a while: auto leaves drafting."""
    policy = AutoGamma(8)
    policy.prime({k: 0.02 + 0.005 * k for k in range(9)})
    for _ in range(12):
        choice = policy.choose([MODEL])
        policy.observe(_step(choice.source, choice.gamma, 0))
    assert policy.choose([MODEL]).gamma == 0
    return policy


def test_a_model_passed_over_is_probed_though_lookup_keeps_offering() -> None:
    policy = _policy_after_a_hard_stretch()
    choices = []
    for _ in range(60):  # now the model would be right every time
        choice = policy.choose([WRONG_LOOKUP, MODEL])
        choices.append(choice)
        accepted = choice.gamma if choice.source == "model" else 0
        policy.observe(_step(choice.source, choice.gamma, accepted))
    probes = [c for c in choices if c.reason == "probe" and c.source == "model"]
    assert probes, [c.reason for c in choices]
    assert all(c.source == "model" and c.gamma >= 4 for c in choices[-10:])


def test_a_model_passed_over_for_a_better_source_is_not_probed() -> None:
    right_lookup = Offer("lookup", 8, tokens=tuple(range(8)), profile="match 16+")
    policy = AutoGamma(8)
    policy.prime({k: 0.02 + 0.005 * k for k in range(9)})
    sources = []
    for _ in range(60):
        choice = policy.choose([right_lookup, MODEL])
        sources.append(choice.source)
        accepted = choice.gamma if choice.source == "lookup" else 0
        policy.observe(_step(choice.source, choice.gamma, accepted))
    assert sources[-40:] == ["lookup"] * 40
    assert policy.estimates.source("model").passed_over >= 40


def test_passed_over_counts_offers_that_cannot_be_scored_unused() -> None:
    estimates = StepEstimates(4)
    for _ in range(3):
        estimates.offers = (WRONG_LOOKUP, MODEL)
        estimates.observe(_step("", 0, 0))
    assert estimates.source("model").passed_over == 3
    assert estimates.source("lookup").passed_over == 0  # scored unused instead
    estimates.offers = (WRONG_LOOKUP, MODEL)
    estimates.observe(_step("lookup", 4, 0))
    assert estimates.source("model").passed_over == 4
    estimates.offers = (WRONG_LOOKUP, MODEL)
    estimates.observe(_step("model", 4, 4))
    assert estimates.source("model").passed_over == 0


def _verify_seconds(k: int) -> float:
    """A target step of k drafts: llama.cpp's float32 target on a 2-core CPU
    (19 / 31 / 40 / 54 ms for 1 / 4 / 8 / 16 tokens), in between a line."""
    widths, seconds = (1, 4, 8, 16), (0.019, 0.031, 0.040, 0.054)
    width = min(k + 1, 16)
    for index in range(len(widths) - 1):
        w0, w1, t0, t1 = widths[index], widths[index + 1], seconds[index], seconds[index + 1]
        if w0 <= width <= w1:
            return t0 + (t1 - t0) * (width - w0) / (w1 - w0)
    raise AssertionError(width)


def _copy_step(gamma: int, accepted: int) -> StepEvent:
    """A step of the copy drafting `gamma` at 8 ms a draft."""
    return StepEvent(
        drafts=tuple(range(gamma)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=0.008 * gamma,
        target_seconds=_verify_seconds(gamma),
        seconds_since_start=0.0,
        requested_gamma=gamma,
        source="model" if gamma else "",
        read_seconds=0.008 if gamma else 0.0,
        read_tokens=1 if gamma else 0,
    )


def _after_one_rejection_past_the_gamma(probe_every: int, right: int) -> list[int]:
    """The copy's first steps drafted 4, 9 and 7 with the last one's second
    draft refused; from then on its first `right` drafts of every step are
    kept but on every seventh step, refused at its first: the gammas chosen."""
    model = Offer("model", 16, unread=1)
    policy = AutoGamma(16, probe_every=probe_every)
    policy.prime({k: _verify_seconds(k) for k in range(17)})
    policy.observe(_copy_step(0, 0))  # the prompt pass
    for accepted in (4, 9, 1):
        choice = policy.choose([model])
        policy.observe(_copy_step(choice.gamma, min(choice.gamma, accepted)))
    gammas = []
    for index in range(60):
        choice = policy.choose([model])
        gammas.append(choice.gamma)
        accepted = 0 if index % 7 == 6 else min(choice.gamma, right)
        policy.observe(_copy_step(choice.gamma, accepted))
    return gammas


def test_a_short_gamma_held_down_by_one_rejection_is_probed_longer() -> None:
    held_down = _after_one_rejection_past_the_gamma(probe_every=10_000, right=16)
    assert max(held_down) == 1, held_down  # one draft a step for all 60 ...
    probed = _after_one_rejection_past_the_gamma(probe_every=16, right=16)
    assert min(probed[20:]) >= 4, probed  # ... until a probe shows it was one bad moment


def test_a_probe_does_not_lengthen_a_gamma_that_is_short_for_a_reason() -> None:
    gammas = _after_one_rejection_past_the_gamma(probe_every=16, right=1)
    longer = [gamma for gamma in gammas if gamma > 1]
    assert len(longer) <= len(gammas) // 16 + 1, gammas  # a probe now and then, no more
