"""The embedded pair end to end, offline: speculative output is the target's output."""

from __future__ import annotations

import pytest

from specrepl.drafters import LookupDrafter, ModelDrafter, NgramDrafter
from specrepl.gamma import make_policy
from specrepl.generation import autoregressive_generate, speculative_generate

pytestmark = pytest.mark.embedded

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the square of a number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog.",
)
NEW_TOKENS = 24


def chat_ids(pair, prompt: str) -> list[int]:
    return list(
        pair.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
        )
    )


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_the_target_on_chat_prompts(embedded_pair, prompt) -> None:
    pair = embedded_pair
    ids = chat_ids(pair, prompt)
    common = {
        "max_gen_len": NEW_TOKENS,
        "eos_tokens_id": pair.eos_token_ids,
        "vocab_size": pair.vocab_size,
        "tokenizer": pair.tokenizer,
    }
    reference = autoregressive_generate(ids, pair.target.model, **common)
    assert reference.new_tokens > 0 and reference.text
    drafters = {
        "bf16 copy, gamma 4": (ModelDrafter(pair.drafter.model), 4),
        "bf16 copy, auto": (ModelDrafter(pair.drafter.model), make_policy("auto", 6)),
        "ngram, heuristic": (NgramDrafter(3), make_policy("heuristic", 6)),
        "lookup, gamma 3": (LookupDrafter(3), 3),
    }
    for name, (drafter, gamma) in drafters.items():
        result = speculative_generate(ids, drafter, pair.target.model, gamma=gamma, **common)
        assert result.token_ids == reference.token_ids, name
        assert result.text == reference.text, name
    uncached = speculative_generate(
        ids, pair.drafter.model, pair.target.model, gamma=4, use_cache=False, **common
    )
    assert uncached.token_ids == reference.token_ids


def test_the_bf16_copy_agrees_with_the_target_nearly_always(embedded_pair) -> None:
    pair = embedded_pair
    result = speculative_generate(
        chat_ids(pair, PROMPTS[0]),
        pair.drafter.model,
        pair.target.model,
        gamma=4,
        max_gen_len=NEW_TOKENS,
        eos_tokens_id=pair.eos_token_ids,
        vocab_size=pair.vocab_size,
    )
    assert result.acceptance_rate > 0.7
