"""A copy of the target attending in the dtype of the target's keys and values:
chosen by the loader, recorded in the copy's tuning (the copy keeps its own
attention outside its passes), and the output stays the target's."""

from __future__ import annotations

import copy as copy_module

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specrepl.engine import copy_attention
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.results import StepEvent
from specrepl.engine.tuning import Tuning
from specrepl.models import tuning as model_tuning
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_llama, tiny_tokenizer

PROMPTS = ([1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30], [1, 5, 9, 12], [6, 7, 6, 7, 6, 7])


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=0)


@pytest.fixture(autouse=True)
def grouped_never_cheaper(monkeypatch) -> None:
    """These tests are about the copy's attention: the pair's other timed choice
    (grouped heads, tests/test_grouped_attention.py) finds nothing cheaper."""
    monkeypatch.setattr(model_tuning, "measure_grouped_attention", lambda model: {})


def _bf16_copy(target) -> LlamaForCausalLM:
    """The target's weights in bfloat16, with a config of its own."""
    copy = LlamaForCausalLM(copy_module.deepcopy(target.config))
    copy.load_state_dict(target.state_dict())
    return copy.to(torch.bfloat16).eval()


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_a_bf16_copy_attending_in_either_dtype_keeps_the_target_output(
    target, cache_dtype, gamma
) -> None:
    """The copy keeps the target's float32 keys and values uncast and attends in
    float32 (its tuning says so), or casts them to bfloat16: the output is the
    target's either way."""
    copy = _bf16_copy(target)
    tuning = Tuning()
    if cache_dtype == torch.float32:
        assert model_tuning.attend_in_cache_dtype(copy, tuning)
    drafter = ModelDrafter(copy, copy_of_target=True, tuning=tuning)
    events: list[StepEvent] = []
    for prompt in PROMPTS:
        result = speculative_generate(
            prompt, drafter, target, gamma=gamma, max_gen_len=40, on_step=events.append
        )
        assert result.token_ids == autoregressive_generate(prompt, target, max_gen_len=40).token_ids
        held = drafter.runtime.cache
        assert held is not None
        assert {layer.keys.dtype for layer in held.layers} == {cache_dtype}
    assert sum(event.accepted for event in events) > 0


@pytest.mark.parametrize("cheaper", [torch.float32, torch.bfloat16])
def test_the_pair_gives_the_copy_the_attention_measured_cheaper_here(
    target, monkeypatch, cheaper
) -> None:
    dearer = torch.bfloat16 if cheaper == torch.float32 else torch.float32
    measured: list[torch.dtype] = []

    def measure(model, cache_dtype):
        measured.append(cache_dtype)
        return {cheaper: 1e-4, dearer: 2e-4}

    monkeypatch.setattr(model_tuning, "measure_attention", measure)
    copy = _bf16_copy(target)
    pair = ModelPair.from_models(target, copy, tiny_tokenizer(32))
    assert pair.drafter_is_copy and pair.drafter is not None
    assert measured == [torch.float32]  # once, when the pair is put together
    tuning = pair.drafter.tuning
    assert tuning.attends_in_cache_dtype == (cheaper == torch.float32)
    assert copy.config._attn_implementation == "sdpa"  # the model's own: chosen for its passes
    drafter = ModelDrafter(copy, copy_of_target=True, tuning=tuning)
    for prompt in PROMPTS:
        speculative_generate(prompt, drafter, target, gamma=4, max_gen_len=12)
    assert measured == [torch.float32]  # the drafter measures nothing
    assert drafter.importer.cache_dtype == cheaper
    assert drafter.runtime.cache is not None
    assert drafter.runtime.cache.layers[0].keys.dtype == cheaper


def test_a_copy_in_the_targets_dtype_is_not_measured(target, monkeypatch) -> None:
    def measure(model, cache_dtype):
        raise AssertionError("measured")

    monkeypatch.setattr(model_tuning, "measure_attention", measure)
    copy = copy_module.deepcopy(target)
    pair = ModelPair.from_models(target, copy, tiny_tokenizer(32))
    assert pair.drafter_is_copy and pair.drafter is not None
    assert pair.drafter.tuning == Tuning()
    assert copy.config._attn_implementation == "sdpa"


def test_the_attention_choice_is_recorded_and_taken_for_a_pass_only(target) -> None:
    copy = _bf16_copy(target)
    tuning = Tuning()
    assert model_tuning.attend_in_cache_dtype(copy, tuning)
    assert tuning.attention == copy_attention.ATTENTION and tuning.attends_in_cache_dtype
    assert copy.config._attn_implementation == "sdpa"
    with tuning.running(copy):
        assert copy.config._attn_implementation == copy_attention.ATTENTION
    assert copy.config._attn_implementation == "sdpa"
    copy.config._attn_implementation = "eager"  # another implementation: not chosen
    assert not model_tuning.attend_in_cache_dtype(copy, Tuning())
    assert copy.config._attn_implementation == "eager"


def test_attention_in_the_cache_dtype_is_sdpa_in_that_dtype(target) -> None:
    module = next(m for m in target.modules() if hasattr(m, "num_key_value_groups"))
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads = target.config.num_attention_heads, target.config.num_key_value_heads
    query = torch.randn(1, heads, 3, module.head_dim, generator=generator)
    keys = torch.randn(1, kv_heads, 9, module.head_dim, generator=generator)
    values = torch.randn(1, kv_heads, 9, module.head_dim, generator=generator)
    attend = copy_attention._attention_in_cache_dtype
    same, _ = attend(module, query.bfloat16(), keys.bfloat16(), values.bfloat16(), None)
    stock, _ = sdpa_attention_forward(
        module, query.bfloat16(), keys.bfloat16(), values.bfloat16(), None
    )
    assert torch.equal(same, stock)
    upcast, _ = attend(module, query.bfloat16(), keys, values, None)
    in_float32, _ = sdpa_attention_forward(module, query.bfloat16().float(), keys, values, None)
    assert upcast.dtype == torch.bfloat16
    assert torch.equal(upcast, in_float32.bfloat16())
    costs = copy_attention.measure_attention(_bf16_copy(target), torch.float32, repeats=2)
    assert set(costs) == {torch.bfloat16, torch.float32} and min(costs.values()) > 0
