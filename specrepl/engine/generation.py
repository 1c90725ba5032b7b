"""The autoregressive and speculative generators.

One decoding loop serves both: each step the drafter offers what it can
draft, the gamma policy chooses a source and gamma, the drafter proposes up
to gamma tokens, the target scores the sequence plus the drafts in one
forward pass, and `verification.py` decides what to keep. The first step of
every generation is the target's prompt pass alone, so the first token comes
at the target's own pace; the drafter reads the prompt in the next step.
Target-only (autoregressive) generation is the same loop with no drafts, so
both share every cost that is not a model call. The loop yields a
`StepEvent` per step; the `*_generate` functions collect them into a
`GenerationResult`.

Invariant with caches on: before a step, each model's cache holds a prefix of
the current sequence and at least its last token is uncached; after the step
both caches are rolled back to the part that verification kept.

This module never prints and knows nothing about chat templates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import replace

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from specrepl.engine.devices import synchronize
from specrepl.engine.drafters.kinds import Draft, Drafter, as_drafter
from specrepl.engine.forward import context_length, forward_pass, logits_width, model_device
from specrepl.engine.gamma import Choice, FixedGamma, GammaPolicy
from specrepl.engine.kv_cache import cached_length, new_cache, rollback_to
from specrepl.engine.processors import GreedyProcessor, LogitsProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import (
    BUDGET_END,
    PROMPT_PASS,
    GenerationResult,
    GeneratorKind,
    StepEvent,
    StopReason,
)
from specrepl.engine.verification import verify_greedy, verify_sampling
from specrepl.engine.widths import width_plan

__all__ = [
    "ContextTooLongError",
    "GenerationInterrupted",
    "autoregressive_generate",
    "speculative_generate",
    "stream_autoregressive",
    "stream_speculative",
]

StepCallback = Callable[[StepEvent], None]


class ContextTooLongError(ValueError):
    """The prompt leaves no room for a new token in the model's context."""


class GenerationInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `result` holds what was generated until then."""

    def __init__(self, result: GenerationResult) -> None:
        super().__init__("generation interrupted")
        self.result = result


class _Clock:
    """Wall time spent inside the generator, excluding the consumer's time
    between steps; synchronizes the device before every reading."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.active = 0.0
        self.resumed = 0.0

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def resume(self) -> float:
        self.resumed = self.now()
        return self.resumed

    def pause(self) -> float:
        stamp = self.now()
        self.active += stamp - self.resumed
        return stamp


def _end_tokens(eos_tokens_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_tokens_id is None:
        return frozenset()
    if isinstance(eos_tokens_id, int):
        return frozenset((eos_tokens_id,))
    return frozenset(int(token) for token in eos_tokens_id)


def _check_prompt(inputs: list[int], context: int | None) -> None:
    if len(inputs) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if context is not None and len(inputs) >= context:
        raise ContextTooLongError(
            f"the prompt has {len(inputs)} tokens but the model's context is {context} tokens "
            f"(a prompt may have at most {context - 1})"
        )


def _run_loop(
    inputs: list[int],
    target: PreTrainedModel,
    drafter: Drafter | None,
    *,
    logits_processor: LogitsProcessor,
    gamma: int | GammaPolicy,
    max_gen_len: int,
    eos_tokens_id: int | Iterable[int] | None,
    use_cache: bool,
    generator: torch.Generator | None,
    vocab_size: int | None,
    prompt_cache: PromptCache | None = None,
) -> Iterator[StepEvent]:
    """The decoding loop; returns (via StopIteration) the stop reason, the active
    seconds and how many prompt tokens a kept cache spared the target."""
    policy = FixedGamma(gamma) if isinstance(gamma, int) else gamma
    if max_gen_len < 1:
        raise ValueError(f"max_gen_len must be >= 1, got {max_gen_len}")
    context = context_length(target)
    _check_prompt(inputs, context)
    device = model_device(target)
    if vocab_size is None:
        vocab_size = logits_width(target)
        if drafter is not None and drafter.width is not None:
            vocab_size = min(vocab_size, drafter.width)
    limit = max_gen_len if context is None else min(max_gen_len, context - len(inputs))
    limit_reason: StopReason = "length" if limit == max_gen_len else "context"

    clock = _Clock(device)
    clock.resume()
    sequence = torch.tensor(inputs, dtype=torch.long, device=device)
    try:
        if drafter is not None:
            drafter.begin(sequence, vocab_size)
        cache, reused = _target_cache(target, inputs, drafter, use_cache, prompt_cache)
        steps = _steps(
            sequence, target, drafter, cache, policy, clock,
            logits_processor=logits_processor, limit=limit, end_tokens=_end_tokens(eos_tokens_id),
            generator=generator, vocab_size=vocab_size,
        )  # fmt: skip
        stop, sequence = yield from steps
    except BaseException:  # interrupted or failed: what the caches hold may be half a step
        if drafter is not None:
            drafter.forget()
        raise
    if prompt_cache is not None and cache is not None:
        prompt_cache.keep(target, cache, sequence)
    clock.pause()
    return stop or limit_reason, clock.active, reused


def _target_cache(
    target: PreTrainedModel,
    inputs: list[int],
    drafter: Drafter | None,
    use_cache: bool,
    prompt_cache: PromptCache | None,
) -> tuple[DynamicCache | None, int]:
    """The target's cache for this run and how many prompt tokens it already holds.

    A drafter that reads the target's features needs them at every position the
    target feeds, so the target re-uses no more than the drafter kept."""
    if not use_cache:
        return None, 0
    if prompt_cache is None:
        return new_cache(target), 0
    at_most = None
    if drafter is not None and drafter.uses_target_features:
        at_most = drafter.features_held()
    return prompt_cache.take(target, inputs, at_most)


def _steps(
    sequence: torch.Tensor,
    target: PreTrainedModel,
    drafter: Drafter | None,
    cache: DynamicCache | None,
    policy: GammaPolicy,
    clock: _Clock,
    *,
    logits_processor: LogitsProcessor,
    limit: int,
    end_tokens: frozenset[int],
    generator: torch.Generator | None,
    vocab_size: int,
) -> Generator[StepEvent, None, tuple[StopReason | None, torch.Tensor]]:
    """Draft, verify, keep, until `limit` new tokens or an end token; returns the
    end token's stop reason (None at the limit) and the final sequence."""
    wants_features = drafter is not None and drafter.uses_target_features
    wants_cache = drafter is not None and drafter.uses_target_cache
    policy.start()
    _prime(policy, target)
    generated = 0
    while generated < limit:
        step_start = clock.now()
        budget = limit - generated
        if generated == 0:
            # the first token comes from the target's own prompt pass, at its pace;
            # the drafter reads the prompt in the next step
            choice = Choice("", 0, PROMPT_PASS)
        else:
            choice = _choose(drafter, policy, sequence, budget)
        draft = _draft(drafter, choice, sequence, logits_processor, generator, policy)
        drafted_at = clock.now()
        k = len(draft)
        length = sequence.shape[0]
        candidate = torch.cat((sequence, draft.tokens)) if k else sequence
        fed_from = cached_length(cache)
        logits, features = forward_pass(
            target, candidate, cache, k + 1, vocab_size, features=wants_features
        )
        verified_at = clock.now()
        accepted, token = _verify(draft, logits, logits_processor, generator, vocab_size)
        appended = [*draft.tokens[:accepted].tolist(), token]
        stop: StopReason | None = None
        for index, appended_token in enumerate(appended):
            if appended_token in end_tokens:
                appended = appended[: index + 1]
                stop = "eos"
                break
        sequence = torch.cat((candidate[: length + accepted], candidate.new_tensor([token])))
        sequence = sequence[: length + len(appended)]
        rollback_to(cache, length + accepted)
        if drafter is not None:
            extra: dict[str, object] = {}  # only what the drafter asked for
            if features is not None:
                extra["target_features"] = features[: length + accepted - fed_from]
            if wants_cache:
                extra["target_cache"] = cache
            drafter.update(sequence, length + accepted, logits[: len(appended)], **extra)
        generated += len(appended)
        clock.pause()
        event = StepEvent(
            drafts=tuple(draft.tokens.tolist()),
            accepted=accepted,
            appended=tuple(appended),
            draft_seconds=drafted_at - step_start,
            target_seconds=verified_at - drafted_at,
            seconds_since_start=clock.active,
            requested_gamma=choice.gamma,
            source=choice.source if k else "",
            read_seconds=draft.read_seconds,
            read_tokens=draft.read_tokens,
            choice=choice.reason,
            import_seconds=draft.import_seconds,
            imported_tokens=draft.imported_tokens,
        )
        policy.observe(event)
        yield event
        clock.resume()
        if stop is not None:
            return stop, sequence
    return None, sequence


def _choose(
    drafter: Drafter | None, policy: GammaPolicy, sequence: torch.Tensor, budget: int
) -> Choice:
    """The policy's choice of draft source and gamma among what the drafter offers
    (at most `budget - 1` drafts: the target adds one token after them)."""
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


def _verify(
    draft: Draft,
    logits: torch.Tensor,
    processor: LogitsProcessor,
    generator: torch.Generator | None,
    vocab_size: int,
) -> tuple[int, int]:
    """How many drafts the target keeps and the token it adds after them."""
    if processor.is_greedy:
        return verify_greedy(draft.tokens, logits)
    target_probs = processor.probabilities(logits)
    draft_probs = draft.probs
    if draft_probs is None:  # a deterministic drafter: a point mass q
        draft_probs = torch.nn.functional.one_hot(draft.tokens, vocab_size).float()
    return verify_sampling(draft.tokens, draft_probs, target_probs, generator)


def _prime(policy: GammaPolicy, target: PreTrainedModel) -> None:
    """Tell the policy the target's step costs per number of drafts, from its
    forward-width timings (a step with k drafts feeds k + 1 tokens, padded to
    the width the plan chose)."""
    plan = width_plan(target)
    if plan is None:
        return
    policy.prime(
        {
            width - 1: plan.seconds[padded]
            for width, padded in plan.padded.items()
            if padded in plan.seconds
        }
    )


def _collect(
    kind: GeneratorKind,
    inputs: list[int],
    steps: Iterator[StepEvent],
    tokenizer: PreTrainedTokenizerBase | None,
    on_step: StepCallback | None,
) -> GenerationResult:
    result = GenerationResult(kind=kind, prompt_tokens=len(inputs))
    last_seen = 0.0
    try:
        while True:
            try:
                event = next(steps)
            except StopIteration as finished:
                result.stop_reason, result.seconds, result.reused_prompt_tokens = finished.value
                break
            result.record(event)
            last_seen = event.seconds_since_start
            if on_step is not None:
                on_step(event)
    except KeyboardInterrupt:
        steps.close()
        result.stop_reason = "interrupted"
        result.seconds = last_seen
        if tokenizer is not None:
            result.text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        raise GenerationInterrupted(result) from None
    if tokenizer is not None:
        result.text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    return result


def stream_speculative(
    inputs: list[int],
    drafter: Drafter | PreTrainedModel,
    target: PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    gamma: int | GammaPolicy = 4,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    prompt_cache: PromptCache | None = None,
) -> Iterator[StepEvent]:
    """Speculative decoding as an iterator of steps (see `speculative_generate`)."""
    return _run_loop(
        inputs,
        target,
        as_drafter(drafter, use_cache=use_cache),
        logits_processor=logits_processor or GreedyProcessor(),
        gamma=gamma,
        max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id,
        use_cache=use_cache,
        generator=generator,
        vocab_size=vocab_size,
        prompt_cache=prompt_cache,
    )


def stream_autoregressive(
    inputs: list[int],
    model: PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    prompt_cache: PromptCache | None = None,
) -> Iterator[StepEvent]:
    """Plain decoding with one model, one token per step, as an iterator of steps."""
    return _run_loop(
        inputs,
        model,
        None,
        logits_processor=logits_processor or GreedyProcessor(),
        gamma=0,
        max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id,
        use_cache=use_cache,
        generator=generator,
        vocab_size=vocab_size,
        prompt_cache=prompt_cache,
    )


def speculative_generate(
    inputs: list[int],
    drafter: Drafter | PreTrainedModel,
    target: PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    gamma: int | GammaPolicy = 4,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_step: StepCallback | None = None,
    prompt_cache: PromptCache | None = None,
) -> GenerationResult:
    """Generate up to `max_gen_len` new tokens after `inputs` with speculative decoding.

    The output follows the target's distribution exactly (greedy: the target's
    greedy tokens). `drafter` is a model sharing the target's tokenizer or a
    `Drafter`; `gamma` is a fixed number of drafts per step or a `GammaPolicy`;
    `vocab_size` is the logits width both are cut to (default: the narrower
    model's); `generator` must live on the target's device. Stops at
    any token in `eos_tokens_id` (included in the output). `on_step` sees each
    `StepEvent` as it happens. Ctrl-C raises `GenerationInterrupted` carrying
    the partial result.

    `prompt_cache` (a `PromptCache` kept by the caller) carries the target's
    cache from one call to the next: the prompt tokens it already holds are not
    fed again (a chat). The drafter keeps its own state when it was built to
    (`keep_between_prompts`).
    """
    steps = stream_speculative(
        inputs,
        drafter,
        target,
        logits_processor=logits_processor,
        gamma=gamma,
        max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id,
        use_cache=use_cache,
        generator=generator,
        vocab_size=vocab_size,
        prompt_cache=prompt_cache,
    )
    return _collect("speculative", inputs, steps, tokenizer, on_step)


def autoregressive_generate(
    inputs: list[int],
    model: PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_step: StepCallback | None = None,
    prompt_cache: PromptCache | None = None,
) -> GenerationResult:
    """Generate with `model` alone, one token per forward pass (the reference output).

    `prompt_cache` carries the model's cache from one call to the next (see
    `speculative_generate`)."""
    steps = stream_autoregressive(
        inputs,
        model,
        logits_processor=logits_processor,
        max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id,
        use_cache=use_cache,
        generator=generator,
        vocab_size=vocab_size,
        prompt_cache=prompt_cache,
    )
    return _collect("autoregressive", inputs, steps, tokenizer, on_step)
