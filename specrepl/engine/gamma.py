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
  position instead (see `SourceEstimates`). Gamma 0 (the target alone) is
  chosen when drafting does not pay; a probe at the initial gamma now and then
  keeps the estimates alive.

A drafter with several sources (the hybrid: prompt lookup and a model) offers
them each step as `Offer`s; `choose` picks one with its gamma and says why
(`Choice.reason`, shown by /debug and kept in the JSON). A policy kept across
a chat's turns keeps what it learnt (`start` begins a generation, not a new
policy).

This module knows nothing about models: it reads `Offer`s and `StepEvent`s only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from specrepl.engine.results import Offer, StepEvent

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


def expected_tokens(acceptance: float, gamma: int) -> float:
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


def _ema(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1 - decay) * new


class SourceEstimates:
    """What one draft source has shown: acceptance per draft position and its costs.

    Acceptance at position i is the chance that draft i is accepted given that
    drafts 1..i-1 were. Two sets of counts are kept: recent ones (faded by the
    policy's decay, about ten steps) and long-run ones (`LONG_DECAY`, about a
    hundred: across a chat's turns); the recent rate at a position has the
    long-run rate there as its prior (weight of one draft), and a long-run
    rate has the one of the position before it (0.5 for the first). Every
    step fades all evidence (`fade`), used or not: a position or a source
    that is no longer tried drifts back to what it has done in the long run
    instead of keeping one bad moment for ever (drafting two tokens because
    the third once failed, or never trying the model again after a turn where
    it could not see a pasted text). Per-position figures
    value correlated drafts right: a prompt-lookup draft that copies a span is
    usually all right or wrong at its first token, which an iid rate would
    undervalue.

    Costs, in seconds: a source that reads context before drafting (a model
    drafter catching up on tokens it has not seen) reports the read apart from
    the drafting (`StepEvent.read_seconds`), so a long read (a pasted document,
    tokens drafted by another source) is never taken for the price of a draft.
    A read of one or two tokens (the usual one: the last step's correction or
    bonus token) yields the first draft's logits and is priced as such
    (`first_read`); each further token read costs `read_per_token` (a batch).
    """

    PRIOR_WEIGHT = 1.0
    LONG_DECAY = 0.99
    """How slowly the long-run rates fade (a memory of about a hundred steps)."""

    def __init__(self, max_gamma: int, decay: float) -> None:
        self.decay = decay
        self.tried = [0.0] * max_gamma
        self.taken = [0.0] * max_gamma
        # the same counts faded slowly: the source's long-run rates, which the
        # recent ones drift back to when the source is not tried
        self.long_tried = [0.0] * max_gamma
        self.long_taken = [0.0] * max_gamma
        self.seen = 0
        """Steps this source has drafted (or been scored on), never faded."""
        self.draft_cost: float | None = None
        """Seconds per draft, beyond the read that gives the first."""
        self.first_read: float | None = None
        self.read_per_token: float | None = None
        self.reads = False  # the source has reported reads: its first draft comes with one

    def fade(self) -> None:
        """A step went by: older evidence counts for less."""
        self.tried = [self.decay * tried for tried in self.tried]
        self.taken = [self.decay * taken for taken in self.taken]
        self.long_tried = [self.LONG_DECAY * tried for tried in self.long_tried]
        self.long_taken = [self.LONG_DECAY * taken for taken in self.long_taken]

    def count(self, drafted: int, accepted: int) -> None:
        """A step drafted `drafted` tokens from this source and `accepted` were kept."""
        reached = min(accepted + 1, drafted, len(self.tried))
        self.seen += 1
        for index in range(reached):
            self.tried[index] += 1
            self.taken[index] += index < accepted
            self.long_tried[index] += 1
            self.long_taken[index] += index < accepted

    def score(self, tokens: tuple[int, ...], appended: tuple[int, ...]) -> None:
        """Count a draft known in advance that was not used, against what the
        target kept: positions past what the step settled say nothing."""
        matched = 0
        while matched < min(len(tokens), len(appended)) and tokens[matched] == appended[matched]:
            matched += 1
        known = min(len(tokens), matched + 1 if matched < len(appended) else matched)
        if known:
            self.count(known, matched)

    @staticmethod
    def _chained(tried: list[float], taken: list[float], priors: list[float] | None) -> list[float]:
        """Rates per position from counts, each position's prior (weight
        PRIOR_WEIGHT) being `priors[i]`, or else the rate of the position before
        (0.5 for the first)."""
        rates: list[float] = []
        prior = 0.5
        for index, (count, kept) in enumerate(zip(tried, taken, strict=True)):
            if priors is not None:
                prior = priors[index]
            rate = (kept + SourceEstimates.PRIOR_WEIGHT * prior) / (
                count + SourceEstimates.PRIOR_WEIGHT
            )
            rates.append(rate)
            prior = rate
        return rates

    def position_acceptance(self) -> list[float]:
        """Estimated P(draft i accepted | drafts before it accepted), i = 1..max_gamma:
        the recent rates, drawn towards the long-run ones."""
        long_run = self._chained(self.long_tried, self.long_taken, None)
        return self._chained(self.tried, self.taken, long_run)

    def expected_tokens(self, gamma: int) -> float:
        """Tokens a step with `gamma` drafts is expected to append (bonus included)."""
        total, reach = 1.0, 1.0
        for rate in self.position_acceptance()[:gamma]:
            reach *= rate
            total += reach
        return total

    def observe_costs(self, event: StepEvent, catching_up: bool) -> None:
        gamma = event.gamma
        # keys and values taken from the target instead of read: neither a read nor a draft
        event = replace(event, draft_seconds=max(event.draft_seconds - event.import_seconds, 0.0))
        if event.read_tokens > 0:
            self.reads = True
            if event.read_tokens <= 2:
                self.first_read = _ema(self.first_read, event.read_seconds, self.decay)
            else:
                base = self.first_read
                if base is None:
                    base = 2 * event.read_seconds / event.read_tokens
                extra = max(event.read_seconds - base, 0.0) / (event.read_tokens - 2)
                self.read_per_token = _ema(self.read_per_token, extra, self.decay)
            if gamma >= 2:
                drafting = max(event.draft_seconds - event.read_seconds, 0.0) / (gamma - 1)
                self.draft_cost = _ema(self.draft_cost, drafting, self.decay)
        elif gamma > 0 and not catching_up:
            # no read reported: the catch-up after steps without drafts is not a draft cost
            self.draft_cost = _ema(self.draft_cost, event.draft_seconds / gamma, self.decay)

    def read_seconds(self, unread: int, share: float = 1.0) -> float:
        """Seconds to read `unread` tokens, the part beyond the usual one or two
        counted at `share` (a catch-up paid once for the rest of the answer)."""
        if unread <= 0:
            return 0.0
        per_token = self.read_per_token
        first = self.first_read
        if first is None:
            first = 2 * per_token if per_token is not None else (self.draft_cost or 0.0)
        if unread <= 2:
            return first
        extra = (unread - 2) * (per_token if per_token is not None else first)
        return first + share * extra

    def drafting_seconds(self, gamma: int, unread: int, share: float = 1.0) -> float:
        """Seconds to propose `gamma` drafts after reading `unread` tokens."""
        if gamma <= 0:
            return 0.0
        cost = self.draft_cost or 0.0
        if self.reads:
            return self.read_seconds(max(unread, 1), share) + (gamma - 1) * cost
        return gamma * cost

    def costs(self) -> dict[str, float | None]:
        return {
            "draft_seconds": self.draft_cost,
            "first_read_seconds": self.first_read,
            "read_seconds_per_token": self.read_per_token,
        }


class StepEstimates:
    """Running estimates every policy keeps: per source (`SourceEstimates`)
    and the target's seconds for a step with k drafts.

    The target's cost per k is as measured in this run (exponentially
    weighted), else from `prime`'s timings taken before the run (the
    forward-width timings, `widths.py`) scaled by how this run's measured
    steps compare with them, else a line through what was measured. The first
    step (the target's prompt pass) is not used for costs.
    """

    def __init__(self, max_gamma: int, decay: float = 0.9) -> None:
        self.max_gamma = max_gamma
        self.decay = decay
        self.sources: dict[str, SourceEstimates] = {}
        self.target_cost: dict[int, float] = {}
        self.prior_cost: dict[int, float] = {}
        self.steps = 0
        self.plain_steps = 0
        self.offers: tuple[Offer, ...] = ()
        """The offers of the step being decided (scored when it finishes)."""

    def new_generation(self) -> None:
        """A new answer begins: what was learnt of each source and of the
        target's costs is kept (a chat's next turn, on the same machine)."""
        self.steps = 0
        self.plain_steps = 0
        self.offers = ()

    def source(self, name: str) -> SourceEstimates:
        if name not in self.sources:
            self.sources[name] = SourceEstimates(self.max_gamma, self.decay)
        return self.sources[name]

    def observe(self, event: StepEvent) -> None:
        self.steps += 1
        catching_up = self.plain_steps > 0
        for source in self.sources.values():
            source.fade()
        if event.gamma > 0:
            self.source(event.source).count(event.gamma, event.accepted)
            self.plain_steps = 0
        else:
            self.plain_steps += 1
        for offer in self.offers:  # a draft known in advance is scored even when unused
            if offer.tokens and (offer.source != event.source or event.gamma == 0):
                self.source(offer.source).score(offer.tokens, event.appended)
        self.offers = ()
        if self.steps == 1:
            return  # prompt processing dominates the first step's timings
        if event.gamma > 0:
            self.source(event.source).observe_costs(event, catching_up)
        k = event.gamma
        self.target_cost[k] = _ema(self.target_cost.get(k), event.target_seconds, self.decay)

    def prime(self, seconds: Mapping[int, float]) -> None:
        """Seconds of a target step with k drafts, timed before this run."""
        self.prior_cost = {k: t for k, t in seconds.items() if t > 0}

    def verify_cost(self, k: int) -> float:
        """Seconds for a target step with k drafts (see the class).

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
        if not known:
            return 1.0  # nothing timed: every step costs the same unknown unit
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

    def rate(self, offer: Offer, gamma: int, budget: int | None = None) -> float:
        """Expected tokens per second of a step with `gamma` drafts from `offer`'s
        source; a catch-up read is shared over the answer's remaining `budget`."""
        if gamma == 0:
            return 1.0 / self.verify_cost(0)
        source = self.source(offer.source)
        tokens = source.expected_tokens(gamma)
        share = 1.0 if not budget else min(1.0, tokens / budget)
        seconds = source.drafting_seconds(gamma, offer.unread, share) + self.verify_cost(gamma)
        return tokens / seconds


def _describe(
    choice: tuple[str, int], rates: Mapping[tuple[str, int], float], unit: str = "/s"
) -> str:
    """The chosen (source, gamma) and the best of every other option, in `unit`."""
    best: dict[str, tuple[int, float]] = {}
    for (source, gamma), rate in rates.items():
        if source not in best or rate > best[source][1]:
            best[source] = (gamma, rate)
    chosen_source = choice[0] or "none"
    parts = [f"{chosen_source}:{choice[1]} {rates[choice]:.1f}{unit}"]
    parts += [
        f"{source or 'none'}:{gamma} {rate:.1f}{unit}"
        for source, (gamma, rate) in sorted(best.items(), key=lambda item: -item[1][1])
        if (source or "none") != chosen_source
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
            (offer.source, min(gamma, offer.drafts)): self.estimates.source(
                offer.source
            ).expected_tokens(min(gamma, offer.drafts))
            for offer in usable
        }
        best = max(tokens, key=tokens.__getitem__)
        return Choice(best[0], best[1], _describe(best, tokens, "tokens/step"))


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
    to undo because only the probe every `probe_every` plain steps brings new
    evidence.
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
        return Choice(best[0], best[1], _describe(best, rates))


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
