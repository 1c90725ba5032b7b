"""Numerics of the processors and of verification at the edges: tiny temperatures and
top_p, top_k = 1, half-precision logits with inf and NaN, p and q with zeros.

Nothing may give NaN, divide by zero or draw a token of probability 0; a row with
no finite logit is refused with `UnusableLogitsError`; and the exact properties
(the residual is a distribution, speculative sampling's first token follows p,
top_k = 1 is greedy) still hold.
"""

from __future__ import annotations

import math

import pytest
import torch

from specrepl.chat.settings import Settings
from specrepl.engine.processors import (
    PROCESSORS,
    GreedyProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKProcessor,
    UnusableLogitsError,
    make_processor,
    usable_logits,
)
from specrepl.engine.verification import residual_distribution, verify_greedy, verify_sampling

INF, NAN = math.inf, math.nan
HALF = (torch.float16, torch.bfloat16)
EDGES = (
    {"temperature": 1e-6},
    {"temperature": 1e-300},  # Settings accepts any temperature > 0
    {"top_p": 1e-9},
    {"top_k": 1},
    {"temperature": 100.0, "top_k": 1, "top_p": 1e-9},
)


def broken_logits(dtype: torch.dtype) -> torch.Tensor:
    """Rows as a half-precision model can emit them: overflow, NaN, ties."""
    rows = [
        [1.0, NAN, 3.0, -INF, 2.0, 0.5],
        [INF, 1.0, INF, NAN, -2.0, 60000.0],
        [-INF, -INF, 4.0, -INF, NAN, -INF],
        [7.0, 7.0, 7.0, -1.0, 7.0, -INF],
        [-60000.0, 0.0, 60000.0, 60000.0, 1.0, NAN],
    ]
    return torch.tensor(rows).to(dtype)


def assert_distributions(probs: torch.Tensor) -> None:
    assert probs.dtype == torch.float32
    assert bool(torch.isfinite(probs).all())
    assert bool((probs >= 0).all())
    assert torch.allclose(probs.sum(-1), torch.ones(probs.shape[:-1]))


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("name", list(PROCESSORS))
@pytest.mark.parametrize("edge", [{}, *EDGES])
def test_inf_and_nan_logits_give_distributions_without_impossible_tokens(
    dtype: torch.dtype, name: str, edge: dict
) -> None:
    logits = broken_logits(dtype)
    before = logits.clone()
    probs = make_processor(name, **{"temperature": 0.7, "top_k": 3, "top_p": 0.8, **edge})
    probs = probs.probabilities(logits)
    assert torch.equal(logits.isnan(), before.isnan())
    assert torch.equal(logits.nan_to_num(), before.nan_to_num())  # input untouched
    assert_distributions(probs)
    impossible = logits.isnan() | (logits == -INF)
    assert bool((probs[impossible] == 0).all())
    # +inf (overflow) takes the whole row, shared by the overflowed tokens 0 and 2
    single = (
        name == "greedy"
        or (edge.get("top_k") == 1 and "topk" in name)
        or (edge.get("top_p") == 1e-9 and "nucleus" in name)
    )
    assert probs[1].tolist() == ([1.0, 0, 0, 0, 0, 0] if single else [0.5, 0, 0.5, 0, 0, 0])
    assert probs[2, 2] == 1.0  # the only finite logit
    assert set(probs[4].nonzero().flatten().tolist()) <= {2, 3}  # 60000 above the rest


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("row", [[NAN] * 4, [NAN, INF, -INF, NAN], [-INF] * 4, [INF] * 4])
def test_a_row_without_a_finite_logit_is_refused(dtype: torch.dtype, row: list[float]) -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], row]).to(dtype)
    for name in PROCESSORS:
        with pytest.raises(UnusableLogitsError, match="1 of 2 positions has no finite logit"):
            make_processor(name).probabilities(logits)
    with pytest.raises(UnusableLogitsError):
        verify_greedy(torch.tensor([3]), logits)
    if all(math.isnan(value) for value in row):
        with pytest.raises(UnusableLogitsError, match="all NaN"):
            usable_logits(logits)


@pytest.mark.parametrize("temperature", [1e-6, 1e-30, 1e-300, 5e-324])
def test_a_tiny_temperature_is_the_argmax(temperature: float) -> None:
    assert Settings(temperature=temperature).temperature == temperature
    logits = torch.tensor([[1.0, 2.0, 3.0, 2.9], [50.0, -3.0, 49.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    probs = MultinomialProcessor(temperature=temperature).probabilities(logits)
    assert_distributions(probs)
    assert probs[0].tolist() == [0, 0, 1, 0]
    assert probs[1].tolist() == [1, 0, 0, 0]
    assert probs[2].tolist() == [0.25] * 4  # a tie shares the mass, as in the limit


def test_top_p_near_zero_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 1.0, 0.0, -1.0]])
    probs = NucleusProcessor(temperature=1.0, top_p=1e-9).probabilities(logits)
    assert probs.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]  # a tie goes to the lower id


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_top_k_one_is_greedy_even_with_ties(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 64, generator=generator).mul(3).round().to(dtype)  # many ties
    logits[::7, 5] = INF
    logits[::11, 9] = NAN
    greedy = GreedyProcessor().probabilities(logits)
    for temperature in (1e-6, 1.0, 100.0):
        top_one = TopKProcessor(temperature=temperature, top_k=1).probabilities(logits)
        assert torch.equal(top_one, greedy)
    assert torch.equal(greedy.argmax(-1), verify_greedy_choices(logits))


def verify_greedy_choices(logits: torch.Tensor) -> torch.Tensor:
    """The target's choice at each row, as greedy verification makes it."""
    return torch.tensor(
        [verify_greedy(torch.tensor([], dtype=torch.long), row[None])[1] for row in logits]
    )


def test_top_k_keeps_exactly_k_tokens_when_tied() -> None:
    probs = TopKProcessor(temperature=1.0, top_k=2).probabilities(
        torch.tensor([[1.0, 2.0, 2.0, 2.0]])
    )
    assert probs.tolist() == [[0, 0.5, 0.5, 0]]


def test_greedy_verification_never_chooses_nan() -> None:
    for dtype in (torch.float32, *HALF):
        logits = torch.tensor([[NAN, 1.0, 2.0], [3.0, NAN, -INF], [NAN, 0.0, INF]]).to(dtype)
        accepted, token = verify_greedy(torch.tensor([2, 0]), logits)
        assert (accepted, token) == (2, 2)
        assert verify_greedy(torch.tensor([1, 0]), logits) == (0, 2)


# -- verification: residual and acceptance -------------------------------------


def laws(vocab: int = 6) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(p, q) pairs with zeros, equality and point masses."""
    generator = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(vocab, generator=generator) * 2, -1)
    q = torch.softmax(torch.randn(vocab, generator=generator) * 2, -1)
    p_sparse = TopKProcessor(temperature=1.0, top_k=2).probabilities(torch.log(p))
    q_sparse = TopKProcessor(temperature=1.0, top_k=3).probabilities(torch.log(q))
    one_hot = torch.nn.functional.one_hot(torch.tensor(4), vocab).float()
    return [
        (p, q),
        (p, p),
        (p_sparse, q),
        (p, q_sparse),
        (p_sparse, q_sparse),
        (p, one_hot),
        (one_hot, one_hot),
        (p_sparse, one_hot),
    ]


@pytest.mark.parametrize("index", range(8))
def test_the_residual_is_a_distribution_inside_the_support_of_p(index: int) -> None:
    p, q = laws()[index]
    residual = residual_distribution(p, q)
    assert_distributions(residual)
    assert bool((residual[p == 0] == 0).all())
    if torch.equal(p, q):
        assert torch.equal(residual, p)  # nothing left: p itself, never 0 / 0


@pytest.mark.parametrize("index", range(8))
def test_the_first_token_follows_p_exactly(index: int) -> None:
    """q(x) min(1, p(x)/q(x)) + P(reject) residual(x) = p(x), for every x."""
    p, q = laws()[index]
    kept = torch.minimum(p, q)
    law = kept + (1 - kept.sum()) * residual_distribution(p, q)
    assert torch.allclose(law, p, atol=1e-6)


def test_a_draft_the_drafter_gave_probability_zero_is_kept_iff_p_is_positive() -> None:
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    q = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    for seed in range(50):
        generator = torch.Generator().manual_seed(seed)
        accepted, token = verify_sampling(torch.tensor([1]), q, p, generator)
        assert accepted == 1  # q(1) = 0 < p(1): kept, with no p / q
        accepted, token = verify_sampling(torch.tensor([0]), q, p, generator)
        assert (accepted, token) == (0, 1)  # p(0) = 0: refused; the residual is on 1


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_sampled_tokens_always_have_positive_probability(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(11)
    logits = broken_logits(dtype)
    for name in PROCESSORS:
        for edge in ({}, *EDGES):
            processor = make_processor(name, **{"temperature": 1.3, "top_k": 2, **edge})
            probs = processor.probabilities(logits)
            for _ in range(20):
                tokens = processor.sample(probs, generator)
                assert bool((probs.gather(-1, tokens[:, None]) > 0).all())


def test_speculative_sampling_accepts_and_corrects_with_the_exact_law() -> None:
    """Monte Carlo over verify_sampling itself: the emitted token follows p."""
    p, q = laws()[3]  # q has zeros where p has mass
    generator = torch.Generator().manual_seed(5)
    trials = 8000
    drafts = torch.multinomial(q, trials, replacement=True, generator=generator)
    counts = torch.zeros_like(p)
    for draft in drafts:
        accepted, token = verify_sampling(draft[None], q[None], torch.stack((p, p)), generator)
        counts[int(draft) if accepted else token] += 1
    assert 0.5 * float((counts / trials - p).abs().sum()) < 0.03
