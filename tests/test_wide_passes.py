"""Prompt-sized passes: a width plan packs them where that measured cheaper."""

from __future__ import annotations

import json

import pytest
import torch

from specrepl.engine import widths
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.linear_forms import STOCK, RowForms, packing_works
from specrepl.engine.tuning import Tuning
from specrepl.engine.width_plan import WidthPlan
from specrepl.engine.widths import WIDE_WIDTHS
from specrepl.models import width_plans
from specrepl.models.pair import ModelPair
from specrepl.models.tuning import allow_linear_forms, pack_linear_weights, unpack_linear_weights
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

needs_packing = pytest.mark.skipif(
    not packing_works(torch.float32), reason="this torch cannot pack weights on this CPU"
)


def _packed_dearer(model, max_width, forms=STOCK, **kwargs):
    """Every narrow width costs twice as much packed: only prompts may pack."""
    scale = 2.0 if forms.packed else 1.0
    return {w: [scale * 0.01 * w] * 5 for w in range(1, max_width + 1)}


def _wide(packed_cost):
    """Prompt-sized passes: stock 1.0, packed `packed_cost(width)`."""

    def measure(model, sizes, forms, **kwargs):
        costs = {"stock": lambda w: 1.0, "packed": packed_cost}
        return {name: {w: [costs[name](w)] * 2 for w in sizes} for name in forms}

    return measure


def test_row_forms_pack_every_count_from_packed_from() -> None:
    forms = RowForms(packed=frozenset({2}), packed_from=10)
    assert [rows for rows in range(1, 13) if forms.packs(rows)] == [2, 10, 11, 12]
    assert RowForms(packed_from=10) and not STOCK.packs(1)


@pytest.mark.parametrize(
    ("packed_cost", "expected"),
    [
        (lambda w: 0.8, 9),
        (lambda w: 0.8 if w == WIDE_WIDTHS[0] else 1.2, None),
        (lambda w: 1.0, None),
    ],
)
def test_prompts_are_packed_only_where_cheaper_at_every_size(monkeypatch, packed_cost, expected):
    monkeypatch.setattr(widths, "measure_width_samples", _packed_dearer)
    monkeypatch.setattr(widths, "measure_wide_samples", _wide(packed_cost))
    packs = Tuning(linear_forms=True, packed_weights=True)
    plan, _ = widths.measure_plan(tiny_llama(32, seed=0), 8, packs)
    assert plan.packed == frozenset() and plan.packed_from == expected
    assert plan.to_dict()["packed_from"] == expected
    assert plan.forms.packed_from == expected and plan.packs_any == (expected is not None)
    # without packed copies nothing is timed packed, prompts included
    plan, _ = widths.measure_plan(tiny_llama(32, seed=0), 8, Tuning(linear_forms=True))
    assert plan.packed_from is None


def test_prompt_sizes_are_timed_in_every_form() -> None:
    model = tiny_llama(32, seed=0)
    forms = {"stock": STOCK, "weight first": RowForms(weight_first=frozenset({1}))}
    timed = widths.measure_wide_samples(model, (3, 12), forms, context=4, repeats=2)
    assert set(timed) == set(forms)
    for per_width in timed.values():
        assert set(per_width) == {3, 12}
        assert all(len(t) == 2 and all(s > 0 for s in t) for t in per_width.values())


@needs_packing
def test_a_plan_packing_prompts_only_keeps_and_stores_the_copies(tmp_path, monkeypatch) -> None:
    pair = ModelPair.from_models(tiny_llama(32, seed=0), None, tiny_tokenizer(32))
    store = tmp_path / "widths.json"
    monkeypatch.setattr(widths, "measure_width_samples", _packed_dearer)
    monkeypatch.setattr(widths, "measure_wide_samples", _wide(lambda w: 0.5))
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    plan = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    tuning = pair.target.tuning
    assert plan.packed == frozenset() and plan.packed_from == 5
    assert tuning.layers.packed(pair.target.model) and tuning.packed_from == 5
    assert tuning.forms == RowForms(packed_from=5)
    (entry,) = json.loads(store.read_text()).values()
    assert entry["packed_from"] == 5
    unpack_linear_weights(tuning)
    assert tuning.packed_from is None  # no packed copies: nothing packed
    monkeypatch.setattr(widths, "measure_wide_samples", _wide(lambda w: 2.0))  # not asked again
    plan = width_plans.tune_pair_widths(pair, 3, store=store)["target"]
    assert plan.packed_from == 5 and tuning.layers.packed(pair.target.model)


@needs_packing
@pytest.mark.parametrize("gamma", [2, 6])
def test_greedy_speculative_with_packed_prompts_equals_the_target(monkeypatch, gamma) -> None:
    monkeypatch.setattr("specrepl.models.tuning.available_memory", lambda: 1 << 40)
    target = tiny_llama(32, seed=0)
    drafter = perturbed_copy(target, 0.1, seed=1)
    tunings = {}
    for model in (target, drafter):
        tuning = Tuning(WidthPlan(seconds={}, padded={}, packed_from=3))
        allow_linear_forms(model, tuning)
        assert pack_linear_weights(model, tuning) and tuning.forms == RowForms(packed_from=3)
        tunings[model] = tuning
    prompts = ([1, 5, 9, 12], [1, 17, 4, 30, 8, 8, 2, 11, 3, 3, 9, 21, 6], [7, 2])
    for prompt in prompts:
        reference = autoregressive_generate(prompt, target, max_gen_len=24).token_ids
        tuned = autoregressive_generate(prompt, target, max_gen_len=24, tuning=tunings[target])
        assert tuned.token_ids == reference
        for draft_with in (ModelDrafter(drafter, tuning=tunings[drafter]), NgramDrafter(3)):
            result = speculative_generate(
                prompt, draft_with, target, gamma=gamma, max_gen_len=24, tuning=tunings[target]
            )
            assert result.token_ids == reference
