"""Every drafter kind and gamma policy keeps the target's output exactly."""

from __future__ import annotations

import pytest
import torch

from specrepl.drafters import LookupDrafter, ModelDrafter, NgramDrafter
from specrepl.gamma import AutoGamma, HeuristicGamma, expected_tokens, make_policy
from specrepl.generation import autoregressive_generate, speculative_generate
from specrepl.results import StepEvent
from specrepl.testing import perturbed_copy, tiny_llama

PROMPTS = ([1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30], [1, 5, 9, 12], [6, 7, 6, 7, 6, 7])


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=0)


@pytest.fixture(scope="module")
def references(target) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): autoregressive_generate(p, target, max_gen_len=40).token_ids for p in PROMPTS}


def make_drafter(kind: str, target, use_cache: bool):
    if kind == "model":
        return ModelDrafter(perturbed_copy(target, 0.1, seed=1), use_cache=use_cache)
    if kind == "ngram":
        return NgramDrafter(4)
    if kind == "ngram-kept":
        return NgramDrafter(3, keep_between_prompts=True)
    return LookupDrafter(3)


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "confidence", "auto"])
@pytest.mark.parametrize("kind", ["model", "ngram", "ngram-kept", "lookup"])
def test_greedy_equality_for_every_drafter_and_policy(target, references, kind, policy) -> None:
    for gamma, use_cache in ((1, True), (3, False), (8, True)):
        drafter = make_drafter(kind, target, use_cache)
        for prompt in PROMPTS:  # the same drafter object across prompts, as in a chat
            result = speculative_generate(
                prompt,
                drafter,
                target,
                gamma=make_policy(policy, gamma),
                max_gen_len=40,
                use_cache=use_cache,
            )
            assert result.token_ids == references[tuple(prompt)], (kind, policy, gamma)


def test_ngram_proposes_the_most_frequent_continuation_of_the_longest_context() -> None:
    drafter = NgramDrafter(3)
    drafter.begin(torch.tensor([1, 2, 3, 1, 2, 4, 1, 2, 4, 9, 2]), 32)
    # context (9, 2) is unknown; (2,) was followed by 3 once and 4 twice
    draft = drafter.propose(torch.tensor([0]), 3, None, None)
    assert draft.tokens.tolist()[0] == 4 and draft.probs is None
    drafter.begin(torch.tensor([5, 6]), 32)  # not kept: counts start again
    assert drafter.propose(torch.tensor([0]), 2, None, None).tokens.tolist() == []


def test_ngram_learns_from_accepted_and_target_tokens() -> None:
    drafter = NgramDrafter(2)
    drafter.begin(torch.tensor([1, 2]), 32)
    drafter.update(torch.tensor([1, 2, 7]), 2)
    drafter.update(torch.tensor([1, 2, 7, 2, 7]), 3)
    proposal = drafter.propose(torch.tensor([1, 2, 7, 2, 7]), 2, None, None)
    assert proposal.tokens.tolist() == [2, 7]


def test_lookup_copies_what_followed_the_last_match() -> None:
    drafter = LookupDrafter(max_ngram=2)
    sequence = torch.tensor([4, 5, 6, 7, 8, 1, 4, 5])
    assert drafter.propose(sequence, 3, None, None).tokens.tolist() == [6, 7, 8]
    assert drafter.propose(torch.tensor([9, 8, 7]), 3, None, None).tokens.tolist() == []


def test_confidence_stops_the_model_drafter_early(target) -> None:
    drafter = ModelDrafter(tiny_llama(32, seed=5, sharpness=1.0))
    result = speculative_generate(
        PROMPTS[1], drafter, target, gamma=make_policy("confidence", 8, confidence=0.99)
    )
    assert result.drafted == 0  # a flat drafter is never that sure


def _event(gamma: int, accepted: int, draft: float, verify: float) -> StepEvent:
    return StepEvent(
        drafts=tuple(range(gamma)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=draft,
        target_seconds=verify,
        seconds_since_start=0.0,
        requested_gamma=gamma,
    )


def test_heuristic_moves_within_bounds() -> None:
    policy = HeuristicGamma(5, initial=4)
    policy.observe(_event(4, 4, 0, 0))
    policy.observe(_event(5, 5, 0, 0))
    assert policy.next_gamma() == 5
    for _ in range(10):
        policy.observe(_event(policy.next_gamma(), 0, 0, 0))
    assert policy.next_gamma() == 1


def test_expected_tokens_formula() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_auto_drafts_long_when_drafts_are_cheap_and_good() -> None:
    policy = AutoGamma(8)
    for _ in range(20):
        policy.observe(_event(4, 4, draft=4 * 0.01, verify=0.1))
    assert policy.next_gamma() >= 6


def test_auto_falls_back_to_the_target_alone_when_drafting_does_not_pay() -> None:
    policy = AutoGamma(8)
    for _ in range(20):
        gamma = policy.next_gamma()
        if gamma == 0:
            policy.observe(_event(0, 0, 0.0, 0.1))
        else:
            policy.observe(_event(gamma, 0, draft=gamma * 0.08, verify=0.12))
    assert policy.next_gamma() == 0
    for _ in range(30):  # a probe now and then keeps the estimate alive
        gamma = policy.next_gamma()
        policy.observe(_event(gamma, 0, gamma * 0.08, 0.1))
    assert policy.plain_steps < 16
