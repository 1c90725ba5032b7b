"""Grouped key/value heads kept grouped in passes of several tokens: the same
attention as transformers' `sdpa`, chosen by timing, recorded in the tuning
(the model keeps its own), and the speculative output stays the target's."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specrepl.engine import grouped_attention
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.kv_cache import new_cache
from specrepl.engine.tuning import Tuning
from specrepl.models import tuning as model_tuning
from specrepl.models.loaded import LoadedModel
from specrepl.models.pair import ModelPair
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

GROUPED = grouped_attention.GROUPED_ATTENTION
PROMPTS = ([1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30], [1, 5, 9, 12], [6, 7, 6, 7, 6, 7])


def _grouped_model(seed: int = 0) -> torch.nn.Module:
    model = tiny_llama(32, seed=seed)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return model


def _layer(model) -> torch.nn.Module:
    return next(m for m in model.modules() if hasattr(m, "num_key_value_groups"))


@pytest.mark.parametrize("width", [1, 2, 7])
def test_grouped_heads_give_the_numbers_of_repeated_heads(width) -> None:
    """One layer, a masked pass of `width` tokens over 20 cached positions: the
    grouped attention equals transformers' `sdpa` (which repeats the heads)."""
    model = _grouped_model()
    layer = _layer(model)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, heads, width, layer.head_dim, generator=generator)
    keys = torch.randn(1, kv_heads, 20 + width, layer.head_dim, generator=generator)
    values = torch.randn(1, kv_heads, 20 + width, layer.head_dim, generator=generator)
    mask = torch.ones(width, 20 + width, dtype=torch.bool).tril(20)[None, None]
    grouped, _ = grouped_attention._grouped_attention(layer, query, keys, values, mask)
    stock, _ = sdpa_attention_forward(layer, query, keys, values, mask)
    assert grouped.shape == stock.shape == (1, width, heads, layer.head_dim)
    torch.testing.assert_close(grouped, stock, rtol=1e-6, atol=1e-6)


def test_a_model_attending_grouped_gives_the_same_logits_after_a_cache() -> None:
    """The whole model: a prompt, then masked passes of several tokens onto the
    kept cache, with `sdpa` and with the grouped attention."""
    model = _grouped_model()
    tokens = torch.tensor([[1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30, 5, 9, 12, 6, 7]])

    def logits() -> list[torch.Tensor]:
        cache = new_cache(model)
        out = [model(input_ids=tokens[:, :6], past_key_values=cache, use_cache=True).logits]
        out.append(model(input_ids=tokens[:, 6:11], past_key_values=cache, use_cache=True).logits)
        out.append(model(input_ids=tokens[:, 11:], past_key_values=cache, use_cache=True).logits)
        return out

    with torch.no_grad():
        stock = logits()
        model.set_attn_implementation(GROUPED)
        grouped = logits()
    for a, b in zip(stock, grouped, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("gamma", [2, 6])
@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_greedy_speculative_with_the_target_attending_grouped_is_the_target(
    gamma, drafter_kind
) -> None:
    target = _grouped_model()
    reference = [autoregressive_generate(p, target, max_gen_len=40).token_ids for p in PROMPTS]
    tuning = Tuning(attention=GROUPED)  # the target's passes attend grouped
    if drafter_kind == "model":
        drafter_model = perturbed_copy(target, 0.02, seed=3)
        drafter = ModelDrafter(drafter_model, tuning=Tuning(attention=GROUPED))
    else:
        drafter = NgramDrafter(3)
    accepted = 0
    for prompt, expected in zip(PROMPTS, reference, strict=True):
        result = speculative_generate(
            prompt, drafter, target, gamma=gamma, max_gen_len=40, tuning=tuning
        )
        assert result.token_ids == expected
        tuned = autoregressive_generate(prompt, target, max_gen_len=40, tuning=tuning)
        assert tuned.token_ids == expected
        accepted += result.accepted
    assert target.config._attn_implementation == "sdpa"
    if drafter_kind == "model":
        assert accepted > 0


def test_the_timing_compares_repeated_and_grouped_heads_on_this_machine() -> None:
    costs = grouped_attention.measure_grouped_attention(
        _grouped_model(), width=4, context=64, repeats=2
    )
    assert set(costs) == {"repeated", "grouped"} and min(costs.values()) > 0


def test_a_model_without_grouped_heads_is_neither_timed_nor_switched() -> None:
    model = tiny_llama(32, seed=0)
    model.config.num_key_value_heads = model.config.num_attention_heads
    for layer in model.modules():
        if hasattr(layer, "num_key_value_groups"):
            layer.num_key_value_groups = 1
    assert grouped_attention.measure_grouped_attention(model) == {}
    assert not grouped_attention.can_group_attention(model)
    tuning = Tuning()
    assert not model_tuning.choose_grouped_attention(model, tuning)
    assert tuning == Tuning() and model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("grouped_cheaper", [True, False])
def test_the_pair_switches_each_model_where_grouped_measured_cheaper(
    monkeypatch, grouped_cheaper
) -> None:
    timed: list[torch.nn.Module] = []

    def measure(model):
        timed.append(model)
        cheap, dear = 1e-4, 2e-4
        if grouped_cheaper:
            return {"repeated": dear, "grouped": cheap}
        return {"repeated": cheap, "grouped": dear}

    monkeypatch.setattr(model_tuning, "measure_grouped_attention", measure)
    target, drafter = _grouped_model(0), _grouped_model(1)
    pair = ModelPair.from_models(target, drafter, tiny_tokenizer(32))
    assert timed == [target, drafter]  # once each, when the pair is put together
    assert pair.drafter is not None
    for loaded in (pair.target, pair.drafter):
        expected = GROUPED if grouped_cheaper else None
        assert loaded.tuning.attention == expected
        assert loaded.model.config._attn_implementation == "sdpa"  # the model's own
    # put together again (e.g. another drafter): what was chosen is not timed again
    other = LoadedModel.wrap(_grouped_model(2), name="other", kind="memory")
    again = ModelPair.assemble(pair.target, other, tiny_tokenizer(32), None)
    assert len(timed) == (3 if grouped_cheaper else 4)
    assert again.target.tuning.attention == (GROUPED if grouped_cheaper else None)


def test_the_grouped_choice_is_recorded_and_taken_for_a_pass_only(monkeypatch) -> None:
    monkeypatch.setattr(
        model_tuning,
        "measure_grouped_attention",
        lambda model: {"repeated": 2e-4, "grouped": 1e-4},
    )
    model = _grouped_model()
    tuning = Tuning()
    assert model_tuning.choose_grouped_attention(model, tuning)
    assert tuning.attention == GROUPED and not tuning.attends_in_cache_dtype
    assert model_tuning.choose_grouped_attention(model, tuning)  # chosen: not timed again
    assert model.config._attn_implementation == "sdpa"
    with tuning.running(model):
        assert model.config._attn_implementation == GROUPED
    assert model.config._attn_implementation == "sdpa"


def test_a_copy_attending_in_its_cache_dtype_keeps_that_attention(monkeypatch) -> None:
    """The copy's own timed choice comes first; grouped heads do not replace it."""
    monkeypatch.setattr(
        model_tuning,
        "measure_grouped_attention",
        lambda model: {"repeated": 2e-4, "grouped": 1e-4},
    )
    copy = _grouped_model().to(torch.bfloat16)
    tuning = Tuning()
    assert model_tuning.attend_in_cache_dtype(copy, tuning)
    assert not model_tuning.choose_grouped_attention(copy, tuning)
    assert tuning.attends_in_cache_dtype
