"""The shared-tokenizer check: which target/drafter pairs may decode together."""

from __future__ import annotations

import pytest

from specrepl.models.compatibility import IncompatibleTokenizersError, check_compatibility
from specrepl.testing import tiny_tokenizer


def test_same_tokenizer_object_shares_its_length() -> None:
    tokenizer = tiny_tokenizer(32)
    assert check_compatibility(tokenizer, tokenizer, target_logits=32, drafter_logits=32) == 32


def test_equal_tokenizers_built_twice_are_compatible() -> None:
    shared = check_compatibility(
        tiny_tokenizer(32), tiny_tokenizer(32), target_logits=32, drafter_logits=32
    )
    assert shared == 32


def test_no_drafter_tokenizer_checks_only_the_logits() -> None:
    assert check_compatibility(tiny_tokenizer(32), None, target_logits=32, drafter_logits=40) == 32
    assert check_compatibility(tiny_tokenizer(32), None, target_logits=32) == 32


def test_drafter_with_padded_wider_logits_is_sliced_to_the_tokenizer() -> None:
    tokenizer = tiny_tokenizer(32)
    assert check_compatibility(tokenizer, None, target_logits=32, drafter_logits=48) == 32


def test_qwen_like_tokenizer_shorter_than_both_models_logits() -> None:
    # Qwen2.5: tokenizer 151665 tokens, 0.5B logits 151936, 7B logits 152064.
    shared = check_compatibility(
        tiny_tokenizer(28), tiny_tokenizer(28), target_logits=40, drafter_logits=36
    )
    assert shared == 28


def test_different_token_strings_at_the_same_size_are_refused() -> None:
    with pytest.raises(IncompatibleTokenizersError) as error:
        check_compatibility(
            tiny_tokenizer(32),
            tiny_tokenizer(32, word_prefix="v"),
            target_logits=32,
            drafter_logits=32,
        )
    message = str(error.value)
    assert "token id 7" in message
    assert "'w7'" in message and "'v7'" in message


def test_different_lengths_are_refused() -> None:
    with pytest.raises(IncompatibleTokenizersError) as error:
        check_compatibility(
            tiny_tokenizer(32), tiny_tokenizer(40), target_logits=40, drafter_logits=40
        )
    message = str(error.value)
    assert "32" in message and "40" in message
    assert "token id 32" in message and "'w32'" in message


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_logits_not_covering_the_tokenizer_are_refused(role: str) -> None:
    widths = {"target_logits": 32, "drafter_logits": 32} | {f"{role}_logits": 24}
    with pytest.raises(IncompatibleTokenizersError) as error:
        check_compatibility(tiny_tokenizer(32), None, **widths)
    message = str(error.value)
    assert role in message and "24" in message and "32" in message


def test_different_special_tokens_are_refused() -> None:
    drafter_tokenizer = tiny_tokenizer(32)
    drafter_tokenizer.eos_token = "<s>"
    with pytest.raises(IncompatibleTokenizersError) as error:
        check_compatibility(
            tiny_tokenizer(32), drafter_tokenizer, target_logits=32, drafter_logits=32
        )
    message = str(error.value)
    assert "eos" in message and "'<|im_end|>'" in message and "'<s>'" in message


def test_bad_logits_width_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="target_logits"):
        check_compatibility(tiny_tokenizer(32), None, target_logits=0)
