"""How many tokens to draft at each step: fixed, or chosen as decoding goes.

A `GammaPolicy` is asked for the next step's gamma and shown every finished
step. Any policy keeps speculative decoding lossless as long as its choice does
not depend on the target's output for the step being drafted, which holds for
all of these: they only look at finished steps (and `confidence` at the
drafter's own distribution).

- `fixed`: always the same gamma.
- `heuristic`: one more after a fully accepted step, one fewer after a rejection.
- `confidence`: up to the maximum, but the model drafter stops as soon as its
  most likely token has probability below a threshold.
- `auto`: from running acceptance estimates and the measured costs of a
  drafter token and of verifying k drafts, pick the gamma that maximises
  expected tokens per second. With one acceptance rate a, tokens per step are
  (1 - a^(g+1)) / (1 - a) (Leviathan et al. 2023); `auto` keeps a rate per
  draft position instead (see `AutoGamma`). Gamma 0 (the target alone) is
  chosen when drafting does not pay; a probe at the initial gamma now and then
  keeps the estimates alive.

This module knows nothing about models: it reads `StepEvent`s only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Protocol

from .results import StepEvent

POLICIES = ("fixed", "heuristic", "confidence", "auto")


class GammaPolicy(Protocol):
    name: str
    min_confidence: float

    def start(self) -> None:
        """A new generation begins."""

    def next_gamma(self) -> int:
        """Drafts to ask for in the next step (0: the target alone)."""

    def observe(self, event: StepEvent) -> None:
        """A step finished."""


class FixedGamma:
    name = "fixed"
    min_confidence = 0.0

    def __init__(self, gamma: int) -> None:
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = gamma

    def start(self) -> None:
        pass

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, event: StepEvent) -> None:
        pass


class HeuristicGamma:
    """+1 after a step whose drafts were all accepted, -1 after a rejection."""

    name = "heuristic"
    min_confidence = 0.0

    def __init__(self, max_gamma: int, initial: int = 4, min_gamma: int = 1) -> None:
        self.min_gamma = min_gamma
        self.max_gamma = max(max_gamma, min_gamma)
        self.initial = min(max(initial, min_gamma), self.max_gamma)
        self.gamma = self.initial

    def start(self) -> None:
        self.gamma = self.initial

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, event: StepEvent) -> None:
        if event.gamma == 0:
            return
        step = 1 if event.accepted == event.gamma else -1
        self.gamma = min(self.max_gamma, max(self.min_gamma, self.gamma + step))


class ConfidenceGamma:
    """Draft up to max_gamma; the drafter stops below `threshold` confidence."""

    name = "confidence"

    def __init__(self, max_gamma: int, threshold: float = 0.4) -> None:
        if not 0 <= threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        self.max_gamma = max_gamma
        self.min_confidence = threshold

    def start(self) -> None:
        pass

    def next_gamma(self) -> int:
        return self.max_gamma

    def observe(self, event: StepEvent) -> None:
        pass


def expected_tokens(acceptance: float, gamma: int) -> float:
    """Expected tokens per verification step for iid acceptance `acceptance`."""
    if acceptance >= 1.0:
        return gamma + 1.0
    return (1.0 - acceptance ** (gamma + 1)) / (1.0 - acceptance)


class AutoGamma:
    """Maximise expected tokens per second from measured acceptance and costs.

    Estimates, all exponentially weighted so they follow the text:
    - acceptance per draft position i: the chance that draft i is accepted
      given that drafts 1..i-1 were. Position 1 starts from a prior of 0.5 with
      the weight of two drafts, each later position from the one before it;
      the prior fades like the observations do.
      Per-position figures value correlated drafts right: a prompt-lookup draft
      that copies a span is usually all right or wrong at its first token,
      which an iid acceptance rate would undervalue;
    - the drafter's seconds per drafted token;
    - the target's seconds for a step with k drafts, as measured per k (a line
      through the measured k where one is missing). The first step (prompt
      processing) and the first drafting step after target-alone steps (the
      drafter catching up) are not used for the drafter's cost.

    Gamma 0 is not chosen before three drafting steps have been seen: one
    early rejection says little, and leaving drafting is costly to undo
    because only the probe every `probe_every` plain steps brings new evidence.

    `prime` gives the target's costs per k as timed before the run (the
    forward-width timings, `widths.py`); for a k not measured in this run they
    are used, scaled by how this run's measured steps compare with them. Without
    them, the step without drafts, never taken while drafting pays, would be
    judged from a line through the drafting steps, which on a CPU whose one-token
    step takes a cheaper kernel than wider ones overprices it.
    """

    name = "auto"
    min_confidence = 0.0
    PRIOR_WEIGHT = 2.0
    MIN_EVIDENCE = 3.0
    """Weighted count of first drafts seen before the target alone may be chosen."""

    def __init__(
        self,
        max_gamma: int,
        *,
        initial: int = 4,
        decay: float = 0.9,
        probe_every: int = 16,
    ) -> None:
        self.max_gamma = max_gamma
        self.initial = min(initial, max_gamma)
        self.decay = decay
        self.probe_every = probe_every
        self.start()

    def start(self) -> None:
        # per position (0-based): weighted counts of drafts tried and accepted
        self.tried = [0.0] * self.max_gamma
        self.taken = [0.0] * self.max_gamma
        self.prior_weight = [self.PRIOR_WEIGHT] * self.max_gamma  # fades like the counts
        self.draft_cost: float | None = None
        self.target_cost: dict[int, float] = {}
        self.prior_cost: dict[int, float] = {}
        self.steps = 0
        self.plain_steps = 0

    def position_acceptance(self) -> list[float]:
        """Estimated P(draft i accepted | drafts before it accepted), i = 1..max_gamma."""
        rates: list[float] = []
        prior = 0.5
        for tried, taken, weight in zip(self.tried, self.taken, self.prior_weight, strict=True):
            rate = (taken + weight * prior) / (tried + weight)
            rates.append(rate)
            prior = rate
        return rates

    def expected_tokens(self, gamma: int) -> float:
        """Tokens a step with `gamma` drafts is expected to append (bonus included)."""
        total, reach = 1.0, 1.0
        for rate in self.position_acceptance()[:gamma]:
            reach *= rate
            total += reach
        return total

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def observe(self, event: StepEvent) -> None:
        self.steps += 1
        # after steps without drafts, a model drafter first catches up on the
        # tokens it did not see: that step's draft time is not a per-draft cost
        catching_up = self.plain_steps > 0
        if event.gamma > 0:
            # positions 1..accepted were accepted; the next one, if drafted, was not
            reached = min(event.accepted + 1, event.gamma)
            for index in range(min(reached, self.max_gamma)):
                self.tried[index] = self.decay * self.tried[index] + 1
                self.taken[index] = self.decay * self.taken[index] + (index < event.accepted)
                self.prior_weight[index] *= self.decay
            self.plain_steps = 0
        else:
            self.plain_steps += 1
        if self.steps == 1:
            return  # prompt processing dominates the first step's timings
        if event.gamma > 0 and not catching_up:
            self.draft_cost = self._ema(self.draft_cost, event.draft_seconds / event.gamma)
        k = event.gamma
        self.target_cost[k] = self._ema(self.target_cost.get(k), event.target_seconds)

    def prime(self, seconds: Mapping[int, float]) -> None:
        """Seconds of a target step with k drafts, timed before this run (see the class)."""
        self.prior_cost = {k: t for k, t in seconds.items() if t > 0}

    def verify_cost(self, k: int) -> float:
        """Seconds for a target step with k drafts: as measured, or else from a
        line through what was measured.

        Measured values win because the cost need not grow with k: on a 2-core
        CPU the embedded target took 58, 97, 119, 89 and 81 ms to score 1 to 5
        tokens (small matrix shapes take slower kernels).
        """
        if k in self.target_cost:
            return self.target_cost[k]
        if k in self.prior_cost:
            ratios = [
                t / self.prior_cost[j] for j, t in self.target_cost.items() if j in self.prior_cost
            ]
            return self.prior_cost[k] * (statistics.median(ratios) if ratios else 1.0)
        known = sorted(self.target_cost.items())
        if len(known) == 1:
            ((k0, t0),) = known
            slope = 0.05 * t0  # prior: each extra position costs 5% of a step
            return max(t0 + slope * (k - k0), 1e-9)
        mean_k = sum(x for x, _ in known) / len(known)
        mean_t = sum(t for _, t in known) / len(known)
        spread = sum((x - mean_k) ** 2 for x, _ in known)
        slope = sum((x - mean_k) * (t - mean_t) for x, t in known) / spread
        slope = max(slope, 0.0)
        return max(mean_t + slope * (k - mean_k), 1e-9)

    def rates(self) -> dict[int, float]:
        """Expected tokens per second for every gamma in 0..max_gamma."""
        draft = self.draft_cost or 0.0
        return {
            g: self.expected_tokens(g) / (g * draft + self.verify_cost(g))
            for g in range(self.max_gamma + 1)
        }

    def next_gamma(self) -> int:
        if not self.target_cost:
            return self.initial
        if self.plain_steps and self.plain_steps % self.probe_every == 0:
            return self.initial  # look again: the text may have become easier to draft
        rates = self.rates()
        if self.tried[0] < self.MIN_EVIDENCE:
            del rates[0]  # too few drafts seen to give up on drafting
        return max(rates, key=rates.__getitem__)


def make_policy(name: str, gamma: int, *, confidence: float = 0.4) -> GammaPolicy:
    """Build a policy by name; `gamma` is the fixed value or the maximum."""
    if name == "fixed":
        return FixedGamma(gamma)
    if name == "heuristic":
        return HeuristicGamma(gamma, initial=min(4, gamma))
    if name == "confidence":
        return ConfidenceGamma(gamma, confidence)
    if name == "auto":
        return AutoGamma(gamma)
    raise ValueError(f"unknown gamma policy {name!r}; choose one of: {', '.join(POLICIES)}")
