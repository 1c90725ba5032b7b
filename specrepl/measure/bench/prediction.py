"""The speedup predicted from a run's own acceptance and costs (Leviathan et al. 2023).

(1 - a^(g+1)) / (1 - a) / (g*c + v), with c the drafter's seconds per drafted
token and v the seconds of a verification step, both over the target's
seconds for a one-token step of the target-only run on the same prompt; a is
the chance that a draft is accepted once the drafts before it were, estimated
as accepted / (accepted + rejections).

Plain arithmetic on the engine's step events: no torch, no rich, no model.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from specrepl.engine.gamma import expected_tokens
from specrepl.engine.results import StepEvent

__all__ = ["Prediction", "per_draft_acceptance", "predict_from_steps", "predicted_speedup"]


@dataclass(frozen=True)
class Prediction:
    """The speedup over target-only expected from measured acceptance and costs.

    `alpha` is the per-draft acceptance of the formula (accepted over accepted
    plus rejections); `draft_cost` (c) and `verify_cost` (v) are in units of
    the target's one-token step; `mean_gamma` is the mean number of drafts per
    step and `tokens_per_step` the expected tokens per verification step.
    """

    alpha: float
    mean_gamma: float
    draft_cost: float
    verify_cost: float
    tokens_per_step: float
    speedup: float


def predicted_speedup(
    acceptance: float, gamma: float, draft_cost: float, verify_cost: float
) -> float:
    """(1 - a^(g+1)) / (1 - a) / (g*c + v) (Leviathan et al. 2023): expected tokens per
    verification step over its cost in one-token target steps."""
    return expected_tokens(acceptance, gamma) / (gamma * draft_cost + verify_cost)


def per_draft_acceptance(accepted: int, rejections: int) -> float:
    """Per-draft acceptance: each step is `accepted` successes, then a failure
    unless every draft was accepted (the maximum-likelihood estimate for
    independent drafts)."""
    trials = accepted + rejections
    return accepted / trials if trials else 0.0


def predict_from_steps(
    speculative: Sequence[StepEvent], target_only: Sequence[StepEvent]
) -> Prediction | None:
    """The prediction for one speculative run from its steps and the same prompt's
    target-only steps.

    The first step of each run is left out of the costs (it processes the
    prompt). A gamma that changes from step to step (a policy) is handled per
    step: expected tokens are averaged over steps with each step's own draft
    count, which for a fixed gamma is exactly the formula above. None when
    either run has no decoding step after the first.
    """
    one_token = [event.target_seconds for event in target_only[1:]]
    steps = list(speculative[1:])
    if not one_token or not steps:
        return None
    step_seconds = statistics.fmean(one_token)
    if step_seconds <= 0:
        return None
    alpha = per_draft_acceptance(
        sum(event.accepted for event in speculative),
        sum(1 for event in speculative if event.accepted < event.gamma),
    )
    drafted_later = sum(event.gamma for event in steps)
    draft_seconds = sum(event.draft_seconds for event in steps)
    draft_cost = draft_seconds / drafted_later / step_seconds if drafted_later else 0.0
    verify_cost = statistics.fmean(event.target_seconds for event in steps) / step_seconds
    mean_gamma = statistics.fmean(event.gamma for event in steps)
    tokens = statistics.fmean(expected_tokens(alpha, event.gamma) for event in steps)
    cost = mean_gamma * draft_cost + verify_cost
    if cost <= 0:
        return None
    return Prediction(
        alpha=alpha,
        mean_gamma=mean_gamma,
        draft_cost=draft_cost,
        verify_cost=verify_cost,
        tokens_per_step=tokens,
        speedup=tokens / cost,
    )
