"""Every drafter kind and gamma policy keeps the target's output exactly."""

from __future__ import annotations

import copy as copy_module
import functools

import pytest
import torch
from transformers import LlamaForCausalLM

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.builder import DrafterSpec, build_drafter
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter, is_copy_of
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.forward import forward_logits
from specrepl.engine.gamma import AutoGamma, HeuristicGamma, expected_tokens, make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.kv_cache import cached_length, new_cache
from specrepl.engine.processors import GreedyProcessor
from specrepl.engine.results import Offer, StepEvent
from specrepl.testing import assert_no_draft_past_end, perturbed_copy, tiny_head, tiny_llama

PROMPTS = ([1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30], [1, 5, 9, 12], [6, 7, 6, 7, 6, 7])


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=0)


@pytest.fixture(scope="module")
def references(target) -> dict[tuple[int, ...], list[int]]:
    return {tuple(p): autoregressive_generate(p, target, max_gen_len=40).token_ids for p in PROMPTS}


@functools.cache
def trained_head(target):
    """A head trained for two seconds: it drafts right often but not always."""
    return tiny_head(target, draft_vocab=24)


@functools.cache
def trained_fused_head(target):
    """A head that reads the target's layer 1 besides its final hidden state (EAGLE-3)."""
    return tiny_head(target, draft_vocab=24, fused_layers=(1,))


def make_drafter(kind: str, target, use_cache: bool):
    if kind == "head":
        return HeadDrafter(trained_head(target))
    if kind == "head-fused":
        return HeadDrafter(trained_fused_head(target))
    if kind == "hybrid-head-fused":
        return HybridDrafter(HeadDrafter(trained_fused_head(target)), LookupDrafter(3), min_match=1)
    if kind == "hybrid-head":
        return HybridDrafter(HeadDrafter(trained_head(target)), LookupDrafter(3), min_match=1)
    if kind == "model":
        return ModelDrafter(perturbed_copy(target, 0.1, seed=1), use_cache=use_cache)
    if kind == "ngram":
        return NgramDrafter(4)
    if kind == "ngram-kept":
        return NgramDrafter(3, keep_between_prompts=True)
    if kind == "ngram-filler":
        return NgramDrafter(4, top_k_filler=3)
    if kind == "model-window":
        return ModelDrafter(perturbed_copy(target, 0.1, seed=1), use_cache=use_cache, window=3)
    if kind == "hybrid":
        model = ModelDrafter(perturbed_copy(target, 0.1, seed=1), use_cache=use_cache)
        return HybridDrafter(model, LookupDrafter(3), min_match=1)
    if kind in ("model-copy", "hybrid-copy"):  # takes the target's keys and values
        copy = perturbed_copy(target, 0.1, seed=1)
        model = ModelDrafter(copy, use_cache=use_cache, copy_of_target=True)
        return (
            model if kind == "model-copy" else HybridDrafter(model, LookupDrafter(3), min_match=1)
        )
    return LookupDrafter(3)


@pytest.mark.parametrize("policy", ["fixed", "heuristic", "confidence", "auto"])
@pytest.mark.parametrize(
    "kind",
    [
        "model",
        "model-window",
        "model-copy",
        "hybrid-copy",
        "ngram",
        "ngram-kept",
        "ngram-filler",
        "lookup",
        "hybrid",
        "head",
        "hybrid-head",
        "head-fused",
        "hybrid-head-fused",
    ],
)
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


def test_top_k_filler_counts_the_targets_likely_alternatives() -> None:
    logits = torch.full((2, 32), -10.0)
    logits[0, [7, 9, 11]] = torch.tensor([3.0, 2.0, 1.0])  # the target's view after (.., 2)
    logits[1, [2, 5]] = torch.tensor([1.0, 0.5])  # and after (.., 2, 7)
    plain, filled = NgramDrafter(2), NgramDrafter(2, top_k_filler=2)
    for drafter in (plain, filled):
        drafter.begin(torch.tensor([1, 2]), 32)
        drafter.update(torch.tensor([1, 2, 7, 2]), 2, logits)
    assert plain.counts[(7,)] == {2: 1}
    assert filled.counts[(2,)] == {7: 2, 9: 1}  # 7 seen and among the top 2; 9 only filled
    assert filled.counts[(7,)] == {2: 2, 5: 1}
    assert filled.propose(torch.tensor([1, 2, 7, 2]), 1, None, None).tokens.tolist() == [7]
    with pytest.raises(ValueError, match="top_k_filler"):
        NgramDrafter(3, top_k_filler=0)


def test_hybrid_drafts_from_lookup_only_on_a_long_enough_match(target) -> None:
    hybrid = HybridDrafter(ModelDrafter(target), LookupDrafter(3), min_match=2)
    hybrid.begin(torch.tensor([4, 5, 6, 7, 4, 5]), 32)
    assert hybrid.propose(torch.tensor([4, 5, 6, 7, 4, 5]), 2, GreedyProcessor(), None)
    assert hybrid.last_source == "lookup"
    hybrid.begin(torch.tensor([4, 5, 6, 7, 8, 5]), 32)  # only (5,) recurs: too short
    draft = hybrid.propose(torch.tensor([4, 5, 6, 7, 8, 5]), 2, GreedyProcessor(), None)
    assert hybrid.last_source == "model" and len(draft) == 2


def test_lookup_copies_what_followed_the_last_match() -> None:
    drafter = LookupDrafter(max_ngram=2)
    sequence = torch.tensor([4, 5, 6, 7, 8, 1, 4, 5])
    assert drafter.propose(sequence, 3, None, None).tokens.tolist() == [6, 7, 8]
    assert drafter.propose(torch.tensor([9, 8, 7]), 3, None, None).tokens.tolist() == []


def test_lookup_copies_nothing_past_an_end_token() -> None:
    drafter = LookupDrafter(max_ngram=2)
    drafter.stop_at(frozenset({7}))
    sequence = torch.tensor([4, 5, 6, 7, 8, 1, 4, 5])
    assert drafter.propose(sequence, 3, None, None).tokens.tolist() == [6, 7]
    assert drafter.offers(sequence, 3)[0].tokens == (6, 7)


def test_ngram_drafts_nothing_past_an_end_token() -> None:
    drafter = NgramDrafter(3)
    drafter.stop_at(frozenset({8}))
    sequence = torch.tensor([4, 5, 6, 7, 8, 9, 4, 5])
    drafter.begin(sequence, 32)
    assert drafter.propose(sequence, 6, None, None).tokens.tolist() == [6, 7, 8]


@pytest.mark.parametrize(
    "kind", ["exact-model", "model-copy", "hybrid", "ngram", "lookup", "head", "hybrid-head"]
)
def test_no_draft_goes_past_the_answers_end(target, references, kind) -> None:
    """Drafts stop at an end token (nothing after it is kept) and the text is the target's."""
    prompt = PROMPTS[2] if kind == "lookup" else PROMPTS[1]
    reference = references[tuple(prompt)]
    end = reference[6]
    expected = reference[: reference.index(end) + 1]
    if kind == "exact-model":  # drafts the target's own tokens: the end among them
        drafter = ModelDrafter(copy_module.deepcopy(target))
    else:
        drafter = make_drafter(kind, target, use_cache=True)
    steps: list[StepEvent] = []
    result = speculative_generate(
        prompt, drafter, target, gamma=8, max_gen_len=40, eos_tokens_id=end, on_step=steps.append
    )
    assert result.token_ids == expected and result.stop_reason == "eos"
    met = assert_no_draft_past_end(steps, end, kind)
    if kind == "exact-model":
        assert met  # the case was met


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
    for _ in range(12):  # 4 drafting steps (the evidence needed), then the target alone
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


def test_auto_values_correlated_drafts_by_position() -> None:
    """Lookup-like drafts: the first token decides, the rest follow it."""
    policy = AutoGamma(8)
    for index in range(60):
        policy.observe(_event(8, 8 if index % 2 else 0, draft=0.0, verify=0.1))
    rates = policy.position_acceptance()
    assert rates[0] == pytest.approx(0.5, abs=0.1)
    assert min(rates[1:]) > 0.85  # the prior (the rate before) keeps a weight of one draft
    assert policy.expected_tokens(8) > 4.5  # an iid rate of 0.5 would predict under 2
    assert policy.next_gamma() == 8


def test_auto_drafts_short_when_later_positions_fail() -> None:
    policy = AutoGamma(8)
    for _ in range(40):
        policy.observe(_event(6, 2, draft=6 * 0.001, verify=0.1))
    assert policy.position_acceptance()[:2] == pytest.approx([1.0, 1.0], abs=0.05)
    assert policy.position_acceptance()[2] < 0.1
    assert policy.next_gamma() in (2, 3)


def test_auto_keeps_drafting_after_one_early_rejection() -> None:
    policy = AutoGamma(8)
    policy.observe(_event(4, 4, draft=4 * 0.5, verify=0.5))  # prompt processing: no costs
    policy.observe(_event(4, 0, draft=4 * 0.03, verify=0.07))
    assert policy.next_gamma() > 0


def test_auto_ignores_the_catch_up_after_target_alone_steps() -> None:
    policy = AutoGamma(8)
    policy.observe(_event(4, 4, 0.5, 0.5))
    for _ in range(3):
        policy.observe(_event(4, 4, draft=4 * 0.03, verify=0.07))
    policy.observe(_event(0, 0, 0.0, 0.06))
    policy.observe(_event(4, 4, draft=1.0, verify=0.07))  # the drafter reads what it missed
    assert policy.draft_cost == pytest.approx(0.03)
    assert policy.next_gamma() > 0


def _hybrid_steps(hybrid: HybridDrafter, policy, sequence, lookup_right: bool, steps: int):
    """Drive `hybrid` through `policy` on a context that never grows (no cache).
    The target's text is lookup's copy (6, 7, 4) when `lookup_right`, else 9s;
    the model's drafts are taken as right whatever they are."""
    truth = (6, 7, 4, 6) if lookup_right else (9, 9, 9, 9)
    choices = []
    for _ in range(steps):
        choice = policy.choose(hybrid.offers(sequence, 3), budget=100)
        draft = hybrid.propose_source(
            choice.source, sequence, choice.gamma, GreedyProcessor(), None
        )
        drafts = draft.tokens.tolist()
        accepted = len(drafts)
        if choice.source == "lookup":
            accepted = next((i for i, t in enumerate(drafts) if t != truth[i]), len(drafts))
        appended = truth[: accepted + 1]
        policy.observe(
            StepEvent(
                drafts=tuple(drafts),
                accepted=accepted,
                appended=appended,
                draft_seconds=0.004 * len(draft) if choice.source == "model" else 0.0,
                target_seconds=0.1,
                seconds_since_start=0.0,
                requested_gamma=choice.gamma,
                source=choice.source if len(draft) else "",
            )
        )
        hybrid.update(torch.cat((sequence, torch.tensor(appended))), sequence.shape[0] + accepted)
        choices.append(choice.source)
    return choices


def test_hybrid_leaves_lookup_while_its_copies_fail(target) -> None:
    hybrid = HybridDrafter(ModelDrafter(target, use_cache=False), LookupDrafter(3), min_match=2)
    sequence = torch.tensor([4, 5, 6, 7, 4, 5])  # lookup would copy 6, 7, 4
    hybrid.begin(sequence, 32)
    policy = AutoGamma(3)
    policy.prime({k: 0.1 for k in range(4)})
    choices = _hybrid_steps(hybrid, policy, sequence, lookup_right=False, steps=12)
    assert choices[0] == "model"  # the drafter's first choice; lookup is scored meanwhile
    assert choices[-4:] == ["model"] * 4
    # lookup's copy keeps being scored on the model's steps: its estimate stays low
    assert policy.position_acceptance("lookup")[0] < 0.3


def test_hybrid_keeps_lookup_while_its_copies_are_right(target) -> None:
    hybrid = HybridDrafter(ModelDrafter(target, use_cache=False), LookupDrafter(3), min_match=2)
    sequence = torch.tensor([4, 5, 6, 7, 4, 5])
    hybrid.begin(sequence, 32)
    policy = AutoGamma(3)
    policy.prime({k: 0.1 for k in range(4)})
    choices = _hybrid_steps(hybrid, policy, sequence, lookup_right=True, steps=12)
    assert choices[-4:] == ["lookup"] * 4  # as right as the model, and it costs nothing


def test_a_policy_kept_across_a_chat_starts_each_turn_from_what_it_learnt() -> None:
    """Two early rejections at a new turn's start do not make a drafter that was
    right all along look worse than the target alone (the fresh prior would)."""
    kept = AutoGamma(6)
    kept.prime({k: 0.1 for k in range(7)})
    for _ in range(30):
        kept.observe(_event(5, 5, draft=5 * 0.01, verify=0.1))
    kept.start()  # the next turn
    fresh = AutoGamma(6)
    fresh.prime({k: 0.1 for k in range(7)})
    for policy in (kept, fresh):
        policy.observe(_event(0, 0, 0.0, 1.0))  # the target's prompt pass
        for _ in range(4):
            policy.observe(_event(4, 0, draft=4 * 0.01, verify=0.1))
    assert kept.position_acceptance()[0] > 0.5 > fresh.position_acceptance()[0]
    assert kept.next_gamma() >= 3 and fresh.next_gamma() < kept.next_gamma()


def test_a_fixed_gamma_also_chooses_the_source_from_measurements(target) -> None:
    hybrid = HybridDrafter(ModelDrafter(target, use_cache=False), LookupDrafter(3), min_match=2)
    sequence = torch.tensor([4, 5, 6, 7, 4, 5])
    hybrid.begin(sequence, 32)
    choices = _hybrid_steps(hybrid, make_policy("fixed", 3), sequence, False, steps=12)
    assert choices[-4:] == ["model"] * 4


def test_a_catch_up_read_is_priced_apart_and_shared_over_the_answer() -> None:
    """A model source that read 600 unseen tokens (a pasted document) at 3 ms each
    is still chosen: the read is paid once for the rest of the answer, and its
    drafts cost 10 ms each beside a 100 ms verification."""
    policy = AutoGamma(6)
    policy.prime({k: 0.1 for k in range(7)})
    policy.observe(StepEvent((), 0, (1,), 0.0, 1.0, 0.0))  # the target's prompt pass
    read = StepEvent(
        tuple(range(5)), 5, tuple(range(6)), 1.8 + 4 * 0.01, 0.1, 0.0, 5, "model", 1.8, 600
    )
    policy.observe(read)
    for _ in range(3):  # usual steps: one token read (the correction), 4 drafts
        policy.observe(
            StepEvent(tuple(range(5)), 5, tuple(range(6)), 0.05, 0.1, 0.0, 5, "model", 0.01, 1)
        )
    source = policy.estimates.source("model")
    assert source.draft_cost == pytest.approx(0.01)
    assert source.read_per_token == pytest.approx((1.8 - 2 * 1.8 / 600) / 598)
    assert source.first_read == pytest.approx(0.01)
    # another long stretch to read before drafting: still worth it over a long answer
    choice = policy.choose([Offer("model", 6, unread=600)], budget=120)
    assert choice.source == "model" and choice.gamma >= 4
    assert "model:" in choice.reason and "none:" in choice.reason
    # ...but not for the answer's last tokens
    assert policy.choose([Offer("model", 2, unread=600)], budget=3).gamma == 0


def test_a_steps_own_handover_is_priced_with_its_first_read_and_a_catch_up_is_not() -> None:
    """A copy taking the one draft it never read from the target (2 ms) and
    reading one token (10 ms) pays 12 ms for its first draft each step; a
    catch-up of 600 positions taken from the target (0.1 s) is neither a read
    nor a draft."""
    policy = AutoGamma(6)
    policy.observe(StepEvent((), 0, (1,), 0.0, 1.0, 0.0))  # the target's prompt pass
    drafts, appended = tuple(range(5)), tuple(range(6))
    caught_up = StepEvent(
        drafts, 5, appended, 0.1 + 0.01 + 4 * 0.01, 0.1, 0.0, 5, "model", 0.01, 1,
        import_seconds=0.1, imported_tokens=600,
    )  # fmt: skip
    policy.observe(caught_up)
    source = policy.estimates.source("model")
    assert source.first_read == pytest.approx(0.01)
    assert source.draft_cost == pytest.approx(0.01)
    own_handover = StepEvent(
        drafts, 5, appended, 0.002 + 0.01 + 4 * 0.01, 0.1, 0.0, 5, "model", 0.01, 1,
        import_seconds=0.002, imported_tokens=1,
    )  # fmt: skip
    for _ in range(40):
        policy.observe(own_handover)
    assert source.first_read == pytest.approx(0.012, rel=0.01)
    assert source.draft_cost == pytest.approx(0.01)


def test_auto_judges_the_target_alone_by_the_width_timings_it_was_primed_with() -> None:
    """A CPU whose one-token step takes a cheaper kernel (58 ms) than the padded
    wider steps (81 ms): with a third of the first drafts accepted, the target alone
    is faster, which a line through the drafting steps' costs cannot tell."""
    timed_before = {0: 0.058, **{k: 0.081 for k in range(1, 9)}}

    def run(primed: bool) -> int:
        policy = AutoGamma(8)
        if primed:
            policy.prime(timed_before)
        for index in range(30):
            gamma = policy.next_gamma()
            if gamma == 0:
                policy.observe(_event(0, 0, 0.0, 2 * 0.058))  # this run is at twice the cost
            else:
                policy.observe(_event(gamma, int(index % 3 == 0), gamma * 0.004, 2 * 0.081))
        return policy.next_gamma()

    assert run(primed=False) > 0  # the line puts the one-token step at 0.162 s
    assert run(primed=True) == 0
    policy = AutoGamma(8)
    policy.prime(timed_before)
    for _ in range(10):  # drafts that pay keep it drafting
        policy.observe(_event(4, 4, draft=4 * 0.004, verify=2 * 0.081))
    assert policy.next_gamma() >= 4
    assert policy.verify_cost(0) == pytest.approx(2 * 0.058)


def test_a_copy_of_the_target_takes_its_keys_and_values_and_never_reads_a_prompt(target) -> None:
    copy = LlamaForCausalLM(target.config)
    copy.load_state_dict(target.state_dict())
    copy = copy.to(torch.bfloat16).eval()
    assert is_copy_of(copy, target)
    assert not is_copy_of(perturbed_copy(target, 0.1, seed=1), target)
    options = DrafterOptions(kind="model")
    perturbed = perturbed_copy(target, 0.1, seed=1)

    def built(model: torch.nn.Module, **spec: bool) -> Drafter:
        return build_drafter(DrafterSpec(options, **spec), target=target, model=model)

    assert built(copy, copy_of_target=is_copy_of(copy, target)).uses_target_cache
    assert not built(perturbed, copy_of_target=is_copy_of(perturbed, target)).uses_target_cache
    assert not built(copy).uses_target_cache
    assert not built(copy, copy_of_target=True, use_cache=False).uses_target_cache

    fed: list[int] = []
    hook = copy.register_forward_pre_hook(
        lambda module, args, kwargs: fed.append(kwargs["input_ids"].shape[-1]), with_kwargs=True
    )
    try:
        drafter = built(copy, copy_of_target=True)
        drafter.importer.cache_dtype = torch.bfloat16  # cast, whatever this machine measures
        prompt = PROMPTS[0]
        events: list[StepEvent] = []
        result = speculative_generate(
            prompt, drafter, target, gamma=4, max_gen_len=30, on_step=events.append
        )
    finally:
        hook.remove()
    assert result.token_ids == autoregressive_generate(prompt, target, max_gen_len=30).token_ids
    assert events[0].drafts == ()  # the target reads the prompt first
    assert sum(len(event.drafts) for event in events) > 0
    assert fed and set(fed) == {1}  # one token per drafter forward: no prompt, no catch-up
    # what the drafter holds is the target's keys and values, rounded to bfloat16
    reference = new_cache(target)
    forward_logits(target, torch.tensor(prompt + result.token_ids[:-1]), reference, 1, 32)
    held = drafter.runtime.cache
    assert held is not None and cached_length(held) >= len(prompt)
    for mine, theirs in zip(held.layers, reference.layers, strict=True):
        length = mine.keys.shape[-2]
        expected = theirs.keys[:, :, :length].to(torch.bfloat16)
        assert mine.keys.dtype == torch.bfloat16
        assert torch.allclose(
            mine.keys[:, :, : len(prompt)].float(), expected[:, :, : len(prompt)].float(), atol=1e-2
        )


def test_a_copy_without_the_targets_cache_reads_for_itself(target) -> None:
    copy = perturbed_copy(target, 0.1, seed=1)
    drafter = ModelDrafter(copy, copy_of_target=True)
    prompt = PROMPTS[1]
    result = speculative_generate(prompt, drafter, target, gamma=3, max_gen_len=20, use_cache=False)
    assert result.token_ids == autoregressive_generate(prompt, target, max_gen_len=20).token_ids


# -- the interface: what a drafter needs is declared on it ---------------------


class RecordingDrafter(Drafter):
    """Drafts the last token again, recording what `update` was given."""

    name = "recording"

    def __init__(self, *, features: bool = False, cache: bool = False) -> None:
        self.uses_target_features = features
        self.uses_target_cache = cache
        self.given: list[tuple[bool, bool]] = []

    def begin(self, prompt, vocab_size) -> None:
        pass

    def propose(self, sequence, k, processor, generator, min_confidence=0.0):
        return Draft(sequence[-1:].repeat(k), None)

    def update(
        self, sequence, valid_length, target_logits=None, target_features=None, target_cache=None
    ) -> None:
        self.given.append((target_features is not None, target_cache is not None))


@pytest.mark.parametrize(("features", "cache"), [(False, False), (True, False), (False, True)])
def test_the_loop_gives_a_drafter_what_it_declares_and_nothing_else(
    target, references, features, cache
) -> None:
    drafter = RecordingDrafter(features=features, cache=cache)
    result = speculative_generate(PROMPTS[0], drafter, target, gamma=3, max_gen_len=12)
    assert result.token_ids == references[tuple(PROMPTS[0])][:12]
    assert drafter.given and set(drafter.given) == {(features, cache)}


def test_every_drafter_kind_declares_its_needs(target) -> None:
    copy = copy_module.deepcopy(target).to(torch.bfloat16)
    head = tiny_head(target)
    built = {
        kind: build_drafter(
            DrafterSpec(DrafterOptions(kind=kind), copy_of_target=kind == "model"),
            target=target,
            model=copy,
            head=head,
        )
        for kind in ("model", "ngram", "lookup", "hybrid", "head")
    }
    assert all(isinstance(drafter, Drafter) for drafter in built.values())
    declared = {
        kind: (drafter.uses_target_features, drafter.uses_target_cache)
        for kind, drafter in built.items()
    }
    assert declared == {
        "model": (False, True),  # a copy of the target takes its keys and values
        "ngram": (False, False),
        "lookup": (False, False),
        "hybrid": (False, False),  # its model here is not declared a copy
        "head": (True, False),
    }
    # the hooks every drafter has, with defaults for a drafter that keeps nothing
    plain = RecordingDrafter()
    assert plain.offers(torch.tensor([1, 2, 1]), 4) == [Offer("recording", 4)]
    assert plain.features_held() == 0 and plain.forget() is None


def test_a_drafter_missing_part_of_the_interface_cannot_be_made() -> None:
    class NoUpdate(Drafter):
        def begin(self, prompt, vocab_size) -> None:
            pass

        def propose(self, sequence, k, processor, generator, min_confidence=0.0):
            return Draft(sequence[-1:], None)

    with pytest.raises(TypeError, match="update"):
        NoUpdate()


def test_every_drafter_option_has_one_default() -> None:
    from specrepl.chat.settings import Settings

    assert Settings().drafter_options() == DrafterOptions()  # the REPL's defaults are the library's
    assert NgramDrafter().max_order == DrafterOptions().order
    assert LookupDrafter().max_ngram == DrafterOptions().max_ngram
