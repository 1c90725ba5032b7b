"""The target's keys and values handed to llama.cpp (`llamacpp_kv`): the probe
accepts the embedded copy and refuses a model that is not one, a damaged
state is refused, llama.cpp predicts from the target's keys and values what it
predicts after reading, and a drafter that takes them keeps the target's
greedy output across a chat with a pasted document while reading almost
nothing itself.

Needs llama-cpp-python (as tests/test_llamacpp_drafter.py).
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest
import torch

from specrepl.engine.drafters.llamacpp import LlamaCppDrafter
from specrepl.engine.drafters.llamacpp_kv import (
    LayoutError,
    _export,
    _logits,
    _parse,
    probe_importer,
)
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.kv_cache import new_cache
from specrepl.engine.prompt_cache import PromptCache
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import prompt_ids
from specrepl.testing import CountingLlama

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
REQUIRED = os.environ.get("SPECREPL_REQUIRE_LLAMACPP") == "1"


def test_the_probe_accepts_the_embedded_copy(embedded_pair: ModelPair, llama) -> None:
    importer, reason = probe_importer(llama, embedded_pair.target.model)
    assert importer is not None, reason
    assert "takes the target's keys and values" in reason
    # transformers' llama pairs dimension i with i + d/2, llama.cpp 2i with 2i + 1
    assert importer.layout.interleaved
    assert importer.layout.layers == embedded_pair.target.model.config.num_hidden_layers
    assert importer.seconds_per_position > 0
    assert llama.n_tokens == 0  # the probe leaves llama.cpp empty


def test_the_probe_refuses_a_model_that_is_not_a_copy(embedded_pair: ModelPair, llama) -> None:
    other = copy.deepcopy(embedded_pair.target.model)
    with torch.no_grad():
        projection = other.model.layers[3].self_attn.k_proj.weight
        projection.copy_(projection[torch.randperm(projection.shape[0])])
    importer, reason = probe_importer(llama, other)
    assert importer is None
    assert "not a copy" in reason


def test_a_damaged_state_is_refused(llama) -> None:
    llama.n_tokens = 0
    llama.eval([1, 2, 3, 4])
    state = _export(llama)
    llama.n_tokens = 0
    layout, keys, values = _parse(state)
    assert keys.shape == values.shape == (layout.layers, 4, layout.width)
    with pytest.raises(LayoutError, match="header"):
        _parse(b"\0\0\0\0" + state[4:])
    with pytest.raises(LayoutError, match="ends early"):
        _parse(state[:-10])
    with pytest.raises(LayoutError, match="left unread"):
        _parse(state + b"\0")


def test_llamacpp_predicts_from_the_targets_keys_as_after_reading(
    embedded_pair: ModelPair, llama
) -> None:
    target = embedded_pair.target.model
    importer, reason = probe_importer(llama, target)
    assert importer is not None, reason
    ids = prompt_ids(
        embedded_pair.tokenizer,
        "Summarize: the river rose overnight and the bridge was closed until noon.",
        chat=True,
        system_prompt=None,
    )
    llama.n_tokens = 0
    llama.eval(ids)
    own = _logits(llama)
    cache = new_cache(target)
    with torch.no_grad():
        target(torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
    importer.write(cache, len(ids) - 1, ids)
    assert llama.n_tokens == len(ids) - 1
    assert list(llama.input_ids[: len(ids) - 1]) == ids[:-1]
    llama.eval(ids[-1:])
    taken = _logits(llama)
    llama.n_tokens = 0
    assert own.argmax() == taken.argmax()
    assert float(np.corrcoef(own, taken)[0, 1]) > 0.99


def test_a_drafter_taking_the_targets_keys_keeps_the_output_and_reads_little(
    embedded_pair: ModelPair, llama
) -> None:
    """A chat whose second turn pastes a long text: the drafter takes the
    target's keys and values for it instead of reading it (no read longer than
    a few tokens), sees the whole text, and the output is the target's in
    every turn."""
    target = embedded_pair.target.model
    importer, reason = probe_importer(llama, target)
    assert importer is not None, reason
    options = embedded_pair.generation_options(use_cache=True)
    counting = CountingLlama(llama)
    drafter = LlamaCppDrafter(
        counting, keep_between_prompts=True, importer=importer, read_seconds_per_token=0.003
    )
    assert drafter.uses_target_cache and drafter.window is None
    pasted = " ".join(f"Item {n} costs {n * 3} dollars." for n in range(40))
    turns = ["Name a colour.", f"Sum up this list: {pasted}", "Thanks. And one more colour?"]
    history: list[dict[str, str]] = []
    kept = PromptCache()
    imported = 0
    for turn in turns:
        ids = prompt_ids(embedded_pair.tokenizer, turn, chat=True, history=history)
        reference = autoregressive_generate(ids, target, max_gen_len=16, **options)
        counting.fed.clear()
        result = speculative_generate(
            ids, drafter, target, gamma=4, max_gen_len=16, prompt_cache=kept, **options
        )
        assert result.token_ids == reference.token_ids
        assert max(counting.fed) <= 4  # the last token and the drafts, never the text
        assert drafter.held() == drafter.view.tokens
        assert drafter.view.spans == [(0, len(drafter.view.tokens))]  # it sees everything
        imported += result.imported_tokens
        reply = embedded_pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
    assert imported > 300  # the pasted text came from the target


def test_a_drafter_reads_where_reading_costs_less(embedded_pair: ModelPair, llama) -> None:
    """Measured costs decide: with reading priced near nothing, the drafter
    reads the prompt itself and takes nothing from the target."""
    target = embedded_pair.target.model
    importer, reason = probe_importer(llama, target)
    assert importer is not None, reason
    drafter = LlamaCppDrafter(llama, importer=importer, read_seconds_per_token=1e-9)
    ids = prompt_ids(embedded_pair.tokenizer, "Name a colour.", chat=True, system_prompt=None)
    options = embedded_pair.generation_options(use_cache=True)
    result = speculative_generate(ids, drafter, target, gamma=4, max_gen_len=12, **options)
    reference = autoregressive_generate(ids, target, max_gen_len=12, **options)
    assert result.token_ids == reference.token_ids
    assert result.imported_tokens == 0
    assert result.read_tokens >= len(ids)
