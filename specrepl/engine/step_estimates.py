"""What a gamma policy learns from finished steps: acceptance and costs.

`SourceEstimates` keeps, for one draft source (a model drafter, prompt
lookup, ...), the chance that the draft at each position is accepted once the
drafts before it were, and the seconds it takes to read unseen context and to
draft; `StepEstimates` keeps one per source, one more per profile a source
gives its offers (prompt lookup: the length of the match it copies from),
and the target's seconds for a step with k drafts, and rates a step by
expected tokens per second. Every figure is exponentially weighted, so it
follows the text; every cost is moved from the context it was measured at
to the context of the step being decided (`context_costs.ContextSlope`).

The policies in `gamma.py` read these; this module chooses nothing. It knows
nothing about models: it reads `Offer`s and `StepEvent`s only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace

from specrepl.engine.context_costs import ContextSlope
from specrepl.engine.results import Offer, StepEvent

__all__ = ["SourceEstimates", "StepEstimates"]

MIN_MOVED_SHARE = 0.25
"""A cost moved to a shorter context keeps at least this share of itself (a
guard against a slope fitted on too little)."""


def _ema(old: float | None, new: float, decay: float) -> float:
    return new if old is None else decay * old + (1 - decay) * new


def _tokens_from(rates: list[float], gamma: int) -> float:
    """Tokens a step with `gamma` drafts appends (bonus included), expected from
    the chance of each draft given the ones before it."""
    total, reach = 1.0, 1.0
    for rate in rates[:gamma]:
        reach *= rate
        total += reach
    return total


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
    A copy that takes from the target's keys and values what it has not read
    reports the handover apart (`StepEvent.import_seconds`): a catch-up is
    neither a read nor a draft, but a step's own handover of one or two
    positions (the draft it never read) is priced with the first read.
    A draft and a first read attend over the context: both are priced at the
    context of the step being decided, by how this source's drafts have
    grown with it (`context_slope`).
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
        self.passed_over = 0
        """Steps in a row this source was offered, could not be scored unused
        (its drafts are not known in advance) and did not draft."""
        self.draft_cost: float | None = None
        """Seconds per draft, beyond the read that gives the first."""
        self.first_read: float | None = None
        self.read_per_token: float | None = None
        self.reads = False  # the source has reported reads: its first draft comes with one
        self.context_slope = ContextSlope()
        """Seconds per position of context a draft gains (width 0: one token a pass)."""
        self.draft_positions: float | None = None
        self.read_positions: float | None = None
        """The context (faded like the costs) at which `draft_cost` and
        `first_read` were measured."""

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

    def position_acceptance(self, prior: list[float] | None = None) -> list[float]:
        """Estimated P(draft i accepted | drafts before it accepted), i = 1..max_gamma:
        the recent rates, drawn towards the long-run ones, which are drawn
        towards `prior` where given (a profile's: its source's rates), else
        each towards the one before it."""
        long_run = self._chained(self.long_tried, self.long_taken, prior)
        return self._chained(self.tried, self.taken, long_run)

    def expected_tokens(self, gamma: int) -> float:
        """Tokens a step with `gamma` drafts is expected to append (bonus included)."""
        return _tokens_from(self.position_acceptance(), gamma)

    def observe_costs(self, event: StepEvent, catching_up: bool) -> None:
        gamma = event.gamma
        if 0 < event.imported_tokens <= 2 and event.read_tokens > 0:
            # the step's own handover (the draft a copy never read, taken from the
            # target instead of read beside the last token): part of its first read
            event = replace(event, read_seconds=event.read_seconds + event.import_seconds)
        else:
            # a catch-up taken from the target instead of read: neither a read nor a draft
            draft_seconds = max(event.draft_seconds - event.import_seconds, 0.0)
            event = replace(event, draft_seconds=draft_seconds)
        positions = event.positions
        if event.read_tokens > 0:
            self.reads = True
            if event.read_tokens <= 2:
                self.first_read = _ema(self.first_read, event.read_seconds, self.decay)
                self.read_positions = _ema(self.read_positions, positions, self.decay)
            else:
                base = self.first_read
                if base is None:
                    base = 2 * event.read_seconds / event.read_tokens
                extra = max(event.read_seconds - base, 0.0) / (event.read_tokens - 2)
                self.read_per_token = _ema(self.read_per_token, extra, self.decay)
            if gamma >= 2:
                drafting = max(event.draft_seconds - event.read_seconds, 0.0) / (gamma - 1)
                self._draft_measured(drafting, positions)
        elif gamma > 0 and not catching_up:
            # no read reported: the catch-up after steps without drafts is not a draft cost
            self._draft_measured(event.draft_seconds / gamma, positions)

    def _draft_measured(self, seconds: float, positions: int) -> None:
        self.draft_cost = _ema(self.draft_cost, seconds, self.decay)
        self.draft_positions = _ema(self.draft_positions, positions, self.decay)
        self.context_slope.observe(0, positions, seconds)

    def _at(self, cost: float | None, measured_at: float | None, positions: int) -> float | None:
        """`cost`, measured at `measured_at` positions, at `positions` (0: where measured)."""
        if cost is None or not positions or not measured_at:
            return cost
        moved = cost + self.context_slope.slope(0) * (positions - measured_at)
        return max(moved, cost * MIN_MOVED_SHARE)

    def read_seconds(self, unread: int, share: float = 1.0, positions: int = 0) -> float:
        """Seconds to read `unread` tokens, the part beyond the usual one or two
        counted at `share` (a catch-up paid once for the rest of the answer),
        at a context of `positions` (0: as measured)."""
        if unread <= 0:
            return 0.0
        per_token = self.read_per_token
        first = self._at(self.first_read, self.read_positions, positions)
        if first is None:
            first = 2 * per_token if per_token is not None else (self.draft_cost or 0.0)
        if unread <= 2:
            return first
        extra = (unread - 2) * (per_token if per_token is not None else first)
        return first + share * extra

    def drafting_seconds(
        self, gamma: int, unread: int, share: float = 1.0, positions: int = 0
    ) -> float:
        """Seconds to propose `gamma` drafts after reading `unread` tokens, at a
        context of `positions` (0: as measured)."""
        if gamma <= 0:
            return 0.0
        cost = self._at(self.draft_cost, self.draft_positions, positions) or 0.0
        if self.reads:
            return self.read_seconds(max(unread, 1), share, positions) + (gamma - 1) * cost
        return gamma * cost

    def costs(self) -> dict[str, float | None]:
        return {
            "draft_seconds": self.draft_cost,
            "first_read_seconds": self.first_read,
            "read_seconds_per_token": self.read_per_token,
        }


class StepEstimates:
    """Running estimates every policy keeps: per source (`SourceEstimates`),
    per source and profile, and the target's seconds for a step with k drafts.

    A source may tell its offers apart by a profile (`Offer.profile`: prompt
    lookup's drafts copied after a long match are kept far more often than
    after a match of two tokens). Acceptance is then also counted per profile,
    and a profile's rates have its source's as their prior: a profile seldom
    seen is rated as its source, one seen often by what it has shown. Costs
    stay the source's.

    The target's cost per k is as measured in this run (exponentially
    weighted), else from `prime`'s timings taken before the run (the
    forward-width timings, `widths.py`) scaled by how this run's measured
    steps compare with them, else a line through what was measured. A
    measured cost is moved from the context it was measured at (faded like
    it) to the context of the step being decided (`positions`: what the last
    step left) by the fitted slope (`context_slope`): a cost per k last seen
    a pasted document ago is priced at today's length. The first step (the
    target's prompt pass) is not used for costs.
    """

    def __init__(self, max_gamma: int, decay: float = 0.9) -> None:
        self.max_gamma = max_gamma
        self.decay = decay
        self.sources: dict[str, SourceEstimates] = {}
        self.profiles: dict[tuple[str, str], SourceEstimates] = {}
        """Acceptance per (source, profile); costs stay in `sources`."""
        self.target_cost: dict[int, float] = {}
        self.target_positions: dict[int, float] = {}
        """The context (faded like `target_cost`) at which each k's cost was measured."""
        self.context_slope = ContextSlope()
        self.positions = 0
        """The context of the step being decided: what the last step left (0: not known)."""
        self._moved: dict[int, float] | None = None
        """`_measured`'s costs, until the next step."""
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

    def profile(self, name: str, profile: str) -> SourceEstimates:
        """The acceptance counts of `name`'s offers with this profile."""
        key = (name, profile)
        if key not in self.profiles:
            self.profiles[key] = SourceEstimates(self.max_gamma, self.decay)
        return self.profiles[key]

    def position_acceptance(self, offer: Offer) -> list[float]:
        """P(draft i accepted | drafts before it accepted) for `offer`'s drafts:
        its profile's rates with its source's as the prior, or its source's."""
        rates = self.source(offer.source).position_acceptance()
        if not offer.profile:
            return rates
        return self.profile(offer.source, offer.profile).position_acceptance(rates)

    def expected_tokens(self, offer: Offer, gamma: int) -> float:
        """Tokens a step with `gamma` of `offer`'s drafts is expected to append."""
        return _tokens_from(self.position_acceptance(offer), gamma)

    def _counted(self, offer: Offer) -> list[SourceEstimates]:
        """Where a step's evidence on `offer` is counted: its source, and its
        profile if it has one."""
        counts = [self.source(offer.source)]
        if offer.profile:
            counts.append(self.profile(offer.source, offer.profile))
        return counts

    def observe(self, event: StepEvent) -> None:
        self.steps += 1
        catching_up = self.plain_steps > 0
        for estimates in (*self.sources.values(), *self.profiles.values()):
            estimates.fade()
        if event.gamma > 0:
            used = next(
                (offer for offer in self.offers if offer.source == event.source),
                Offer(event.source, event.gamma),
            )
            for estimates in self._counted(used):
                estimates.count(event.gamma, event.accepted)
            self.plain_steps = 0
        else:
            self.plain_steps += 1
        for offer in self.offers:  # a draft known in advance is scored even when unused
            unused = offer.source != event.source or event.gamma == 0
            if offer.tokens and unused:
                for estimates in self._counted(offer):
                    estimates.score(offer.tokens, event.appended)
            elif offer.tokens is None:
                source = self.source(offer.source)
                source.passed_over = source.passed_over + 1 if unused else 0
        self.offers = ()
        self._moved = None
        self.positions = event.positions + len(event.appended) if event.positions else 0
        if self.steps == 1:
            return  # prompt processing dominates the first step's timings
        if event.gamma > 0:
            self.source(event.source).observe_costs(event, catching_up)
        k = event.gamma
        self.target_cost[k] = _ema(self.target_cost.get(k), event.target_seconds, self.decay)
        if event.positions:
            at = _ema(self.target_positions.get(k), event.positions, self.decay)
            self.target_positions[k] = at
            self.context_slope.observe(k, event.positions, event.target_seconds)

    def _measured(self) -> dict[int, float]:
        """Each measured k's cost at the context of the step being decided."""
        if self._moved is not None:
            return self._moved
        if not self.positions:
            self._moved = dict(self.target_cost)
            return self._moved
        costs = {}
        for k, cost in self.target_cost.items():
            at = self.target_positions.get(k)
            if at is None:
                costs[k] = cost
                continue
            moved = cost + self.context_slope.slope(k) * (self.positions - at)
            costs[k] = max(moved, cost * MIN_MOVED_SHARE)
        self._moved = costs
        return costs

    def prime(self, seconds: Mapping[int, float]) -> None:
        """Seconds of a target step with k drafts, timed before this run."""
        self.prior_cost = {k: t for k, t in seconds.items() if t > 0}

    def verify_cost(self, k: int) -> float:
        """Seconds for a target step with k drafts (see the class).

        Measured values win because the cost need not grow with k: on a 2-core
        CPU the embedded target took 58, 97, 119, 89 and 81 ms to score 1 to 5
        tokens (small matrix shapes take slower kernels).
        """
        measured = self._measured()
        if k in measured:
            return measured[k]
        if k in self.prior_cost:
            ratios = [t / self.prior_cost[j] for j, t in measured.items() if j in self.prior_cost]
            return self.prior_cost[k] * (statistics.median(ratios) if ratios else 1.0)
        known = sorted(measured.items())
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
        tokens = self.expected_tokens(offer, gamma)
        share = 1.0 if not budget else min(1.0, tokens / budget)
        drafting = source.drafting_seconds(gamma, offer.unread, share, self.positions)
        seconds = drafting + self.verify_cost(gamma)
        return tokens / seconds
