"""Width plans: padding a forward pass changes nothing but its cost."""

from __future__ import annotations

import json

import pytest
import torch

from specrepl.engine import widths
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.forward import forward_logits
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.grouped_attention import GROUPED_ATTENTION
from specrepl.engine.kv_cache import cached_length, new_cache
from specrepl.engine.linear_forms import (
    STOCK,
    FormChoosingLinear,
    FormLayers,
    RowForms,
    packable_bytes,
    packing_works,
)
from specrepl.engine.processors import TopKProcessor
from specrepl.engine.tuning import Tuning
from specrepl.engine.width_plan import WidthPlan, plan_widths
from specrepl.engine.widths import measure_widths
from specrepl.models import width_plans
from specrepl.models.loaded import LoadedModel
from specrepl.models.pair import ModelPair
from specrepl.models.tuning import (
    allow_linear_forms,
    apply_tuning,
    pack_linear_weights,
    unpack_linear_weights,
)
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer, visible_state

PROMPTS = ([1, 5, 9, 12], [1, 17, 4, 30, 8, 8, 2, 11], [7])
# every width up to 8 padded to a larger one: the widest rewrite a plan can make
EVERYTHING_PADDED = WidthPlan(seconds={}, padded={w: min(w + 3, 9) for w in range(1, 9)})


@pytest.fixture()
def target():
    return tiny_llama(32, seed=0)


@pytest.fixture(autouse=True)
def prompt_sized_passes_cost_the_same(monkeypatch):
    """Prompt-sized passes measure alike stock and packed here, so no plan packs
    them (test_wide_passes.py tests that choice)."""

    def alike(model, sizes, forms, **kwargs):
        return {name: {w: [0.01, 0.01] for w in sizes} for name in forms}

    monkeypatch.setattr(widths, "measure_wide_samples", alike)


def test_plan_pads_only_to_a_clearly_cheaper_larger_width() -> None:
    plan = plan_widths({1: 58.0, 2: 97.0, 3: 119.0, 4: 89.0, 5: 81.0, 6: 94.0})
    # 4 -> 5 would save only 9%: within the margin, 4 stays
    assert plan.padded == {1: 1, 2: 5, 3: 5, 4: 4, 5: 5, 6: 6}
    assert plan.to_dict()["padded"] == {2: 5, 3: 5}


def test_padded_forward_gives_the_same_logits_and_cache(target) -> None:
    sequence = torch.tensor([1, 17, 4, 30, 8, 8, 2, 11, 3])
    plain_cache, padded_cache = new_cache(target), new_cache(target)
    forward_logits(target, sequence[:6], plain_cache, 1, 32)
    forward_logits(target, sequence[:6], padded_cache, 1, 32)
    expected = forward_logits(target, sequence, plain_cache, 3, 32)
    tuning = Tuning(plan=EVERYTHING_PADDED)
    padded = forward_logits(target, sequence, padded_cache, 3, 32, tuning=tuning)
    assert padded.shape == expected.shape == (3, 32)
    torch.testing.assert_close(padded, expected)
    assert cached_length(padded_cache) == cached_length(plain_cache) == 9


def test_no_padding_past_the_context() -> None:
    model = tiny_llama(32, seed=0, max_position_embeddings=8)
    tuning = Tuning(plan=EVERYTHING_PADDED)
    cache = new_cache(model)
    logits = forward_logits(model, torch.arange(1, 8), cache, 2, 32, tuning=tuning)  # 7 + 3 > 8
    assert logits.shape == (2, 32) and cached_length(cache) == 7


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_greedy_speculative_with_padding_equals_the_target(target, gamma) -> None:
    references = [autoregressive_generate(p, target, max_gen_len=24).token_ids for p in PROMPTS]
    drafter = perturbed_copy(target, 0.1, seed=1)
    tuning = Tuning(plan=EVERYTHING_PADDED)
    for prompt, reference in zip(PROMPTS, references, strict=True):
        for draft_with in (ModelDrafter(drafter, tuning=tuning), NgramDrafter(3)):
            result = speculative_generate(
                prompt, draft_with, target, gamma=gamma, max_gen_len=24, tuning=tuning
            )
            assert result.token_ids == reference


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_greedy_speculative_weight_first_equals_the_target(target, gamma) -> None:
    references = [autoregressive_generate(p, target, max_gen_len=24).token_ids for p in PROMPTS]
    drafter = perturbed_copy(target, 0.1, seed=1)
    every = frozenset(range(1, 10))
    tunings = {
        model: Tuning(WidthPlan(seconds={}, padded={}, weight_first=every))
        for model in (target, drafter)
    }
    for model, tuning in tunings.items():
        allow_linear_forms(model, tuning)
        assert tuning.linear_forms and tuning.weight_first == every
    for prompt, reference in zip(PROMPTS, references, strict=True):
        for draft_with in (ModelDrafter(drafter, tuning=tunings[drafter]), NgramDrafter(3)):
            result = speculative_generate(
                prompt, draft_with, target, gamma=gamma, max_gen_len=24, tuning=tunings[target]
            )
            assert result.token_ids == reference


def test_weight_first_gives_the_stock_products() -> None:
    model = tiny_llama(32, seed=0)
    layer = model.model.layers[0].mlp.down_proj
    layers = FormLayers()
    assert layer in layers.layers(model)
    for shape in ((1, 1), (1, 5), (2, 3), (9,)):
        x = torch.randn(*shape, layer.in_features)
        stock = torch.nn.functional.linear(x, layer.weight)
        with layers.in_forms(model, RowForms(weight_first=frozenset(range(1, 20)))):
            assert type(layer) is FormChoosingLinear
            chosen = layer(x)
        torch.testing.assert_close(chosen, stock)
        assert type(layer) is torch.nn.Linear  # outside a block: the stock layer itself


def test_torch_compile_sees_plain_linear_layers() -> None:
    """A forward compiled inside a pass whose layers may choose their form is one
    graph: no break at each linear layer (and outside one, the layers are the
    stock ones: bench's hf-compiled peer)."""
    import torch._dynamo

    model = tiny_llama(32, seed=0)
    layers = FormLayers()
    ids = torch.tensor([[1, 5, 9, 12]])
    with layers.in_forms(model, RowForms(weight_first=frozenset({4}))):
        explained = torch._dynamo.explain(lambda x: model(x).logits)(ids)
    assert explained.graph_break_count == 0, explained.break_reasons


def test_only_plain_float_linear_layers_on_a_cpu_take_another_form() -> None:
    class Custom(torch.nn.Linear):
        pass

    holder = torch.nn.Sequential(torch.nn.Linear(4, 4), Custom(4, 4), torch.nn.Linear(4, 4))
    holder[2].weight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.int8), requires_grad=False)
    layers = FormLayers()
    assert layers.layers(holder) == (holder[0],)
    with layers.in_forms(holder, RowForms(weight_first=frozenset({1}))):
        assert type(holder[0]) is FormChoosingLinear
        assert type(holder[1]) is Custom and type(holder[2]) is torch.nn.Linear
    assert type(holder[0]) is torch.nn.Linear


def test_the_linear_forms_are_recorded_in_the_tuning_only() -> None:
    model = tiny_llama(32, seed=0)
    before = visible_state(model)
    tuning = Tuning(WidthPlan(seconds={}, padded={}, weight_first=frozenset({2})))
    assert tuning.weight_first == frozenset()  # not recorded yet: stock
    allow_linear_forms(model, tuning)
    assert tuning.linear_forms and tuning.weight_first == {2}
    assert visible_state(model) == before


def test_a_plan_keeps_the_cheaper_form_of_each_width(monkeypatch, target) -> None:
    def measured(model, max_width, forms=STOCK, **kwargs):
        # weight first is cheaper at widths 2 and 3, packed at 3 (more so) and 5
        cost = {1: 1.0, 2: 3.0, 3: 3.0, 4: 2.0, 5: 4.0}
        if forms.weight_first:
            cost = {1: 1.1, 2: 1.5, 3: 1.8, 4: 2.5, 5: 4.5}
        if forms.packed:
            cost = {1: 1.2, 2: 1.6, 3: 1.7, 4: 2.1, 5: 2.2}
        return {w: [cost[w]] * 5 for w in range(1, max_width + 1)}

    monkeypatch.setattr(widths, "measure_width_samples", measured)
    plan, noise = widths.measure_plan(target, 5, Tuning(linear_forms=True))
    assert plan.weight_first == frozenset({2, 3}) and noise == 0.0
    assert plan.packed == frozenset()  # the layers hold no packed copy: not timed
    assert plan.seconds == {1: 1.0, 2: 1.5, 3: 1.8, 4: 2.0, 5: 4.0}
    assert plan.to_dict()["weight_first"] == [2, 3]
    plan, _ = widths.measure_plan(target, 5, Tuning(linear_forms=True, packed_weights=True))
    assert plan.weight_first == frozenset({2}) and plan.packed == frozenset({3, 5})
    assert plan.seconds == {1: 1.0, 2: 1.5, 3: 1.7, 4: 2.0, 5: 2.2}
    assert plan.to_dict()["packed"] == [3, 5]
    assert plan.forms == RowForms(weight_first=frozenset({2}), packed=frozenset({3, 5}))


def test_seeded_sampling_with_padding_is_unchanged(target) -> None:
    drafter = perturbed_copy(target, 0.1, seed=1)

    def sample() -> list[int]:
        return speculative_generate(
            PROMPTS[1],
            drafter,
            target,
            gamma=3,
            max_gen_len=24,
            logits_processor=TopKProcessor(temperature=0.9, top_k=8),
            generator=torch.Generator().manual_seed(7),
            tuning=tuning,
        ).token_ids

    tuning = Tuning()
    plain = sample()
    tuning.plan = EVERYTHING_PADDED  # as a plan timed again reaches a running session
    assert sample() == plain


def test_measure_widths_times_every_width(target) -> None:
    seconds = measure_widths(target, 4, context=6, repeats=1)
    assert sorted(seconds) == [1, 2, 3, 4] and all(s > 0 for s in seconds.values())
    before = visible_state(target)
    tuning = Tuning(linear_forms=True, attention=GROUPED_ATTENTION)
    every = RowForms(weight_first=frozenset(range(1, 5)))
    seconds = measure_widths(target, 4, context=6, repeats=1, forms=every, tuning=tuning)
    assert sorted(seconds) == [1, 2, 3, 4]
    assert visible_state(target) == before  # measuring changes nothing


def test_pair_plans_are_stored_and_reused(tmp_path, monkeypatch) -> None:
    model = tiny_llama(32, seed=0)
    pair = ModelPair.from_models(model, perturbed_copy(model, 0.1, seed=1), tiny_tokenizer(32))
    store = tmp_path / "widths.json"
    monkeypatch.setattr(widths, "measure_width_samples", _steady)  # a busy machine is not stored
    first = width_plans.tune_pair_widths(pair, 3, store=store)
    assert sorted(first) == ["drafter", "target"] and store.exists()
    assert sorted(first["target"].seconds) == [1, 2, 3, 4]

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the store has it")

    monkeypatch.setattr(widths, "measure_width_samples", no_measuring)
    again = width_plans.tune_pair_widths(pair, 3, store=store)
    assert again["target"].seconds == pytest.approx(first["target"].seconds)
    assert pair.target.tuning.plan == again["target"]
    assert pair.drafter is not None and pair.drafter.tuning.plan == again["drafter"]
    with pytest.raises(AssertionError, match="measured again"):
        width_plans.tune_pair_widths(pair, 5, store=store)  # other widths: a new measurement
    with pytest.raises(AssertionError, match="measured again"):
        width_plans.tune_pair_widths(pair, 3, store=store, retime=True)  # asked for


def test_one_model_in_both_roles_is_timed_once(monkeypatch) -> None:
    model = tiny_llama(32, seed=0)
    pair = ModelPair.from_models(model, model, tiny_tokenizer(32))
    assert pair.drafter is pair.target  # one model, one tuning
    monkeypatch.setattr(widths, "measure_width_samples", _steady)
    assert list(width_plans.tune_pair_widths(pair, 3)) == ["target"]
    assert pair.drafter.tuning.plan is not None


def test_a_model_off_the_cpu_is_never_timed(monkeypatch) -> None:
    """On a GPU a pass costs about the same at every width: bench and the REPL
    alike leave such a model untimed (its record says where it runs)."""
    model = tiny_llama(32, seed=0)
    pair = ModelPair.from_models(model, perturbed_copy(model, 0.1, seed=1), tiny_tokenizer(32))
    pair.target.device = torch.device("cuda")

    def no_measuring(*args, **kwargs):
        raise AssertionError("a model off the CPU was timed")

    monkeypatch.setattr(widths, "measure_width_samples", no_measuring)
    with pytest.raises(AssertionError, match="off the CPU"):
        width_plans.tune_pair_widths(pair, 3, roles=("drafter",))  # the CPU drafter still is
    assert width_plans.tune_pair_widths(pair, 3, roles=("target",)) == {}
    assert pair.target.tuning.plan is None


def test_only_the_roles_asked_for_are_timed(monkeypatch) -> None:
    model = tiny_llama(32, seed=0)
    pair = ModelPair.from_models(model, perturbed_copy(model, 0.1, seed=1), tiny_tokenizer(32))
    monkeypatch.setattr(widths, "measure_width_samples", _steady)
    assert list(width_plans.tune_pair_widths(pair, 3, roles=("target",))) == ["target"]
    assert pair.target.tuning.plan is not None
    assert pair.drafter is not None and pair.drafter.tuning.plan is None
    assert list(width_plans.tune_pair_widths(pair, 3, roles=("drafter",))) == ["drafter"]
    assert pair.drafter.tuning.plan is not None
    assert width_plans.tune_pair_widths(pair, 3, roles=()) == {}
    with pytest.raises(ValueError, match="roles are target and drafter"):
        width_plans.tune_pair_widths(pair, 3, roles=("draft",))


def _steady(model, max_width, **kwargs):
    return {
        w: [0.01 * w, 0.0101 * w, 0.0099 * w, 0.01 * w, 0.0102 * w] for w in range(1, max_width + 1)
    }


def _busy(model, max_width, **kwargs):
    return {w: [0.01, 0.02, 0.011, 0.03, 0.009] for w in range(1, max_width + 1)}


def test_noisy_old_and_foreign_plans_are_measured_again(tmp_path, monkeypatch) -> None:
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))
    store = tmp_path / "widths.json"
    measured: list[int] = []

    def counting(kind):
        def measure(model, max_width, **kwargs):
            if not kwargs.get("forms"):  # a plan times the stock form, then the others
                measured.append(max_width)
            return kind(model, max_width)

        return measure

    # a busy machine: the plan serves this session but is not stored
    monkeypatch.setattr(widths, "measure_width_samples", counting(_busy))
    plans = width_plans.tune_pair_widths(pair, 3, store=store)
    assert list(plans) == ["target"] and json.loads(store.read_text()) == {}
    width_plans.tune_pair_widths(pair, 3, store=store)
    assert len(measured) == 2  # nothing was stored, so it measured again
    # a quiet one: stored with its time and spread, and reused
    monkeypatch.setattr(widths, "measure_width_samples", counting(_steady))
    width_plans.tune_pair_widths(pair, 3, store=store)
    width_plans.tune_pair_widths(pair, 3, store=store)
    assert len(measured) == 3
    saved = json.loads(store.read_text())
    (entry,) = saved.values()
    assert entry["spread"] < width_plans.NOISY_SPREAD and entry["measured_at"] > 0
    # too old, or from before plans were dated, or from the future: measured again
    for stale in (
        {**entry, "measured_at": entry["measured_at"] - 31 * 86400},
        {"seconds": entry["seconds"]},
        {key: value for key, value in entry.items() if key != "weight_first"},  # before forms
        {key: value for key, value in entry.items() if key != "packed"},  # before packing
        {key: value for key, value in entry.items() if key != "packed_from"},  # before prompts
        {**entry, "measured_at": entry["measured_at"] + 86400},
        {**entry, "seconds": {"1": -1.0}},
    ):
        store.write_text(json.dumps({key: stale for key in saved}))
        width_plans.tune_pair_widths(pair, 3, store=store)
    assert len(measured) == 10


def test_spread_leaves_the_extremes_out() -> None:
    assert widths.spread({1: [1.0, 1.0, 1.0, 1.0, 5.0]}) == 0.0  # one slow repeat is not noise
    assert widths.spread({1: [1.0, 1.0, 1.5, 2.0, 2.0], 2: [1.0] * 5}) == pytest.approx(1 / 1.5)
    assert widths.spread({1: [1.0, 9.0]}) == 0.0  # too few repeats to judge


needs_packing = pytest.mark.skipif(
    not packing_works(torch.float32), reason="this torch cannot pack weights on this CPU"
)


@needs_packing
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_give_the_stock_products(dtype) -> None:
    if not packing_works(dtype):
        pytest.skip(f"this torch cannot pack {dtype} weights on this CPU")
    model = tiny_llama(32, seed=0).to(dtype)
    before = visible_state(model)
    layer = model.model.layers[0].mlp.down_proj
    layers = FormLayers()
    assert layers.pack(model) == len(layers.layers(model)) > 0 and layers.packed(model)
    assert layers.pack(model) == len(layers.layers(model))  # idempotent
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    for shape in ((1, 1), (1, 5), (2, 3), (9,), (1, 17)):
        x = torch.randn(*shape, layer.in_features).to(dtype)
        stock = torch.nn.functional.linear(x, layer.weight)
        with layers.in_forms(model, RowForms(packed=frozenset(range(1, 20)))):
            chosen = layer(x)
        assert chosen.shape == stock.shape and chosen.dtype == dtype
        torch.testing.assert_close(chosen, stock, **tolerance)
        assert torch.equal(layer(x), stock)  # outside a block: the stock kernel itself
    assert visible_state(model) == before  # the copies are held apart from the model
    layers.unpack()
    assert not layers.packed(model)


@needs_packing
@pytest.mark.parametrize("gamma", [1, 3, 8, 16])
def test_greedy_speculative_packed_equals_the_target(monkeypatch, target, gamma) -> None:
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    references = [autoregressive_generate(p, target, max_gen_len=24).token_ids for p in PROMPTS]
    drafter = perturbed_copy(target, 0.1, seed=1)
    every = frozenset(range(1, 18))
    tunings = {
        model: Tuning(WidthPlan(seconds={}, padded={}, packed=every, weight_first=every))
        for model in (target, drafter)
    }
    for model, tuning in tunings.items():
        assert tuning.packed == frozenset()  # no packed copies yet: stock
        allow_linear_forms(model, tuning)
        assert pack_linear_weights(model, tuning) and tuning.packed == every
        assert tuning.forms.packed == every
    for prompt, reference in zip(PROMPTS, references, strict=True):
        for draft_with in (ModelDrafter(drafter, tuning=tunings[drafter]), NgramDrafter(3)):
            result = speculative_generate(
                prompt, draft_with, target, gamma=gamma, max_gen_len=24, tuning=tunings[target]
            )
            assert result.token_ids == reference


def _holds_packed(loaded: LoadedModel) -> bool:
    return loaded.tuning.layers.packed(loaded.model)


@needs_packing
def test_packing_needs_room_in_memory_and_is_undone(monkeypatch) -> None:
    model = tiny_llama(32, seed=0)
    tuning = Tuning(WidthPlan(seconds={}, padded={}, packed=frozenset({2})))
    assert not pack_linear_weights(model, tuning)  # no layer recorded to take another form
    allow_linear_forms(model, tuning)
    need = sum(m.weight.numel() * 4 for m in model.modules() if type(m) is torch.nn.Linear)
    assert packable_bytes(model) == need
    for free in (None, need, 2 * need - 1):  # unknown, or the copy would take over half
        monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda free=free: free)
        assert not pack_linear_weights(model, tuning) and not tuning.layers.packed(model)
        assert tuning.packed == frozenset()
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 2 * need)
    assert pack_linear_weights(model, tuning) and tuning.layers.packed(model)
    assert tuning.packed == {2}
    again = tiny_llama(32, seed=0)  # the same weights loaded again take the same forms
    apply_tuning(again, tuning)
    assert tuning.layers.packed(again) and tuning.packed_weights
    unpack_linear_weights(tuning)
    assert not tuning.layers.packed(model) and not tuning.layers.packed(again)
    assert tuning.packed == frozenset() and tuning.linear_forms


@needs_packing
def test_a_stored_packed_plan_without_room_now_is_measured_again(tmp_path, monkeypatch) -> None:
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))
    store = tmp_path / "widths.json"
    measured: list[RowForms] = []

    def packed_is_cheaper(model, max_width, forms=STOCK, **kwargs):
        measured.append(forms)
        scale = 0.5 if forms.packed else 1.0
        return {w: [scale * t for t in times] for w, times in _steady(model, max_width).items()}

    monkeypatch.setattr(widths, "measure_width_samples", packed_is_cheaper)
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    plan = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    assert plan.packed == {1, 2, 3, 4} and pair.target.tuning.packed == {1, 2, 3, 4}
    assert len(measured) == 3 and json.loads(store.read_text())  # stock, weight first, packed
    unpack_linear_weights(pair.target.tuning)
    width_plans.tune_pair_widths(pair, 3, store=store)  # room: the stored plan, packed again
    assert len(measured) == 3 and pair.target.tuning.packed == {1, 2, 3, 4}
    unpack_linear_weights(pair.target.tuning)
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 0)
    plan = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    assert len(measured) == 5 and plan.packed == frozenset()  # stock and weight first only
    assert not _holds_packed(pair.target)


@needs_packing
def test_packed_copies_no_width_uses_are_dropped(monkeypatch) -> None:
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))

    def packed_is_dearer(model, max_width, forms=STOCK, **kwargs):
        scale = 2.0 if forms.packed else 1.0
        return {w: [scale * t for t in times] for w, times in _steady(model, max_width).items()}

    monkeypatch.setattr(widths, "measure_width_samples", packed_is_dearer)
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    plan = width_plans.tune_pair_widths(pair, 3)["target"]
    assert plan.packed == frozenset() and not _holds_packed(pair.target)
    assert not pair.target.tuning.packed_weights


@needs_packing
def test_a_stored_plan_without_packed_widths_drops_the_copies(tmp_path, monkeypatch) -> None:
    """A pair timed again for other widths (a larger gamma) whose stored plan
    packs nothing gives the memory of the packed copies back."""
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))
    store = tmp_path / "widths.json"

    def packed_only_up_to_3(model, max_width, forms=STOCK, **kwargs):
        packed_pays = max_width <= 3
        scale = 0.5 if forms.packed and packed_pays else 2.0 if forms.packed else 1.0
        return {w: [scale * t for t in times] for w, times in _steady(model, max_width).items()}

    monkeypatch.setattr(widths, "measure_width_samples", packed_only_up_to_3)
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    width_plans.tune_pair_widths(pair, 5, store=store)  # stored: packs nothing
    assert not _holds_packed(pair.target)
    width_plans.tune_pair_widths(pair, 2, store=store)  # widths 1..3: packed
    assert _holds_packed(pair.target) and pair.target.tuning.packed == {1, 2, 3}
    width_plans.tune_pair_widths(pair, 5, store=store)  # the stored plan again
    assert not _holds_packed(pair.target) and not pair.target.tuning.packed_weights
