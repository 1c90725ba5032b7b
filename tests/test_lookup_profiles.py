"""Prompt lookup's offers carry the length of their match, and the gamma
policy keeps acceptance by it: a long match's copy is rated by what long
matches have done, a short one's by what short ones have."""

from __future__ import annotations

import pytest
import torch

from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LONGEST_MATCH, LookupDrafter, match_profile
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.gamma import AutoGamma, FixedGamma
from specrepl.engine.results import Offer, StepEvent
from specrepl.engine.step_estimates import StepEstimates


def test_match_classes_are_powers_of_two() -> None:
    assert [match_profile(n) for n in (1, 2, 3, 4, 7, 8, 15)] == [
        "match 1",
        "match 2-3",
        "match 2-3",
        "match 4-7",
        "match 4-7",
        "match 8-15",
        "match 8-15",
    ]
    assert match_profile(LONGEST_MATCH) == match_profile(LONGEST_MATCH + 40) == "match 16+"


def test_lookup_measures_how_far_its_match_reaches_back() -> None:
    lookup = LookupDrafter(3, 2)
    # the last 3 tokens (3, 4, 5) stood at 2..4, followed by 9; before them 2 and 1,
    # before the context's last 3 tokens 2 and 9: the match is 4 tokens long
    found = lookup.find(torch.tensor([1, 2, 3, 4, 5, 9, 2, 3, 4, 5]), 4)
    assert found.tokens.tolist() == [9, 2, 3, 4] and found.length == 4
    (offer,) = lookup.offers(torch.tensor([1, 2, 3, 4, 5, 9, 2, 3, 4, 5]), 4)
    assert offer == Offer("lookup", 4, tokens=(9, 2, 3, 4), profile="match 4-7")
    # a span repeated whole: the match reaches the measured limit
    span = list(range(10, 10 + LONGEST_MATCH + 5))
    found = lookup.find(torch.tensor([*span, 99, *span]), 3)
    assert found.tokens.tolist() == [99, *span[:2]] and found.length == LONGEST_MATCH
    # no match: no tokens, no profile
    missing = lookup.find(torch.tensor([1, 2, 3, 4]), 3)
    assert missing.length == 0 and missing.profile == "" and len(missing.tokens) == 0
    assert lookup.offers(torch.tensor([1, 2, 3, 4]), 3) == [Offer("lookup", 0, tokens=())]


def test_the_hybrid_offers_lookup_with_its_match_class() -> None:
    hybrid = HybridDrafter(NgramDrafter(2), LookupDrafter(3), min_match=2)
    sequence = torch.tensor([7, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5])
    hybrid.begin(sequence, 16)
    offers = hybrid.offers(sequence, 3)
    assert [offer.source for offer in offers] == ["ngram", "lookup"]
    assert offers[1].tokens == (6, 1, 2) and offers[1].profile == "match 4-7"
    assert hybrid.propose_source("lookup", sequence, 2, None, None).tokens.tolist() == [6, 1]


def _lookup_step(drafts: int, accepted: int) -> StepEvent:
    return StepEvent(
        drafts=tuple(range(drafts)),
        accepted=accepted,
        appended=tuple(range(accepted + 1)),
        draft_seconds=0.0,
        target_seconds=0.1,
        seconds_since_start=0.0,
        requested_gamma=drafts,
        source="lookup",
    )


# what the target keeps in these tests is 0, 1, 2, ...: a long match's copy is
# right, a short one's wrong
LONG = Offer("lookup", 8, tokens=tuple(range(8)), profile="match 16+")
SHORT = Offer("lookup", 8, tokens=(9,) * 8, profile="match 2-3")


def test_acceptance_is_kept_per_profile_with_the_source_as_its_prior() -> None:
    estimates = StepEstimates(8)
    for index in range(40):  # long matches copied right, short ones wrong
        offer = LONG if index % 2 else SHORT
        estimates.offers = (offer,)
        estimates.observe(_lookup_step(8, 8 if offer is LONG else 0))
    assert estimates.position_acceptance(LONG)[0] > 0.9
    assert estimates.position_acceptance(SHORT)[0] < 0.1
    assert estimates.expected_tokens(LONG, 8) > 7 > 1.2 > estimates.expected_tokens(SHORT, 8)
    # the source as a whole: half right
    pooled = estimates.source("lookup").position_acceptance()[0]
    assert 0.3 < pooled < 0.7
    # a profile never seen is rated as its source
    unseen = Offer("lookup", 8, profile="match 8-15")
    assert estimates.position_acceptance(unseen) == pytest.approx(
        estimates.source("lookup").position_acceptance()
    )
    assert estimates.expected_tokens(Offer("lookup", 8), 8) == pytest.approx(
        estimates.source("lookup").expected_tokens(8)
    )


def test_an_unused_offer_is_scored_under_its_profile() -> None:
    estimates = StepEstimates(4)
    for _ in range(20):
        wrong = Offer("lookup", 3, tokens=(5, 6, 7), profile="match 2-3")
        right = Offer("lookup", 3, tokens=(0, 1, 2), profile="match 8-15")
        for offer in (wrong, right):
            estimates.offers = (Offer("model", 4), offer)
            estimates.observe(
                StepEvent(
                    drafts=(0, 1, 2, 3),
                    accepted=4,
                    appended=(0, 1, 2, 3, 4),
                    draft_seconds=0.04,
                    target_seconds=0.1,
                    seconds_since_start=0.0,
                    source="model",
                )
            )
    assert estimates.position_acceptance(wrong)[0] < 0.1
    assert estimates.position_acceptance(right)[:3] == pytest.approx([1.0] * 3, abs=0.1)


def test_auto_copies_after_long_matches_and_leaves_short_ones_to_the_model() -> None:
    """The chat's later turns: lookup's long matches (a pasted text quoted)
    were right, its short ones (common phrases) wrong; the model drafts well."""
    policy = AutoGamma(8)
    policy.prime({k: 0.04 + 0.01 * k for k in range(9)})
    model = Offer("model", 8, unread=1)
    for index in range(60):
        lookup = LONG if index % 3 == 0 else SHORT
        choice = policy.choose([model, lookup])
        if choice.source == "lookup":
            accepted = choice.gamma if lookup is LONG else 0
        else:
            accepted = min(choice.gamma, 3)
        policy.observe(
            StepEvent(
                drafts=tuple(range(choice.gamma)),
                accepted=accepted,
                appended=tuple(range(accepted + 1)),
                draft_seconds=0.01 * choice.gamma if choice.source == "model" else 0.0,
                target_seconds=0.04 + 0.01 * choice.gamma,
                seconds_since_start=0.0,
                requested_gamma=choice.gamma,
                source=choice.source if choice.gamma else "",
                read_seconds=0.01 if choice.source == "model" else 0.0,
                read_tokens=1 if choice.source == "model" else 0,
            )
        )
    long_choice = policy.choose([model, LONG])
    short_choice = policy.choose([model, SHORT])
    assert long_choice.source == "lookup" and long_choice.gamma == 8
    assert "lookup[match 16+]:8" in long_choice.reason
    assert short_choice.source == "model"
    assert "lookup[match 2-3]" in short_choice.reason


def test_a_fixed_gamma_chooses_by_the_profiles_too() -> None:
    policy = FixedGamma(4)
    model = Offer("model", 4)
    for index in range(30):
        lookup = LONG if index % 2 else SHORT
        policy.estimates.offers = (model, lookup)
        policy.observe(_lookup_step(4, 4 if lookup is LONG else 0))
    assert policy.choose([model, LONG]).source == "lookup"
    assert policy.choose([model, SHORT]).source == "model"
