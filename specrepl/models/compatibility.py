"""The shared-tokenizer check a target and a drafter must pass before they decode together.

Speculative decoding compares token ids across two models, so both must read
ids through one vocabulary. Equal `vocab_size` in the configs proves nothing
(two tokenizers can differ at the same size, and one tokenizer can sit under
configs of different sizes: Qwen2.5-0.5B says 151936, Qwen2.5-7B 152064): the
check compares the token string of every id and the special tokens, and
checks that both models' logits cover the tokenizer. Model logits may be wider
than the tokenizer (padded embeddings, as in Qwen2.5); the width both
generators slice logits to is the length of the target's tokenizer.

This module only sees tokenizers and integers: it knows nothing about models,
devices or how they were loaded.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

__all__ = ["SPECIAL_TOKEN_NAMES", "IncompatibleTokenizersError", "check_compatibility"]

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


class IncompatibleTokenizersError(ValueError):
    """The target and the drafter do not share one vocabulary."""


def check_compatibility(
    target_tokenizer: PreTrainedTokenizerBase,
    drafter_tokenizer: PreTrainedTokenizerBase | None,
    *,
    target_logits: int,
    drafter_logits: int | None = None,
) -> int:
    """Return the vocabulary size both models' logits are sliced to, or raise.

    `target_logits` and `drafter_logits` are the widths of the two models'
    output layers (`drafter_logits` None: no drafter model). `drafter_tokenizer`
    None means the drafter reads the target's tokenizer.
    """
    size = len(target_tokenizer)
    _check_covers("target", target_logits, size)
    if drafter_logits is not None:
        _check_covers("drafter", drafter_logits, size)
    if drafter_tokenizer is not None and drafter_tokenizer is not target_tokenizer:
        _check_same_tokens(target_tokenizer, drafter_tokenizer)
        _check_same_specials(target_tokenizer, drafter_tokenizer)
    return size


def _check_covers(role: str, logits: int, size: int) -> None:
    if isinstance(logits, bool) or not isinstance(logits, int) or logits < 1:
        raise ValueError(f"{role}_logits must be a positive integer, got {logits!r}")
    if logits < size:
        raise IncompatibleTokenizersError(
            f"the {role} model's logits have {logits} columns but the tokenizer has {size} "
            f"tokens: ids {logits} to {size - 1} could never be predicted"
        )


def _check_same_tokens(target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase) -> None:
    target_size, drafter_size = len(target), len(drafter)
    common = min(target_size, drafter_size)
    target_tokens = target.convert_ids_to_tokens(list(range(target_size)))
    drafter_tokens = drafter.convert_ids_to_tokens(list(range(drafter_size)))
    if target_tokens[:common] != drafter_tokens[:common]:
        first = next(i for i in range(common) if target_tokens[i] != drafter_tokens[i])
        raise IncompatibleTokenizersError(
            f"the target and drafter tokenizers differ at token id {first}: "
            f"target {target_tokens[first]!r}, drafter {drafter_tokens[first]!r}"
        )
    if target_size != drafter_size:
        longer, extra = (
            ("target", target_tokens[common])
            if target_size > common
            else ("drafter", drafter_tokens[common])
        )
        raise IncompatibleTokenizersError(
            f"the target tokenizer has {target_size} tokens and the drafter's {drafter_size}: "
            f"they first differ at token id {common}, which only the {longer} has ({extra!r})"
        )


def _check_same_specials(target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase) -> None:
    for name in SPECIAL_TOKEN_NAMES:
        mine, theirs = _special(target, name), _special(drafter, name)
        if mine != theirs:
            raise IncompatibleTokenizersError(
                f"the target and drafter tokenizers have different {name.replace('_', ' ')}s: "
                f"target {mine!r}, drafter {theirs!r}"
            )
    mine_all, theirs_all = set(target.all_special_tokens), set(drafter.all_special_tokens)
    if mine_all != theirs_all:
        only_target = sorted(mine_all - theirs_all)
        only_drafter = sorted(theirs_all - mine_all)
        raise IncompatibleTokenizersError(
            "the target and drafter tokenizers have different special tokens: "
            f"only the target has {only_target}, only the drafter has {only_drafter}"
        )


def _special(tokenizer: PreTrainedTokenizerBase, name: str) -> Any:
    value = getattr(tokenizer, name, None)
    return None if value is None else str(value)
