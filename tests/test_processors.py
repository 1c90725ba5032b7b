"""Logits processors: correct distributions, validated parameters, inputs untouched."""

from __future__ import annotations

import math

import pytest
import torch

from specrepl.engine.processors import (
    PROCESSORS,
    GreedyProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
    UnusableLogitsError,
    make_processor,
)

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize("name", list(PROCESSORS))
def test_rows_are_distributions_and_input_is_untouched(name: str) -> None:
    logits = LOGITS.clone()
    probs = make_processor(name, temperature=0.7, top_k=3, top_p=0.8).probabilities(logits)
    assert torch.equal(logits, LOGITS)
    assert probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(2))
    assert bool((probs >= 0).all())


def test_greedy_is_a_point_mass_on_the_argmax() -> None:
    probs = GreedyProcessor().probabilities(LOGITS)
    assert probs[0].tolist() == [0, 0, 0, 0, 1]
    assert GreedyProcessor().sample(probs).tolist() == [4, 0]


def test_temperature_scales_the_logits() -> None:
    probs = MultinomialProcessor(temperature=2.0).probabilities(LOGITS[:1])
    assert torch.allclose(probs, torch.softmax(LOGITS[:1] / 2.0, -1))


def test_top_k_keeps_k_tokens() -> None:
    probs = TopKProcessor(temperature=1.0, top_k=2).probabilities(LOGITS[:1])
    assert (probs[0] > 0).nonzero().flatten().tolist() == [0, 4]
    expected = torch.softmax(torch.tensor([2.0, 3.0]), -1)
    assert torch.allclose(probs[0, [0, 4]], expected)


def test_nucleus_keeps_the_smallest_set_reaching_top_p() -> None:
    full = torch.softmax(LOGITS[0], -1)  # sorted: 4 (0.61), 0 (0.22), 1 (0.08), ...
    probs = NucleusProcessor(temperature=1.0, top_p=0.7).probabilities(LOGITS[:1])
    assert (probs[0] > 0).nonzero().flatten().tolist() == [0, 4]
    assert torch.allclose(probs[0, [0, 4]], full[[0, 4]] / full[[0, 4]].sum())
    tiny = NucleusProcessor(temperature=1.0, top_p=1e-9).probabilities(LOGITS[:1])
    assert tiny[0].tolist() == [0, 0, 0, 0, 1]  # the most likely token always stays


def test_top_k_then_nucleus() -> None:
    probs = TopKNucleusProcessor(temperature=1.0, top_k=3, top_p=0.95).probabilities(LOGITS[:1])
    assert (probs[0] > 0).nonzero().flatten().tolist() == [0, 1, 4]


def test_non_finite_logits_never_give_nan() -> None:
    logits = torch.tensor([[1.0, math.nan, 2.0]])
    for name in PROCESSORS:
        processor = make_processor(name, top_k=2, top_p=0.5)
        probs = processor.probabilities(logits)
        assert not bool(probs.isnan().any()), name
        assert torch.allclose(probs.sum(-1), torch.ones(1)), name
        assert probs[0, 1] == 0, name
        with pytest.raises(UnusableLogitsError, match="no finite logit"):
            processor.probabilities(torch.full((1, 3), math.nan))


def test_sampling_uses_the_explicit_generator() -> None:
    probs = MultinomialProcessor().probabilities(torch.zeros(1, 50))
    first = MultinomialProcessor().sample(probs, torch.Generator().manual_seed(7))
    again = MultinomialProcessor().sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)


@pytest.mark.parametrize(
    ("name", "kwargs", "message"),
    [
        ("multinomial", {"temperature": 0}, "temperature"),
        ("multinomial", {"temperature": -1}, "temperature"),
        ("multinomial", {"temperature": math.inf}, "temperature"),
        ("topk", {"top_k": 0}, "top_k"),
        ("topk", {"top_k": 2.5}, "top_k"),
        ("nucleus", {"top_p": 0}, "top_p"),
        ("nucleus", {"top_p": 1.5}, "top_p"),
        ("beam", {}, "unknown processor"),
    ],
)
def test_bad_parameters_are_refused(name: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_processor(name, **kwargs)


def test_processor_specs_name_each_class_and_its_parameters() -> None:
    """The torch-free declaration (processor_specs.py) and the classes agree."""
    from dataclasses import fields

    from specrepl.engine.processor_specs import PROCESSOR_PARAMETERS, describe_processor

    assert tuple(PROCESSORS) == tuple(PROCESSOR_PARAMETERS)
    for name, cls in PROCESSORS.items():
        assert tuple(f.name for f in fields(cls)) == PROCESSOR_PARAMETERS[name]
        processor = cls()
        assert tuple(processor.parameters()) == PROCESSOR_PARAMETERS[name]
        assert processor.describe() == describe_processor(name, processor.parameters())
