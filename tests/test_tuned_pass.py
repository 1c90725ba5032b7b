"""A model's tuning is specrepl's own business: the model is the stock model
outside specrepl's passes (after loading, tuning, a pass, a failed or
interrupted pass), and a tuned pass gives the stock logits in its own forms."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from specrepl.engine import widths
from specrepl.engine.copy_attention import ATTENTION
from specrepl.engine.forward import forward_logits
from specrepl.engine.grouped_attention import GROUPED_ATTENTION
from specrepl.engine.linear_forms import FormChoosingLinear, packing_works
from specrepl.engine.tuning import Tuning
from specrepl.engine.width_plan import WidthPlan
from specrepl.models import tuning as model_tuning
from specrepl.models import width_plans
from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_llama, tiny_tokenizer, visible_state

needs_packing = pytest.mark.skipif(
    not packing_works(torch.float32), reason="this torch cannot pack weights on this CPU"
)
EVERY = frozenset(range(1, 20))
SEQUENCE = torch.tensor([1, 17, 4, 30, 8, 8, 2, 11, 3])


@pytest.fixture(autouse=True)
def roomy(monkeypatch) -> None:
    monkeypatch.setattr(model_tuning, "available_memory", lambda: 1 << 40)


def _is_stock(model: nn.Module, attention: str = "sdpa") -> bool:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return (
        bool(linears)
        and all(type(m) is nn.Linear and not hasattr(m, "packed_weight") for m in linears)
        and model.config._attn_implementation == attention
    )


def _tuned(model: nn.Module, forms: str = "packed", attention: str | None = None) -> Tuning:
    """A tuning that takes `forms` ("packed" or "weight_first") at every width."""
    plan = WidthPlan(seconds={}, padded={}, **{forms: EVERY})
    tuning = Tuning(plan, attention=attention)
    model_tuning.allow_linear_forms(model, tuning)
    if forms == "packed":
        assert model_tuning.pack_linear_weights(model, tuning)
    assert tuning.forms
    return tuning


@needs_packing
def test_a_tuned_pair_is_the_stock_pair(monkeypatch) -> None:
    """Put together (attention timed), its widths timed (packed cheaper): every
    choice is in the tunings, none in the models."""
    monkeypatch.setattr(
        model_tuning, "measure_attention", lambda model, dtype: {dtype: 1, model.dtype: 2}
    )
    monkeypatch.setattr(
        model_tuning, "measure_grouped_attention", lambda model: {"repeated": 2, "grouped": 1}
    )

    def packed_cheaper(model, max_width, forms, **kwargs):
        return {w: [0.5 if forms.packed else 1.0] * 5 for w in range(1, max_width + 1)}

    monkeypatch.setattr(widths, "measure_width_samples", packed_cheaper)
    monkeypatch.setattr(
        widths,
        "measure_wide_samples",
        lambda model, sizes, forms, **kwargs: {name: {w: [1.0] for w in sizes} for name in forms},
    )
    target = tiny_llama(32, seed=0)
    drafter = LlamaForCausalLM(copy.deepcopy(target.config))
    drafter.load_state_dict(target.state_dict())
    drafter = drafter.to(torch.bfloat16).eval()
    before = {model: visible_state(model) for model in (target, drafter)}
    pair = ModelPair.from_models(target, drafter, tiny_tokenizer(32))
    width_plans.tune_pair_widths(pair, 3)
    assert pair.drafter is not None and pair.drafter.tuning.attention == ATTENTION
    assert pair.target.tuning.attention == GROUPED_ATTENTION
    assert pair.target.tuning.packed == {1, 2, 3, 4}
    assert pair.target.tuning.layers.packed(target)
    for model in (target, drafter):
        assert visible_state(model) == before[model] and _is_stock(model)
    assert pair.drafter.to_dict()["attention"] == ATTENTION  # what its passes use


@needs_packing
@pytest.mark.parametrize("attention", [None, GROUPED_ATTENTION, ATTENTION])
@pytest.mark.parametrize("forms", ["packed", "weight_first"])
def test_a_tuned_pass_gives_the_stock_logits_and_leaves_the_model_stock(forms, attention) -> None:
    model = tiny_llama(32, seed=0)
    before = visible_state(model)
    stock = forward_logits(model, SEQUENCE, None, 4, 32)
    seen: list[tuple[type, str]] = []
    layer = model.model.layers[1].mlp.down_proj
    hook = layer.register_forward_hook(
        lambda module, args, out: seen.append((type(module), model.config._attn_implementation))
    )
    tuning = _tuned(model, forms, attention)
    tuned = forward_logits(model, SEQUENCE, None, 4, 32, tuning=tuning)
    torch.testing.assert_close(tuned, stock, rtol=1e-5, atol=1e-5)
    assert seen == [(FormChoosingLinear, attention or "sdpa")]  # inside the pass only
    model(SEQUENCE[None])  # a plain call: the stock model
    assert seen[-1] == (nn.Linear, "sdpa")
    hook.remove()
    assert visible_state(model) == before and _is_stock(model)


@needs_packing
def test_a_tuned_pass_multiplies_in_its_own_forms(monkeypatch) -> None:
    """Counted: the packed product for every layer in a packed pass, weight first
    in a weight-first pass, neither in a stock one."""
    model = tiny_llama(32, seed=0)
    layers = [m for m in model.modules() if isinstance(m, nn.Linear)]
    weights = {id(m.weight) for m in layers}
    packed_calls, weight_first_calls = [], []
    pointwise, mm = torch.ops.mkldnn._linear_pointwise, torch.mm

    def counting_pointwise(*args, **kwargs):
        packed_calls.append(1)
        return pointwise(*args, **kwargs)

    def counting_mm(a, b, *args, **kwargs):
        if id(a) in weights:
            weight_first_calls.append(1)
        return mm(a, b, *args, **kwargs)

    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", counting_pointwise)
    monkeypatch.setattr(torch, "mm", counting_mm)
    forward_logits(model, SEQUENCE, None, 1, 32, tuning=_tuned(model, "packed"))
    assert (len(packed_calls), len(weight_first_calls)) == (len(layers), 0)
    forward_logits(model, SEQUENCE, None, 1, 32, tuning=_tuned(model, "weight_first"))
    assert (len(packed_calls), len(weight_first_calls)) == (len(layers), len(layers))
    forward_logits(model, SEQUENCE, None, 1, 32)
    model(SEQUENCE[None])
    assert (len(packed_calls), len(weight_first_calls)) == (len(layers), len(layers))


@needs_packing
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_a_pass_interrupted_inside_the_model_leaves_it_stock(error) -> None:
    model = tiny_llama(32, seed=0)
    before = visible_state(model)
    tuning = _tuned(model, "packed", GROUPED_ATTENTION)

    def fail(module, args, output):
        raise error("stopped mid-pass")

    hook = model.model.layers[0].mlp.register_forward_hook(fail)
    with pytest.raises(error, match="stopped mid-pass"):
        forward_logits(model, SEQUENCE, None, 1, 32, tuning=tuning)
    hook.remove()
    assert visible_state(model) == before and _is_stock(model)
    stock = forward_logits(model, SEQUENCE, None, 1, 32)
    torch.testing.assert_close(forward_logits(model, SEQUENCE, None, 1, 32, tuning=tuning), stock)


@needs_packing
def test_transformers_generate_runs_the_stock_model_after_tuned_passes() -> None:
    model = tiny_llama(32, seed=0)
    tuning = _tuned(model, "packed", GROUPED_ATTENTION)
    forward_logits(model, SEQUENCE, None, 1, 32, tuning=tuning)
    seen: set[tuple[type, str]] = set()
    for layer in model.modules():
        if isinstance(layer, nn.Linear):
            layer.register_forward_hook(
                lambda module, args, out: seen.add(
                    (type(module), model.config._attn_implementation)
                )
            )
    model.generate(SEQUENCE[None], max_new_tokens=3, do_sample=False)
    assert seen == {(nn.Linear, "sdpa")}


@needs_packing
def test_passes_nest_and_each_gives_back_what_it_switched() -> None:
    """A pass run inside another's block (the answer writer's block around a
    tuned pass): the inner one leaves the outer one's forms, the outer one the
    stock model."""
    model = tiny_llama(32, seed=0)
    outer, inner = _tuned(model, "packed"), _tuned(model, "weight_first", ATTENTION)
    layer = model.model.layers[0].mlp.up_proj
    stock = forward_logits(model, SEQUENCE, None, 1, 32)
    with outer.running(model):
        assert type(layer) is FormChoosingLinear
        nested = forward_logits(model, SEQUENCE, None, 1, 32, tuning=inner)
        assert type(layer) is FormChoosingLinear and model.config._attn_implementation == "sdpa"
    assert _is_stock(model)
    torch.testing.assert_close(nested, stock, rtol=1e-5, atol=1e-5)


@needs_packing
def test_a_tuning_does_not_keep_its_model_alive() -> None:
    """The packed copies go with the layers they were made from (a released
    model frees their memory; `apply_tuning` packs the model loaded again)."""
    model = tiny_llama(32, seed=0)
    tuning = _tuned(model, "packed")
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    again = tiny_llama(32, seed=0)
    assert not tuning.layers.packed(again)
    model_tuning.apply_tuning(again, tuning)
    assert tuning.packed_weights and tuning.layers.packed(again) and _is_stock(again)
