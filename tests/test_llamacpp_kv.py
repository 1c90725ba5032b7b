"""The target's keys and values handed to llama.cpp (`llamacpp_kv`): the probe
accepts the embedded copy and refuses a model that is not one, a damaged
state is refused, llama.cpp predicts from the target's keys and values what it
predicts after reading, and a drafter that takes them keeps the target's
greedy output across a chat with a pasted document while reading almost
nothing itself. Where llama.cpp's cache holds a scratch sequence, only new
positions are written (appended), what llama.cpp holds is kept, and a refused
append leaves the drafter reading for itself.

Needs llama-cpp-python (as tests/test_llamacpp_drafter.py).
"""

from __future__ import annotations

import copy
import importlib.util
import os

import numpy as np
import pytest
import torch

from specrepl.engine.drafters.llamacpp import llamacpp_drafter
from specrepl.engine.drafters.llamacpp_kv import (
    LayoutError,
    _export,
    _parse,
    last_logits,
    probe_importer,
)
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.kv_cache import new_cache
from specrepl.engine.llamacpp import open_gguf, sequences, with_sequences
from specrepl.engine.prompt_cache import PromptCache
from specrepl.models.embedded import embedded_gguf_path
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
    assert sequences(llama) == 2 and importer.appends  # the fixture opens a scratch sequence
    assert reason.endswith("new positions only")


def test_with_one_sequence_every_write_is_whole(
    embedded_pair: ModelPair, llama, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = open_gguf(embedded_gguf_path(), context_length=256, threads=torch.get_num_threads())
    assert sequences(one) == 1
    from llama_cpp import _internals

    with monkeypatch.context() as patch:  # a binding whose context cannot be made again
        patch.setattr(_internals, "LlamaContext", None)
        assert with_sequences(one, 2) is one
    assert sequences(one) == 1 and one.context_params.n_seq_max == 1
    importer, reason = probe_importer(one, embedded_pair.target.model)
    assert importer is not None, reason
    assert not importer.appends
    assert "whole sequence at each write" in reason
    cache = new_cache(embedded_pair.target.model)
    with torch.no_grad():
        embedded_pair.target.model(torch.tensor([[5, 6, 7, 8]]), past_key_values=cache)
    with pytest.raises(RuntimeError, match="no scratch sequence"):
        importer.append(cache, 2, 4, [5, 6, 7, 8])


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


def _both_readings(pair: ModelPair, llama, text: str) -> tuple[list[int], np.ndarray, object]:
    """A chat prompt's ids, llama.cpp's next-token logits after reading them
    itself, and the target's cache of all but the last."""
    ids = prompt_ids(pair.tokenizer, text, chat=True, system_prompt=None)
    llama.n_tokens = 0
    llama.eval(ids)
    own = last_logits(llama)
    cache = new_cache(pair.target.model)
    with torch.no_grad():
        pair.target.model(torch.tensor([ids[:-1]]), past_key_values=cache, use_cache=True)
    return ids, own, cache


def _predicts_as_after_reading(llama, ids: list[int], own: np.ndarray) -> None:
    """llama.cpp holds all of `ids` but the last and, fed that, predicts `own`."""
    assert llama.n_tokens == len(ids) - 1
    assert list(llama.input_ids[: len(ids) - 1]) == ids[:-1]
    llama.eval(ids[-1:])
    taken = last_logits(llama)
    llama.n_tokens = 0
    assert own.argmax() == taken.argmax()
    assert float(np.corrcoef(own, taken)[0, 1]) > 0.99


def test_llamacpp_predicts_from_the_targets_keys_as_after_reading(
    embedded_pair: ModelPair, llama
) -> None:
    importer, reason = probe_importer(llama, embedded_pair.target.model)
    assert importer is not None, reason
    text = "Summarize: the river rose overnight and the bridge was closed until noon."
    ids, own, cache = _both_readings(embedded_pair, llama, text)
    importer.write(cache, len(ids) - 1, ids)
    _predicts_as_after_reading(llama, ids, own)


def test_an_append_keeps_what_llamacpp_holds_and_predicts_as_after_reading(
    embedded_pair: ModelPair, llama
) -> None:
    importer, reason = probe_importer(llama, embedded_pair.target.model)
    assert importer is not None and importer.appends, reason
    text = (
        "Summarize: the river rose overnight and the bridge was closed until noon, "
        "so the market moved to the square by the old mill for the day."
    )
    ids, own, cache = _both_readings(embedded_pair, llama, text)
    half = len(ids) // 2
    llama.n_tokens = 0
    llama.eval(ids[:half])  # llama.cpp's own keys and values for the first half
    _, own_keys, own_values = _parse(_export(llama))
    importer.append(cache, half, len(ids) - 1, ids)
    _, keys, values = _parse(_export(llama))
    assert keys.shape[1] == len(ids) - 1
    assert np.array_equal(keys[:, :half], own_keys) and np.array_equal(values[:, :half], own_values)
    _predicts_as_after_reading(llama, ids, own)


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
    drafter = llamacpp_drafter(
        counting, keep_between_prompts=True, importer=importer, read_seconds_per_token=0.003
    )
    assert drafter.uses_target_cache and drafter.window is None
    pasted = " ".join(f"Item {n} costs {n * 3} dollars." for n in range(40))
    turns = ["Name a colour.", f"Sum up this list: {pasted}", "Thanks. And one more colour?"]
    history: list[dict[str, str]] = []
    kept = PromptCache()
    imported = []
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
        imported.append(result.imported_tokens)
        reply = embedded_pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
    assert imported[1] > 300  # the pasted text came from the target
    # the last turn appends its new tokens only, not the whole chat again
    assert 0 < imported[2] < 60 < len(ids)


def test_a_refused_append_leaves_the_drafter_reading(
    embedded_pair: ModelPair, llama, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = embedded_pair.target.model
    importer, reason = probe_importer(llama, target)
    assert importer is not None and importer.appends, reason
    refuse = importer._set

    def refused(cache, start, count, sequence):
        if sequence == 1:
            raise RuntimeError("llama.cpp took 0 bytes")
        return refuse(cache, start, count, sequence)

    monkeypatch.setattr(importer, "_set", refused)
    options = embedded_pair.generation_options(use_cache=True)
    drafter = llamacpp_drafter(
        llama, keep_between_prompts=True, importer=importer, read_seconds_per_token=0.003
    )
    history: list[dict[str, str]] = []
    kept = PromptCache()
    for turn in ["Name a colour.", "Thanks. And one more colour, with a reason?"]:
        ids = prompt_ids(embedded_pair.tokenizer, turn, chat=True, history=history)
        reference = autoregressive_generate(ids, target, max_gen_len=12, **options)
        result = speculative_generate(
            ids, drafter, target, gamma=4, max_gen_len=12, prompt_cache=kept, **options
        )
        assert result.token_ids == reference.token_ids
        assert drafter.held() == drafter.view.tokens
        reply = embedded_pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        history += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
    assert result.imported_tokens == 0  # the second turn's append was refused: read instead
    assert result.read_tokens > 10


def test_a_drafter_reads_where_reading_costs_less(embedded_pair: ModelPair, llama) -> None:
    """Measured costs decide: with reading priced near nothing, the drafter
    reads the prompt itself and takes nothing from the target."""
    target = embedded_pair.target.model
    importer, reason = probe_importer(llama, target)
    assert importer is not None, reason
    drafter = llamacpp_drafter(llama, importer=importer, read_seconds_per_token=1e-9)
    ids = prompt_ids(embedded_pair.tokenizer, "Name a colour.", chat=True, system_prompt=None)
    options = embedded_pair.generation_options(use_cache=True)
    result = speculative_generate(ids, drafter, target, gamma=4, max_gen_len=12, **options)
    reference = autoregressive_generate(ids, target, max_gen_len=12, **options)
    assert result.token_ids == reference.token_ids
    assert result.imported_tokens == 0
    assert result.read_tokens >= len(ids)
