"""The steps of the decoding loop: draft, score, verify, keep.

`decode_steps` is the loop of `generation.py` once a run is set up: each step
the gamma policy chooses a draft source and gamma among what the drafter
offers, the drafter proposes up to gamma tokens, the target scores the
sequence plus the drafts in one pass of its runtime (`runtime.py`: torch,
llama.cpp), `verification.py` decides what to keep, the target's runtime is
rolled back to it, and the drafter is told what stayed valid. Each step yields a
`StepEvent`, timed by `clock.Clock`. The loop reads back from the target's
device once a step (the verification's verdict: how many drafts stay, the
target's token and the drafts as host integers); the new token joins the
sequence on the device, and the clock waits on a GPU for no stamp but the
step's last. A drafter's own reads are its business. The first step of a
generation is the target's prompt pass alone, so the first token comes at the
target's own pace.

This module never prints and knows nothing about tokenizers or chat templates.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, replace

import torch

from specrepl.engine.clock import Clock, Stamp
from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.gamma import Choice, GammaPolicy
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import BUDGET_END, PROMPT_PASS, StepEvent, StopReason
from specrepl.engine.runtime import ModelRuntime
from specrepl.engine.verification import Verdict, greedy_verdict, sampling_verdict

__all__ = ["Clock", "decode_steps"]  # Clock is clock's, named here as before it moved


@dataclass(frozen=True)
class _Scored:
    """The target's pass over the sequence followed by the drafts."""

    candidate: torch.Tensor
    """The sequence, then the drafts."""
    logits: torch.Tensor
    """Shape (k + 1, vocab): the target's logits after each of the last k + 1 positions."""
    features: torch.Tensor | None
    """The target's final hidden states at the positions fed (when the drafter reads them)."""
    fed_from: int
    """The first position fed: how much of the sequence the runtime held before."""


def decode_steps(
    sequence: torch.Tensor,
    target: ModelRuntime,
    drafter: Drafter | None,
    policy: GammaPolicy,
    clock: Clock,
    *,
    logits_processor: LogitsProcessor,
    limit: int,
    end_tokens: frozenset[int],
    generator: torch.Generator | None,
    vocab_size: int,
) -> Generator[StepEvent, None, tuple[StopReason | None, torch.Tensor]]:
    """Draft, verify, keep, until `limit` new tokens or an end token; returns the
    end token's stop reason (None at the limit) and the final sequence."""
    policy.start()
    _prime(policy, target)
    generated = 0
    while generated < limit:
        started = clock.now()
        choice = _choose(drafter, policy, sequence, limit - generated, first=generated == 0)
        draft = _draft(drafter, choice, sequence, logits_processor, generator, policy)
        drafted = clock.now()
        scored = _score(target, sequence, draft, vocab_size, drafter)
        verified = clock.now()
        verdict = _verify(draft, scored.logits, logits_processor, generator, vocab_size)
        accepted = verdict.accepted
        appended, stop = _up_to_end([*verdict.drafts[:accepted], verdict.token], end_tokens)
        length = sequence.shape[0]
        kept = scored.candidate[: length + accepted]
        sequence = torch.cat((kept, verdict.token_tensor.to(kept.device)))
        sequence = sequence[: length + len(appended)]
        target.rollback_to(length + accepted)
        _update_drafter(drafter, sequence, length + accepted, scored, target, len(appended))
        generated += len(appended)
        clock.pause()
        stamps = (started, drafted, verified)
        event = _event(choice, draft, verdict, appended, stamps, clock, length)
        policy.observe(event)
        yield event
        clock.resume()
        if stop is not None:
            return stop, sequence
    return None, sequence


def _choose(
    drafter: Drafter | None,
    policy: GammaPolicy,
    sequence: torch.Tensor,
    budget: int,
    *,
    first: bool,
) -> Choice:
    """The policy's choice of draft source and gamma among what the drafter offers
    (at most `budget - 1` drafts: the target adds one token after them). The
    `first` step of a generation is the target's own prompt pass, so the first
    token comes at its pace; the drafter reads the prompt in the next step."""
    if first:
        return Choice("", 0, PROMPT_PASS)
    room = min(policy.max_gamma, budget - 1)
    if drafter is None or room <= 0:
        return Choice("", 0, "no drafter" if drafter is None else BUDGET_END)
    choice = policy.choose(drafter.offers(sequence, room), budget)
    return replace(choice, gamma=min(choice.gamma, room))


def _draft(
    drafter: Drafter | None,
    choice: Choice,
    sequence: torch.Tensor,
    processor: LogitsProcessor,
    generator: torch.Generator | None,
    policy: GammaPolicy,
) -> Draft:
    if drafter is None or choice.gamma <= 0:
        return Draft(sequence.new_empty(0), None)
    return drafter.propose_source(
        choice.source, sequence, choice.gamma, processor, generator, policy.min_confidence
    )


def _score(
    target: ModelRuntime,
    sequence: torch.Tensor,
    draft: Draft,
    vocab_size: int,
    drafter: Drafter | None,
) -> _Scored:
    """One target pass over the sequence and the k drafts: logits for the k + 1
    positions that verification reads, and the features a drafter asks for."""
    k = len(draft)
    candidate = torch.cat((sequence, draft.tokens)) if k else sequence
    fed_from = target.length
    logits, features = target.score(
        candidate,
        k + 1,
        vocab_size,
        features=drafter is not None and drafter.uses_target_features,
        feature_layers=() if drafter is None else drafter.feature_layers,
    )
    return _Scored(candidate, logits, features, fed_from)


def _verify(
    draft: Draft,
    logits: torch.Tensor,
    processor: LogitsProcessor,
    generator: torch.Generator | None,
    vocab_size: int,
) -> Verdict:
    """How many drafts the target keeps and the token it adds after them, read
    back from the device once (the step's one wait for it)."""
    if processor.is_greedy:
        return greedy_verdict(draft.tokens, logits)
    target_probs, usable = processor.unread_probabilities(logits)
    draft_probs = draft.probs
    if draft_probs is None:  # a deterministic drafter: a point mass q (no check read back)
        point = draft.tokens.unsqueeze(1)
        draft_probs = torch.zeros(len(draft), vocab_size, device=point.device)
        draft_probs.scatter_(1, point, 1.0)
    verdict = sampling_verdict(draft.tokens, draft_probs, target_probs, generator, usable)
    if verdict is None:  # NaN or infinite logits (rare): resolved, or refused, and decided again
        checked = processor.probabilities(logits)
        verdict = sampling_verdict(draft.tokens, draft_probs, checked, generator)
    assert verdict is not None
    return verdict


def _up_to_end(
    appended: list[int], end_tokens: frozenset[int]
) -> tuple[list[int], StopReason | None]:
    """The new tokens up to and with the first end token, and "eos" if there was one."""
    for index, token in enumerate(appended):
        if token in end_tokens:
            return appended[: index + 1], "eos"
    return appended, None


def _update_drafter(
    drafter: Drafter | None,
    sequence: torch.Tensor,
    valid: int,
    scored: _Scored,
    target: ModelRuntime,
    appended: int,
) -> None:
    """Tell the drafter how much of what it saw is still valid (the first
    `valid` positions), with only the target's outputs it asked for."""
    if drafter is None:
        return
    extra: dict[str, object] = {}
    if scored.features is not None:
        extra["target_features"] = scored.features[: valid - scored.fed_from]
    if drafter.uses_target_cache:
        extra["target_cache"] = target.key_values()
    drafter.update(sequence, valid, scored.logits[:appended], **extra)


def _event(
    choice: Choice,
    draft: Draft,
    verdict: Verdict,
    appended: list[int],
    stamps: tuple[Stamp, Stamp, Stamp],
    clock: Clock,
    positions: int,
) -> StepEvent:
    """The step's event; `stamps` are the clock at its start, after drafting
    and after the target's pass (read once the clock has paused); `positions`
    the sequence held when it began."""
    started, drafted, verified = stamps
    return StepEvent(
        drafts=tuple(verdict.drafts),
        accepted=verdict.accepted,
        appended=tuple(appended),
        draft_seconds=clock.seconds(started, drafted),
        target_seconds=clock.seconds(drafted, verified),
        seconds_since_start=clock.active,
        requested_gamma=choice.gamma,
        source=choice.source if len(draft) else "",
        read_seconds=draft.read_seconds,
        read_tokens=draft.read_tokens,
        choice=choice.reason,
        import_seconds=draft.import_seconds,
        imported_tokens=draft.imported_tokens,
        positions=positions,
    )


def _prime(policy: GammaPolicy, target: ModelRuntime) -> None:
    """Tell the policy the target's step costs per number of drafts, where its
    runtime was timed (a width plan's `step_seconds`, llama.cpp's widths)."""
    seconds = target.step_seconds()
    if seconds:
        policy.prime(seconds)
