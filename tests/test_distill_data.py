"""The draft head's training data: the in-place cache and batched generation.

Batched generation drops finished rows and grows its cache in place; each row
must still be exactly the target's own greedy continuation, with the features
the target computes for it in a separate pass.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from specrepl.engine.kv_cache import GrowingLayer, growing_cache, rollback_to
from specrepl.testing import tiny_llama
from specrepl.train.data import batched_generate, target_features

END = 3


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=48, num_layers=2, seed=5)


def greedy_alone(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The model's greedy continuation of one prompt, with no batch and no cache."""
    sequence = list(prompt)
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([sequence])).logits[0, -1]
        sequence.append(int(logits.argmax()))
        if sequence[-1] == END:
            break
    return sequence


def random_prompts(count: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randint(
            4, 48, (int(torch.randint(2, 14, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(count)
    ]


def test_the_growing_cache_gives_the_dynamic_caches_logits(target) -> None:
    """Prefill, steps past its first room, a rollback and a dropped row: the
    same logits as transformers' own cache, and its layers hold views."""
    ids = torch.randint(4, 48, (3, 40), generator=torch.Generator().manual_seed(1))
    outputs = []
    for cache in (DynamicCache(config=target.config), growing_cache(target, room=8)):
        logits = []
        with torch.no_grad():
            logits.append(target(input_ids=ids[:, :10], past_key_values=cache).logits)
            for position in range(10, 30):
                step = ids[:, position : position + 1]
                logits.append(target(input_ids=step, past_key_values=cache).logits)
            rollback_to(cache, 24)
            logits.append(target(input_ids=ids[:, 24:33], past_key_values=cache).logits)
            cache.batch_select_indices(torch.tensor([0, 2]))
            logits.append(target(input_ids=ids[[0, 2], 33:36], past_key_values=cache).logits)
        outputs.append((logits, cache.get_seq_length()))
    (dynamic, dynamic_length), (growing, growing_length) = outputs
    assert growing_length == dynamic_length == 36
    for expected, got in zip(dynamic, growing, strict=True):
        torch.testing.assert_close(got, expected)
    cache = growing_cache(target, room=8)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)


def test_the_growing_layer_doubles_its_room_and_keeps_its_contents() -> None:
    layer = GrowingLayer(room=4)
    chunks = [torch.randn(2, 1, n, 3) for n in (3, 1, 2, 5)]
    for chunk in chunks:
        keys, values = layer.update(chunk, -chunk)
    expected = torch.cat(chunks, dim=-2)
    torch.testing.assert_close(keys, expected)
    torch.testing.assert_close(values, -expected)
    assert layer.get_seq_length() == 11
    layer.crop(-4)
    torch.testing.assert_close(layer.keys, expected[..., :7, :])
    with pytest.raises(ValueError):
        layer.crop(2)
    layer.reset()
    assert layer.get_seq_length() == 0


@pytest.mark.parametrize("rows", [1, 5, 12])
def test_every_row_is_the_targets_own_greedy_continuation(target, rows) -> None:
    """Rows end at different steps (some at once, some never) and leave the
    batch as they end; each row is what the target writes for it alone."""
    prompts = random_prompts(rows, seed=rows)
    generated = batched_generate(target, prompts, max_new_tokens=20, end_tokens=[END], pad_id=0)
    lengths = []
    for prompt, sequence, start in zip(
        prompts, generated.ids, generated.prompt_lengths, strict=True
    ):
        assert start == len(prompt)
        assert sequence.tolist() == greedy_alone(target, prompt, 20)
        lengths.append(sequence.shape[0] - start)
    if rows == 12:  # the batch really had rows that finished early
        assert min(lengths) < 20


def test_features_read_while_writing_are_the_targets_own(target) -> None:
    prompts = random_prompts(9, seed=3)
    generated = batched_generate(target, prompts, max_new_tokens=16, end_tokens=[END], pad_id=0)
    again = target_features(target, generated.ids, pad_id=0)
    for sequence, during, after in zip(generated.ids, generated.features, again, strict=True):
        assert during.shape == (sequence.shape[0] - 1, target.config.hidden_size)
        torch.testing.assert_close(during.float(), after.float(), atol=3e-2, rtol=3e-2)


def test_an_end_token_in_every_row_stops_at_once(target) -> None:
    """A prompt whose first greedy token ends it: one token each, no features
    beyond the prompt."""
    prompts = random_prompts(6, seed=11)
    ends = sorted({greedy_alone(target, prompt, 1)[-1] for prompt in prompts})
    generated = batched_generate(target, prompts, max_new_tokens=5, end_tokens=ends, pad_id=0)
    for prompt, sequence, features in zip(prompts, generated.ids, generated.features, strict=True):
        assert sequence.shape[0] == len(prompt) + 1
        assert features.shape[0] == len(prompt)
