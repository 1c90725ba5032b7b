"""The autoregressive and speculative generators.

One decoding loop serves both: this module sets a run up (the prompt
checked against the context, the vocabulary width, the target's cache,
reused from a `PromptCache` where it can be), runs the loop's steps
(`steps.py`: draft, score, verify, keep) and collects their `StepEvent`s into
a `GenerationResult` (the `*_generate` functions) or streams them (the
`stream_*` ones). Target-only (autoregressive) generation is the same loop
with no drafts, so both share every cost that is not a model call. The
target's forward passes run as its `tuning.Tuning` says (passed in by the
caller: width plan and linear forms).

Invariant with caches on: before a step, each model's cache holds a prefix of
the current sequence and at least its last token is uncached; after the step
both caches are rolled back to the part that verification kept.

This module never prints and knows nothing about chat templates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrepl.engine.clock import Clock
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.model import as_drafter
from specrepl.engine.gamma import FixedGamma, GammaPolicy
from specrepl.engine.processors import GreedyProcessor, LogitsProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import (
    GenerationResult,
    GeneratorKind,
    StepEvent,
    StopReason,
)
from specrepl.engine.runtime import FeaturesUnavailable, ModelRuntime, RunnableModel, as_runnable
from specrepl.engine.signals import raise_lost_signal, signals_received
from specrepl.engine.steps import decode_steps
from specrepl.engine.tuning import Tuning

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
    target: RunnableModel | PreTrainedModel,
    drafter: Drafter | None,
    *,
    tuning: Tuning | None,
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
    seconds and how many prompt tokens a kept runtime spared the target."""
    policy = FixedGamma(gamma) if isinstance(gamma, int) else gamma
    if max_gen_len < 1:
        raise ValueError(f"max_gen_len must be >= 1, got {max_gen_len}")
    runnable = as_runnable(target, tuning)
    context = runnable.context
    _check_prompt(inputs, context)
    if vocab_size is None:
        vocab_size = runnable.width
        if drafter is not None and drafter.width is not None:
            vocab_size = min(vocab_size, drafter.width)
    limit = max_gen_len if context is None else min(max_gen_len, context - len(inputs))
    limit_reason: StopReason = "length" if limit == max_gen_len else "context"

    clock = Clock(runnable.devices)
    clock.resume()
    sequence = torch.tensor(inputs, dtype=torch.long, device=runnable.device)
    end_tokens = _end_tokens(eos_tokens_id)
    try:
        if drafter is not None:
            drafter.stop_at(end_tokens)
            drafter.begin(sequence, vocab_size)
        runtime, reused = _target_runtime(runnable, inputs, drafter, use_cache, prompt_cache)
        steps = decode_steps(
            sequence, runtime, drafter, policy, clock,
            logits_processor=logits_processor, limit=limit, end_tokens=end_tokens,
            generator=generator, vocab_size=vocab_size,
        )  # fmt: skip
        stop, sequence = yield from steps
    except BaseException:  # interrupted or failed: what the runtimes hold may be half a step
        if drafter is not None:
            drafter.forget()
        raise
    if prompt_cache is not None and use_cache:
        prompt_cache.keep(runtime, sequence)
    clock.pause()
    return stop or limit_reason, clock.active, reused


def _target_runtime(
    target: RunnableModel,
    inputs: list[int],
    drafter: Drafter | None,
    use_cache: bool,
    prompt_cache: PromptCache | None,
) -> tuple[ModelRuntime, int]:
    """The target's runtime for this run and how many prompt tokens it already holds.

    A drafter that reads the target's features needs them at every position the
    target feeds, so the target re-uses no more than the drafter kept; a runtime
    that cannot give features refuses such a drafter."""
    at_most = None
    if drafter is not None and drafter.uses_target_features:
        if not target.gives_features:  # refused before a kept runtime is taken
            raise FeaturesUnavailable(
                f"the drafter {drafter.name!r} reads the target's features, which the target's "
                f"{target.runtime_name} runtime does not give: run the target in torch"
            )
        at_most = drafter.features_held()
    if not use_cache:
        return target.open(use_cache=False), 0
    if prompt_cache is None:
        return target.open(), 0
    return prompt_cache.take(target, inputs, at_most)


def _collect(
    kind: GeneratorKind,
    inputs: list[int],
    steps: Iterator[StepEvent],
    tokenizer: PreTrainedTokenizerBase | None,
    on_step: StepCallback | None,
) -> GenerationResult:
    result = GenerationResult(kind=kind, prompt_tokens=len(inputs))
    last_seen = 0.0
    signals = signals_received()
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
            raise_lost_signal(signals)
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
    target: RunnableModel | PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    gamma: int | GammaPolicy = 4,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    prompt_cache: PromptCache | None = None,
    tuning: Tuning | None = None,
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
        tuning=tuning,
    )


def stream_autoregressive(
    inputs: list[int],
    model: RunnableModel | PreTrainedModel,
    *,
    logits_processor: LogitsProcessor | None = None,
    max_gen_len: int = 128,
    eos_tokens_id: int | Iterable[int] | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    prompt_cache: PromptCache | None = None,
    tuning: Tuning | None = None,
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
        tuning=tuning,
    )


def speculative_generate(
    inputs: list[int],
    drafter: Drafter | PreTrainedModel,
    target: RunnableModel | PreTrainedModel,
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
    tuning: Tuning | None = None,
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

    `tuning` is the target's (`tuning.Tuning`, made by whoever loaded it: a
    loaded pair's `pair.target.tuning`): the width plan and linear forms its
    forward passes run with. None runs it untuned (same output, stock cost).
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
        tuning=tuning,
    )
    return _collect("speculative", inputs, steps, tokenizer, on_step)


def autoregressive_generate(
    inputs: list[int],
    model: RunnableModel | PreTrainedModel,
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
    tuning: Tuning | None = None,
) -> GenerationResult:
    """Generate with `model` alone, one token per forward pass (the reference output).

    `prompt_cache` carries the model's cache from one call to the next, and
    `tuning` is the model's (see `speculative_generate`)."""
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
        tuning=tuning,
    )
    return _collect("autoregressive", inputs, steps, tokenizer, on_step)
