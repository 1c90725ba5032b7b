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
  drafter token, of a drafter's read of unseen context and of verifying k
  drafts, pick the source and gamma that maximise expected tokens per second.
  With one acceptance rate a, tokens per step are (1 - a^(g+1)) / (1 - a)
  (Leviathan et al. 2023); every policy keeps a rate per draft source and
  position instead (`step_estimates.py`: what finished steps have shown).
  Gamma 0 (the target alone) is chosen when drafting does not pay; a probe at
  the initial gamma now and then keeps the estimates alive.

A drafter with several sources (the hybrid: prompt lookup and a model) offers
them each step as `Offer`s; `choose` picks one with its gamma and says why
(`Choice.reason`, shown by /debug and kept in the JSON). A policy kept across
a chat's turns keeps what it learnt (`start` begins a generation, not a new
policy).

This module knows nothing about models: it reads `Offer`s and `StepEvent`s only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from specrepl.engine.results import Offer, StepEvent
from specrepl.engine.step_estimates import SourceEstimates, StepEstimates

POLICIES = ("fixed", "heuristic", "confidence", "auto")


class GammaPolicy(Protocol):
    name: str
    min_confidence: float
    max_gamma: int

    def start(self) -> None:
        """A new generation begins."""

    def next_gamma(self) -> int:
        """Drafts to ask for in the next step (0: the target alone)."""

    def observe(self, event: StepEvent) -> None:
        """A step finished."""

    def prime(self, seconds: Mapping[int, float]) -> None:
        """Seconds of a target step with k drafts, timed before the run."""

    def choose(self, offers: Sequence[Offer], budget: int | None = None) -> Choice:
        """The draft source and gamma for the next step, among what the drafter
        offers; `budget` is how many tokens the answer may still take."""


def expected_tokens(acceptance: float, gamma: float) -> float:
    """Expected tokens per verification step for iid acceptance `acceptance`."""
    if acceptance >= 1.0:
        return gamma + 1.0
    return (1.0 - acceptance ** (gamma + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class Choice:
    """A step's draft source and gamma, and why (`reason`, for /debug and JSON)."""

    source: str
    gamma: int
    reason: str = ""


def _labels(offers: Sequence[Offer]) -> dict[str, str]:
    """How `_describe` names each offered source: with its offer's profile
    where it has one ("lookup[match 4-7]")."""
    return {offer.source: f"{offer.source}[{offer.profile}]" for offer in offers if offer.profile}


def _describe(
    choice: tuple[str, int],
    rates: Mapping[tuple[str, int], float],
    unit: str = "/s",
    labels: Mapping[str, str] | None = None,
) -> str:
    """The chosen (source, gamma) and the best of every other option, in `unit`;
    a source is named by `labels` where it has one."""
    labels = labels or {}
    best: dict[str, tuple[int, float]] = {}
    for (source, gamma), rate in rates.items():
        if source not in best or rate > best[source][1]:
            best[source] = (gamma, rate)

    def name(source: str) -> str:
        return labels.get(source, source) or "none"

    chosen_source = choice[0]
    parts = [f"{name(chosen_source)}:{choice[1]} {rates[choice]:.1f}{unit}"]
    parts += [
        f"{name(source)}:{gamma} {rate:.1f}{unit}"
        for source, (gamma, rate) in sorted(best.items(), key=lambda item: -item[1][1])
        if source != chosen_source
    ]
    return " > ".join(parts[:1]) + ("; " + ", ".join(parts[1:]) if len(parts) > 1 else "")


class _SourceChoosing:
    """What every policy shares: estimates from finished steps, and the choice
    among draft sources at the policy's gamma: the one expected to give the
    most tokens per step (from acceptance alone, so that a seeded sampled
    answer repeats token for token). `AutoGamma` instead chooses source and
    gamma together by expected tokens per second, timings included."""

    name: str
    min_confidence = 0.0
    max_gamma: int

    def start(self) -> None:
        """A new generation: estimates learnt by earlier ones are kept (a policy
        kept across a chat's turns starts each turn from them)."""
        if getattr(self, "estimates", None) is None:
            self.estimates = StepEstimates(max(self.max_gamma, 1))
        else:
            self.estimates.new_generation()

    def next_gamma(self) -> int:
        raise NotImplementedError

    def prime(self, seconds: Mapping[int, float]) -> None:
        self.estimates.prime(seconds)

    def observe(self, event: StepEvent) -> None:
        self.estimates.observe(event)

    def choose(self, offers: Sequence[Offer], budget: int | None = None) -> Choice:
        """The source and gamma for the next step among `offers` (in the
        drafter's order of preference when nothing tells them apart)."""
        gamma = self.next_gamma()
        usable = [offer for offer in offers if offer.drafts > 0]
        self.estimates.offers = tuple(usable)
        if gamma <= 0 or not usable:
            return Choice("", 0, "the policy asked for no drafts" if gamma <= 0 else "no draft")
        if len(usable) == 1:
            return Choice(usable[0].source, min(gamma, usable[0].drafts))
        # by expected tokens alone, not timings: a fixed policy's seeded samples repeat
        tokens = {
            (offer.source, min(gamma, offer.drafts)): self.estimates.expected_tokens(
                offer, min(gamma, offer.drafts)
            )
            for offer in usable
        }
        best = max(tokens, key=tokens.__getitem__)
        return Choice(best[0], best[1], _describe(best, tokens, "tokens/step", _labels(usable)))


class FixedGamma(_SourceChoosing):
    name = "fixed"

    def __init__(self, gamma: int) -> None:
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = gamma
        self.max_gamma = gamma
        self.start()

    def next_gamma(self) -> int:
        return self.gamma


class HeuristicGamma(_SourceChoosing):
    """+1 after a step whose drafts were all accepted, -1 after a rejection."""

    name = "heuristic"

    def __init__(self, max_gamma: int, initial: int = 4, min_gamma: int = 1) -> None:
        self.min_gamma = min_gamma
        self.max_gamma = max(max_gamma, min_gamma)
        self.initial = min(max(initial, min_gamma), self.max_gamma)
        self.start()

    def start(self) -> None:
        super().start()
        self.gamma = self.initial

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, event: StepEvent) -> None:
        super().observe(event)
        if event.gamma == 0:
            return
        step = 1 if event.accepted == event.gamma else -1
        self.gamma = min(self.max_gamma, max(self.min_gamma, self.gamma + step))


class ConfidenceGamma(_SourceChoosing):
    """Draft up to max_gamma; the drafter stops below `threshold` confidence."""

    name = "confidence"

    def __init__(self, max_gamma: int, threshold: float = 0.4) -> None:
        if not 0 <= threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        self.max_gamma = max_gamma
        self.min_confidence = threshold
        self.start()

    def next_gamma(self) -> int:
        return self.max_gamma


class AutoGamma(_SourceChoosing):
    """Maximise expected tokens per second from measured acceptance and costs.

    For every source the drafter offers (a hybrid offers prompt lookup and its
    model) and every gamma up to what the source can give, the expected tokens
    of the step over its expected seconds (the source's drafting, its read of
    unseen context with a catch-up shared over the rest of the answer, and the
    target's verification of that many drafts; see `StepEstimates`), against
    the target alone. All estimates are exponentially weighted, so they follow
    the text.

    Gamma 0 is not chosen before three first drafts of an offered source have
    been seen: one early rejection says little, and leaving drafting is costly
    to undo because only a probe brings new evidence: every `probe_every`
    plain steps the first source offered drafts `initial` tokens, and where
    the target alone would be chosen while a source whose drafts cannot be
    scored unused (a model, not prompt lookup) has been passed over for
    `probe_every` steps, that source drafts them. Without the second, a model
    whose rates sank on one hard stretch stays unused for as long as prompt
    lookup's offers keep interrupting the plain steps.

    The same holds past a short gamma: drafting g tokens a step tries only
    positions 1..g, so one rejection at position g + 1 keeps the rates beyond
    it low for about a hundred steps (their long-run memory), whatever the
    steps after it show. After `probe_every` drafting steps in a row with
    fewer than `initial` drafts, a source whose drafts cannot be scored
    unused drafts `initial` once (a probe costs at most `initial` - 1 drafts
    that a short gamma would not have made).
    """

    name = "auto"
    MIN_EVIDENCE = 3
    """Drafting steps of a source seen before the target alone may be chosen."""

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
        if getattr(self, "estimates", None) is None:
            self.estimates = StepEstimates(max(self.max_gamma, 1), self.decay)
            self.last_source = ""
            self.short_steps = 0
            """Drafting steps in a row with fewer than `initial` drafts."""
        else:
            self.estimates.new_generation()

    # -- what one source's figures say (the last source used, by default) --

    def _source(self, source: str | None) -> SourceEstimates:
        return self.estimates.source(self.last_source if source is None else source)

    def position_acceptance(self, source: str | None = None) -> list[float]:
        return self._source(source).position_acceptance()

    def expected_tokens(self, gamma: int, source: str | None = None) -> float:
        return self._source(source).expected_tokens(gamma)

    @property
    def draft_cost(self) -> float | None:
        return self._source(None).draft_cost

    @property
    def target_cost(self) -> dict[int, float]:
        return self.estimates.target_cost

    @property
    def plain_steps(self) -> int:
        return self.estimates.plain_steps

    def verify_cost(self, k: int) -> float:
        return self.estimates.verify_cost(k)

    def rates(self, source: str | None = None) -> dict[int, float]:
        """Expected tokens per second for every gamma in 0..max_gamma (one source)."""
        offer = Offer(self.last_source if source is None else source, self.max_gamma)
        return {g: self.estimates.rate(offer, g) for g in range(self.max_gamma + 1)}

    def observe(self, event: StepEvent) -> None:
        super().observe(event)
        if event.gamma > 0:
            self.last_source = event.source
            self.short_steps = self.short_steps + 1 if event.gamma < self.initial else 0

    def next_gamma(self) -> int:
        return self.choose([Offer(self.last_source, self.max_gamma)]).gamma

    def choose(self, offers: Sequence[Offer], budget: int | None = None) -> Choice:
        estimates = self.estimates
        usable = [offer for offer in offers if offer.drafts > 0 and self.max_gamma > 0]
        estimates.offers = tuple(usable)
        if not usable:
            return Choice("", 0, "no draft offered")
        if not estimates.target_cost:  # the drafter's first choice, at the initial gamma
            first = usable[0]
            return Choice(first.source, min(first.drafts, self.initial), "nothing timed yet")
        plain = estimates.plain_steps
        if plain and plain % self.probe_every == 0:
            probe = usable[0]  # look again: the text may have become easier to draft
            return Choice(probe.source, min(probe.drafts, self.initial), "probe")
        rates: dict[tuple[str, int], float] = {}
        for offer in usable:
            for gamma in range(1, min(offer.drafts, self.max_gamma) + 1):
                rates[(offer.source, gamma)] = estimates.rate(offer, gamma, budget)
        evidence = max(estimates.source(offer.source).seen for offer in usable)
        if evidence >= self.MIN_EVIDENCE:  # else too few drafts seen to give up on drafting
            rates[("", 0)] = estimates.rate(Offer("", 0), 0)
        best = max(rates, key=rates.__getitem__)
        if best == ("", 0):
            stale = self._stale(usable)
            if stale is not None:
                return Choice(stale.source, min(stale.drafts, self.initial), "probe")
        elif best[1] < self.initial and self.short_steps >= self.probe_every:
            offer = next(offer for offer in usable if offer.source == best[0])
            if offer.tokens is None and offer.drafts > best[1]:
                return Choice(offer.source, min(offer.drafts, self.initial), "probe")
        return Choice(best[0], best[1], _describe(best, rates, labels=_labels(usable)))

    def _stale(self, offers: Sequence[Offer]) -> Offer | None:
        """The offer, of a source whose drafts cannot be scored unused, passed
        over longest, if for at least `probe_every` steps."""
        counts = {
            offer: self.estimates.source(offer.source).passed_over
            for offer in offers
            if offer.tokens is None
        }
        stale = max(counts, key=counts.__getitem__, default=None)
        return stale if stale is not None and counts[stale] >= self.probe_every else None


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
