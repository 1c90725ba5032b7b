"""Speculative sampling is lossless: its samples follow the target's exact law.

The exact joint law of the next three tokens is enumerated under a tiny target
(vocabulary 8), a few thousand seeded speculative generations are drawn, and a
chi-square test and the total variation distance compare the two. A negative
control (resampling from p instead of the residual norm(max(0, p - q))) must fail.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy import stats

import specrepl.engine.verification as verification
from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.generation import speculative_generate
from specrepl.engine.processors import (
    LogitsProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)
from specrepl.testing import perturbed_copy, tiny_llama

VOCAB = 8
LENGTH = 3
PROMPT = [1, 2, 3, 1, 2]  # repeats, so the n-gram and lookup drafters find matches
SAMPLES = 2500
# With this target and 2500 samples, sampling noise alone gives a total
# variation of about 0.05; the negative control gives far more.


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(VOCAB, seed=0)


@pytest.fixture(scope="module")
def drafter(target: torch.nn.Module) -> torch.nn.Module:
    return perturbed_copy(target, 0.3, seed=1)  # accepts about half of its drafts


class RepeatLastDrafter(Drafter):
    """A deterministic drafter (point-mass q): proposes the last token again."""

    name = "repeat"
    width = None

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        pass

    def propose(self, sequence, k, processor, generator, min_confidence=0.0) -> Draft:
        return Draft(sequence[-1:].repeat(k), None)

    def update(self, sequence, valid_length, target_logits=None) -> None:
        pass


@torch.no_grad()
def exact_law(model: torch.nn.Module, processor: LogitsProcessor) -> dict[tuple[int, ...], float]:
    """P(x1, x2, x3 | PROMPT) under the target and the processor, by enumeration."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(LENGTH):
        prefixes = list(law)
        batch = torch.tensor([PROMPT + list(prefix) for prefix in prefixes])
        probs = processor.probabilities(model(input_ids=batch).logits[:, -1, :])
        law = {
            (*prefix, token): law[prefix] * float(probs[row, token])
            for row, prefix in enumerate(prefixes)
            for token in range(VOCAB)
        }
    return law


def sample_counts(target, drafter, processor, gamma, use_cache=True, seed=0):
    """Draw SAMPLES generations (the same drafter object throughout)."""
    generator = torch.Generator().manual_seed(seed)
    counts: dict[tuple[int, ...], int] = {}
    accepted = drafted = 0
    for _ in range(SAMPLES):
        result = speculative_generate(
            PROMPT,
            drafter,
            target,
            logits_processor=processor,
            gamma=gamma,
            max_gen_len=LENGTH,
            use_cache=use_cache,
            generator=generator,
        )
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
        accepted += result.accepted
        drafted += result.drafted
    return counts, accepted / max(drafted, 1)


def compare(law, counts) -> tuple[float, float]:
    """(chi-square p-value with bins of expected count < 5 pooled, total variation)."""
    observed, expected = [], []
    pooled_observed = pooled_expected = 0.0
    for outcome in itertools.product(range(VOCAB), repeat=LENGTH):
        e = law[outcome] * SAMPLES
        o = counts.get(outcome, 0)
        if e < 5:
            pooled_observed += o
            pooled_expected += e
        else:
            observed.append(o)
            expected.append(e)
    if pooled_expected > 0:
        observed.append(pooled_observed)
        expected.append(pooled_expected)
    scale = sum(observed) / sum(expected)
    p_value = stats.chisquare(observed, [e * scale for e in expected]).pvalue
    total_variation = 0.5 * sum(
        abs(counts.get(outcome, 0) / SAMPLES - law[outcome]) for outcome in law
    )
    return float(p_value), total_variation


CASES = {
    "multinomial-gamma2": (MultinomialProcessor(1.0), 2, True),
    "multinomial-gamma1-nocache": (MultinomialProcessor(1.0), 1, False),
    "topk": (TopKProcessor(temperature=0.8, top_k=4), 3, True),
    "nucleus": (NucleusProcessor(temperature=1.2, top_p=0.8), 2, True),
    "topknucleus": (TopKNucleusProcessor(temperature=1.0, top_k=5, top_p=0.9), 2, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_model_drafter_sampling_is_lossless(target, drafter, case) -> None:
    processor, gamma, use_cache = CASES[case]
    counts, acceptance = sample_counts(target, drafter, processor, gamma, use_cache)
    p_value, total_variation = compare(exact_law(target, processor), counts)
    assert 0.05 < acceptance < 0.95, "the drafter must be rejected sometimes for this to test much"
    assert p_value > 1e-3, (p_value, total_variation)
    assert total_variation < 0.09, (p_value, total_variation)


DETERMINISTIC = {
    "repeat-last": RepeatLastDrafter,
    "ngram": lambda: NgramDrafter(3),
    "ngram-kept": lambda: NgramDrafter(3, keep_between_prompts=True),
    "ngram-filler": lambda: NgramDrafter(3, top_k_filler=4),
    "lookup": lambda: LookupDrafter(2),
}


@pytest.mark.parametrize("kind", list(DETERMINISTIC))
def test_deterministic_drafter_sampling_is_lossless(target, kind) -> None:
    """Point-mass drafters (q one-hot) keep the target's law."""
    processor = MultinomialProcessor(1.0)
    counts, acceptance = sample_counts(target, DETERMINISTIC[kind](), processor, gamma=2)
    p_value, total_variation = compare(exact_law(target, processor), counts)
    assert 0.05 < acceptance < 0.95
    assert p_value > 1e-3 and total_variation < 0.09, (p_value, total_variation)


MIXED = {
    # lookup where the context repeats, the model elsewhere: q switches kind mid-run
    "hybrid": lambda model: HybridDrafter(ModelDrafter(model), LookupDrafter(2), min_match=1),
    # the drafter reads only the last 2 prompt tokens
    "model-window": lambda model: ModelDrafter(model, window=2),
    # the drafter takes the target's keys and values instead of reading for itself
    "model-copy": lambda model: ModelDrafter(model, copy_of_target=True),
    "hybrid-copy": lambda model: HybridDrafter(
        ModelDrafter(model, copy_of_target=True), LookupDrafter(2), min_match=1
    ),
}


@pytest.fixture(scope="module")
def head(target: torch.nn.Module) -> DraftHead:
    """An untrained head over 6 of the 8 tokens: q is zero on the other two,
    where p is not, so the residual must supply them."""
    torch.manual_seed(3)
    return DraftHead.for_target(target, torch.tensor([0, 1, 2, 4, 5, 7])).eval()


@pytest.fixture(scope="module")
def fused_head(target: torch.nn.Module) -> DraftHead:
    """The same, reading the target's layer 1 besides its final hidden state (EAGLE-3)."""
    torch.manual_seed(3)
    return DraftHead.for_target(target, torch.tensor([0, 1, 2, 4, 5, 7]), fused_layers=(1,)).eval()


HEADS = {
    "head": lambda head: HeadDrafter(head),
    "hybrid-head": lambda head: HybridDrafter(HeadDrafter(head), LookupDrafter(2), min_match=1),
}


@pytest.mark.parametrize(
    "case", ["head-topk", "head-nocache", "hybrid-head", "fused-topk", "hybrid-fused"]
)
def test_draft_head_sampling_is_lossless(target, head, fused_head, case) -> None:
    processor = (
        TopKProcessor(temperature=0.8, top_k=4)
        if case != "head-nocache"
        else (MultinomialProcessor(1.0))
    )
    chosen = fused_head if case.endswith("fused") or case.startswith("fused") else head
    drafter = HEADS["hybrid-head" if case.startswith("hybrid") else "head"](chosen)
    counts, acceptance = sample_counts(
        target, drafter, processor, gamma=2, use_cache=case != "head-nocache"
    )
    p_value, total_variation = compare(exact_law(target, processor), counts)
    assert 0.05 < acceptance < 0.95
    assert p_value > 1e-3 and total_variation < 0.09, (p_value, total_variation)


@pytest.mark.parametrize("kind", list(MIXED))
def test_mixed_and_windowed_drafters_sampling_is_lossless(target, drafter, kind) -> None:
    processor = TopKProcessor(temperature=0.8, top_k=4)
    counts, acceptance = sample_counts(target, MIXED[kind](drafter), processor, gamma=2)
    p_value, total_variation = compare(exact_law(target, processor), counts)
    assert 0.05 < acceptance < 0.95
    assert p_value > 1e-3 and total_variation < 0.09, (p_value, total_variation)


def test_negative_control_resampling_from_p_is_detected(target, drafter, monkeypatch) -> None:
    """A sampler that resamples from p after a rejection is biased; the test must see it."""
    monkeypatch.setattr(verification, "residual_distribution", lambda p, q: p)
    processor = MultinomialProcessor(1.0)
    counts, _ = sample_counts(target, drafter, processor, gamma=2)
    p_value, total_variation = compare(exact_law(target, processor), counts)
    assert p_value < 1e-6, (p_value, total_variation)
