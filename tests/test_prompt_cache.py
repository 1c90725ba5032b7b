"""Caches kept between generations (`PromptCache`, drafters that keep their state):
every turn of a chat gives exactly the tokens of a run that recomputes everything."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import (
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
)
from specrepl.engine.processors import GreedyProcessor, MultinomialProcessor
from specrepl.engine.prompt_cache import PromptCache, common_prefix
from specrepl.testing import interrupt_on_call, perturbed_copy, tiny_head, tiny_llama

VOCAB, END = 32, 3


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(VOCAB, seed=4)


@pytest.fixture(scope="module")
def drafter_model(target) -> torch.nn.Module:
    return perturbed_copy(target, 0.3, seed=2)


@pytest.fixture(scope="module")
def head(target) -> Any:
    return tiny_head(target, draft_vocab=24)


def user_turn(turn: int) -> list[int]:
    """A short 'user message' of its own tokens (ids 4 and up; 3 ends an answer)."""
    generator = torch.Generator().manual_seed(100 + turn)
    return [5, *torch.randint(4, VOCAB, (3 + turn % 4,), generator=generator).tolist(), 6]


def chat_prompts(answers: list[list[int]], turn: int) -> list[int]:
    """The prompt of `turn`: every earlier user turn and answer, then the new user turn.
    Turn 6 renders turn 1's answer differently (as a template might), so what is
    shared with the cache ends there."""
    ids: list[int] = [4]
    for earlier in range(turn):
        ids += user_turn(earlier)
        answer = answers[earlier]
        if turn == 6 and earlier == 1:
            answer = [7, *answer]
        ids += answer
    return ids + user_turn(turn)


DrafterFactory = Callable[[Any, Any, Any], Drafter]
DRAFTERS: dict[str, DrafterFactory] = {
    "model": lambda model, head, keep: ModelDrafter(model, keep_between_prompts=keep),
    "head": lambda model, head, keep: HeadDrafter(head, keep_between_prompts=keep),
    "hybrid head": lambda model, head, keep: HybridDrafter(
        HeadDrafter(head, keep_between_prompts=keep), LookupDrafter(3)
    ),
    "hybrid model": lambda model, head, keep: HybridDrafter(
        ModelDrafter(model, keep_between_prompts=keep), LookupDrafter(3)
    ),
    # its counts are not a cache: both sides keep them from turn to turn
    "ngram": lambda model, head, keep: NgramDrafter(3, keep_between_prompts=True),
}


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix(torch.tensor([1, 2]), [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def run_turn(
    ids: list[int],
    target: Any,
    drafter: Drafter | None,
    cache: PromptCache | None,
    *,
    turn: int,
    sampling: bool,
) -> Any:
    """One turn: gamma changes from turn to turn, the sampling seed is the turn's."""
    common: dict[str, Any] = {
        "max_gen_len": 12, "eos_tokens_id": END, "vocab_size": VOCAB, "prompt_cache": cache,
        "logits_processor": MultinomialProcessor(1.0) if sampling else GreedyProcessor(),
        "generator": torch.Generator().manual_seed(turn),
    }  # fmt: skip
    if drafter is None:
        return autoregressive_generate(ids, target, **common)
    # auto gamma follows measured times, and under sampling another gamma draws other
    # random numbers: sampled turns use fixed gammas
    gamma = make_policy("auto", 6) if turn % 3 == 2 and not sampling else 1 + turn % 5
    return speculative_generate(ids, drafter, target, gamma=gamma, **common)


@pytest.mark.parametrize("kind", ["target only", *DRAFTERS])
@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
def test_a_ten_turn_chat_with_kept_caches_gives_the_recomputed_tokens(
    target, drafter_model, head, kind: str, sampling: bool
) -> None:
    def drafter(keep: bool) -> Drafter | None:
        return None if kind == "target only" else DRAFTERS[kind](drafter_model, head, keep)

    kept_cache, kept_drafter = PromptCache(), drafter(True)
    counting = drafter(False) if kind == "ngram" else None
    answers: list[list[int]] = []
    last: list[int] = []  # the last turn's prompt and answer
    for turn in range(10):
        ids = chat_prompts(answers, turn)
        recomputing = counting or drafter(False)
        fresh = run_turn(ids, target, recomputing, None, turn=turn, sampling=sampling)
        kept = run_turn(ids, target, kept_drafter, kept_cache, turn=turn, sampling=sampling)
        assert kept.token_ids == fresh.token_ids, (kind, turn)
        if not sampling:
            reference = autoregressive_generate(ids, target, max_gen_len=12, eos_tokens_id=END)
            assert kept.token_ids == reference.token_ids, (kind, turn)
        # the cache holds the last turn but its last token (all of it when an end
        # token was a kept draft), as far as this turn's prompt shares it
        reused = kept.reused_prompt_tokens
        at_least = min(common_prefix(last[:-1], ids), len(ids) - 1)
        assert at_least <= reused <= min(common_prefix(last, ids), len(ids) - 1), (kind, turn)
        if turn not in (0, 6, 7):  # turn 6 re-rendered turn 1's answer, turn 7 went back
            assert reused >= len(last) - 1
        answers.append(list(kept.token_ids))
        last = [*ids, *kept.token_ids]


@pytest.mark.parametrize("kind", ["target only", "model", "head", "hybrid head"])
def test_an_interrupted_turn_drops_the_kept_caches(target, drafter_model, head, kind) -> None:
    kept_cache = PromptCache()
    drafter = None if kind == "target only" else DRAFTERS[kind](drafter_model, head, True)
    common: dict[str, Any] = {"max_gen_len": 12, "eos_tokens_id": END, "vocab_size": VOCAB}

    def run(ids: list[int]) -> Any:
        if drafter is None:
            return autoregressive_generate(ids, target, prompt_cache=kept_cache, **common)
        return speculative_generate(
            ids, drafter, target, gamma=3, prompt_cache=kept_cache, **common
        )

    answers: list[list[int]] = []
    for turn in range(3):
        answers.append(list(run(chat_prompts(answers, turn)).token_ids))
    assert kept_cache.held > 0
    with interrupt_on_call(target, 2), pytest.raises(GenerationInterrupted):
        run(chat_prompts(answers, 3))
    assert kept_cache.held == 0  # the interrupted run's cache is not kept
    for turn in range(3, 6):  # the interrupted turn is asked again, then the chat goes on
        ids = chat_prompts(answers, turn)
        result = run(ids)
        assert result.token_ids == autoregressive_generate(ids, target, **common).token_ids
        assert (result.reused_prompt_tokens == 0) == (turn == 3)
        answers.append(list(result.token_ids))


def test_a_cache_is_not_reused_for_another_model(target, drafter_model) -> None:
    kept = PromptCache()
    ids = [4, 5, 6, 7, 8]
    autoregressive_generate(ids, target, max_gen_len=4, prompt_cache=kept)
    assert kept.held > 0 and kept.reusable(drafter_model, ids) == 0
    result = autoregressive_generate(ids, drafter_model, max_gen_len=4, prompt_cache=kept)
    assert result.reused_prompt_tokens == 0
    assert result.token_ids == autoregressive_generate(ids, drafter_model, max_gen_len=4).token_ids


def test_the_same_prompt_again_feeds_only_its_last_token(target) -> None:
    kept = PromptCache()
    ids = [4, 5, 6, 7, 8, 9]
    first = autoregressive_generate(ids, target, max_gen_len=5, prompt_cache=kept)
    again = autoregressive_generate(ids, target, max_gen_len=5, prompt_cache=kept)
    assert again.reused_prompt_tokens == len(ids) - 1
    assert again.token_ids == first.token_ids
