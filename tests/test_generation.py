"""Greedy speculative decoding is the target's greedy decoding, token for token."""

from __future__ import annotations

import pytest
import torch

from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import (
    ContextTooLongError,
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
    stream_speculative,
)
from specrepl.engine.results import PROMPT_PASS
from specrepl.testing import perturbed_copy, tiny_llama

PROMPTS = ([1, 5, 9, 12], [1, 17, 4, 30, 8, 8, 2, 11], [7])


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=0)


@pytest.fixture(scope="module")
def drafters(target: torch.nn.Module) -> dict[str, torch.nn.Module]:
    padded = tiny_llama(40, seed=3)  # logits padded wider than the target's vocabulary
    return {
        "close": perturbed_copy(target, 0.1, seed=1),  # agrees often, not always
        "unrelated": tiny_llama(32, seed=1),  # agrees rarely
        "same": target,  # agrees always: every step ends with a bonus token
        "padded": padded,
    }


@pytest.fixture(scope="module")
def references(target: torch.nn.Module) -> dict[tuple[int, ...], list[int]]:
    return {
        tuple(prompt): autoregressive_generate(prompt, target, max_gen_len=24).token_ids
        for prompt in PROMPTS
    }


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("gamma", [*range(1, 9), 12, 16])
@pytest.mark.parametrize("drafter_name", ["close", "unrelated", "same", "padded"])
def test_greedy_speculative_equals_greedy_target(
    target, drafters, references, drafter_name, gamma, use_cache
) -> None:
    for prompt in PROMPTS:
        result = speculative_generate(
            prompt,
            drafters[drafter_name],
            target,
            gamma=gamma,
            max_gen_len=24,
            use_cache=use_cache,
            vocab_size=32,
        )
        assert result.token_ids == references[tuple(prompt)]


def test_the_close_drafter_is_partly_accepted(target, drafters) -> None:
    """The equality tests above exercise both rejections and full acceptance."""
    result = speculative_generate(PROMPTS[1], drafters["close"], target, gamma=4, max_gen_len=24)
    assert 0.2 < result.acceptance_rate < 0.95
    assert result.accepted_length_histogram[0] > 0  # some step rejected its first draft
    same = speculative_generate(PROMPTS[1], drafters["same"], target, gamma=4, max_gen_len=24)
    assert same.acceptance_rate == 1.0


def test_autoregressive_without_cache_matches_with_cache(target, references) -> None:
    for prompt in PROMPTS:
        result = autoregressive_generate(prompt, target, max_gen_len=24, use_cache=False)
        assert result.token_ids == references[tuple(prompt)]


def test_result_figures_are_consistent(target, drafters) -> None:
    result = speculative_generate(PROMPTS[0], drafters["close"], target, gamma=3, max_gen_len=20)
    assert result.new_tokens == 20 == len(result.token_ids)
    assert result.stop_reason == "length"
    assert result.accepted <= result.drafted
    assert sum(result.accepted_length_histogram) <= result.steps
    assert result.accepted == sum(result.accepted_per_position)
    assert result.mean_accepted_length == pytest.approx(20 / result.steps)
    assert result.seconds > 0 and result.tokens_per_second == pytest.approx(20 / result.seconds)
    assert 0 < result.time_to_first_token <= result.seconds
    assert result.draft_seconds + result.target_seconds <= result.seconds
    target_only = autoregressive_generate(PROMPTS[0], target, max_gen_len=20)
    assert target_only.steps == 20
    assert target_only.acceptance_rate is None and target_only.mean_accepted_length is None
    assert target_only.to_dict()["drafted"] is None


def test_never_more_than_max_gen_len(target, drafters) -> None:
    for max_gen_len in (1, 2, 3, 7):
        for gamma in (1, 4, 8):
            result = speculative_generate(
                PROMPTS[0], drafters["same"], target, gamma=gamma, max_gen_len=max_gen_len
            )
            assert result.new_tokens == max_gen_len


def test_stops_at_any_end_token(target, references) -> None:
    reference = references[tuple(PROMPTS[1])]
    end = reference[5]
    first = reference.index(end)
    for eos in (end, [99, end], {end}):
        result = speculative_generate(
            PROMPTS[1], target, target, gamma=4, max_gen_len=24, eos_tokens_id=eos
        )
        assert result.token_ids == reference[: first + 1]
        assert result.stop_reason == "eos"
        plain = autoregressive_generate(PROMPTS[1], target, max_gen_len=24, eos_tokens_id=eos)
        assert plain.token_ids == result.token_ids


def test_refuses_a_prompt_longer_than_the_context() -> None:
    short = tiny_llama(32, seed=0, max_position_embeddings=16)
    with pytest.raises(ContextTooLongError, match="16 tokens"):
        speculative_generate(list(range(4, 20)), short, short, max_gen_len=4)
    with pytest.raises(ContextTooLongError):
        autoregressive_generate([5] * 40, short, max_gen_len=4)
    with pytest.raises(ValueError, match="empty"):
        autoregressive_generate([], short)


def test_stops_at_the_end_of_the_context() -> None:
    short = tiny_llama(32, seed=0, max_position_embeddings=16)
    drafter = tiny_llama(32, seed=1, max_position_embeddings=16)
    prompt = [1, 5, 9, 12, 4, 6, 7, 8, 9, 10]
    plain = autoregressive_generate(prompt, short, max_gen_len=100)
    assert plain.new_tokens == 6 and plain.stop_reason == "context"
    for gamma in (1, 3, 8, 16):
        result = speculative_generate(prompt, drafter, short, gamma=gamma, max_gen_len=100)
        assert result.token_ids == plain.token_ids and result.stop_reason == "context"


def test_ctrl_c_returns_the_partial_result(target, drafters, references) -> None:
    seen = []

    def interrupt_after_two_steps(event) -> None:
        seen.append(event)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(GenerationInterrupted) as caught:
        speculative_generate(
            PROMPTS[0],
            drafters["close"],
            target,
            gamma=3,
            max_gen_len=24,
            on_step=interrupt_after_two_steps,
        )
    partial = caught.value.result
    assert partial.stop_reason == "interrupted" and partial.steps == 2
    assert partial.token_ids == references[tuple(PROMPTS[0])][: partial.new_tokens]


def test_stream_yields_steps_that_add_up(target, drafters, references) -> None:
    events = list(stream_speculative(PROMPTS[2], drafters["close"], target, max_gen_len=24))
    tokens = [token for event in events for token in event.appended]
    assert tokens == references[tuple(PROMPTS[2])]
    collected = speculative_generate(PROMPTS[2], drafters["close"], target, max_gen_len=24)
    assert collected.drafted == sum(event.gamma for event in events)
    assert collected.accepted == sum(event.accepted for event in events)
    for event in events:
        assert event.appended[: event.accepted] == event.drafts[: event.accepted]
        assert len(event.appended) == event.accepted + 1
        if event.rejected is not None:
            assert event.appended[event.accepted] != event.rejected


@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_the_first_token_comes_from_the_targets_prompt_pass(target, drafters, policy) -> None:
    """The first step drafts nothing: its token is the target's own from the prompt
    pass (at the target's pace); the drafter reads the prompt and that token
    before its first draft, in the next step."""
    prompt = [3, 9, 4, 17, 2, 8, 11]
    reference = autoregressive_generate(prompt, target, max_gen_len=12)
    steps = list(
        stream_speculative(
            prompt,
            ModelDrafter(drafters["close"]),
            target,
            gamma=make_policy(policy, 4),
            max_gen_len=12,
        )
    )
    first, second = steps[0], steps[1]
    assert first.drafts == () and first.choice == PROMPT_PASS
    assert first.appended == (reference.token_ids[0],)
    assert second.gamma > 0
    assert second.read_tokens == len(prompt) + 1  # the whole prompt, then the first token
    assert second.source == "model" and second.read_seconds <= second.draft_seconds
