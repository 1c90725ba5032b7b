"""How a drafter's vocabulary relates to the target's, and the translation between them.

A pair decodes together in one of three ways, decided here when it is
assembled and said in the load table, `/models` and `--json`:

- **one tokenizer**: the same token strings at the same ids (`compatibility.py`'s
  check passes); drafts are the target's ids as they are;
- **the same strings under other ids**: every target token has a drafter
  token of the same string; contexts and drafts are mapped id by id;
- **different tokenizers**: greedy drafts go through text, sampled drafts
  among the tokens both vocabularies hold (`engine.drafters.translated`).

Token strings are compared as the bytes they stand for: byte-level BPE's
characters (GPT-2's byte alphabet), SentencePiece's word marker and its
`<0xNN>` byte tokens are undone first, so that the same text is the same key
in either family; added and special tokens compare by their content.
A drafter that can write too little of the target's text is refused
(`IncompatibleTokenizersError`).

This module knows tokenizers and integers; it knows nothing about models,
devices, decoding or how the pair was loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers import PreTrainedTokenizerBase

from specrepl.engine.drafters.translated import Translation
from specrepl.models.compatibility import IncompatibleTokenizersError, check_compatibility

__all__ = [
    "MIN_SAMPLING_SHARE",
    "MIN_WRITTEN_SHARE",
    "TokenizerCodec",
    "VocabularyMatch",
    "match_vocabularies",
]

MIN_WRITTEN_SHARE = 0.9
"""The least share of the target's tokens whose text the drafter's tokenizer
must write back unchanged (encoded, then decoded) for drafts through text to
mean anything; below it the pair is refused."""

WRITTEN_PROBES = 4000
"""At most this many of the target's tokens (evenly spread) are written
through the drafter's tokenizer to measure `written`."""

MIN_SAMPLING_SHARE = 0.25
"""The least share of the target's tokens the drafter must hold (the same
string) for sampled drafts among them to pay; below it the model drafter does
not draft when sampling, and the pair's description says so."""

WORD_MARKER = "\u2581"
"""SentencePiece's mark for a space before a word."""


class TokenizerCodec:
    """A transformers tokenizer as `translated.TextCodec`: no special tokens
    added, every token's text written out, spaces left as they are."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )


@dataclass(frozen=True)
class VocabularyMatch:
    """How the drafter's vocabulary relates to the target's (module docstring).

    `kind`: "one", "ids" (the same strings under other ids) or "text"
    (different tokenizers). `shared`: target tokens the drafter holds;
    `target_tokens`: the target tokenizer's length; `written`: the share of
    the target's tokens whose text the drafter's tokenizer writes back
    unchanged. `translation` is None for one tokenizer."""

    kind: str
    shared: int
    target_tokens: int
    written: float = 1.0
    translation: Translation | None = None

    @property
    def samples(self) -> bool:
        """Whether sampled drafts among the shared tokens pay (`MIN_SAMPLING_SHARE`)."""
        return self.kind != "text" or self.shared >= MIN_SAMPLING_SHARE * self.target_tokens

    def describe(self) -> str:
        if self.kind == "one":
            return "one tokenizer"
        if self.kind == "ids":
            return "the same tokens under other ids: drafts are mapped id by id"
        share = self.shared / max(self.target_tokens, 1)
        sampled = (
            "sampled drafts among the shared tokens"
            if self.samples
            else "too few shared to sample with: the drafter model does not draft when sampling"
        )
        return (
            f"different tokenizers, {self.shared} of the target's {self.target_tokens} tokens"
            f" shared ({share:.0%}): greedy drafts go through text, {sampled}"
        )

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "shared": self.shared,
            "target_tokens": self.target_tokens,
            "written": round(self.written, 4),
            "description": self.describe(),
        }


def match_vocabularies(
    target: PreTrainedTokenizerBase,
    drafter: PreTrainedTokenizerBase | None,
    *,
    target_logits: int,
    drafter_logits: int | None,
) -> tuple[int, VocabularyMatch | None]:
    """The width both models' logits are compared at (the target tokenizer's
    length) and how the drafter's vocabulary relates to the target's (None
    without a drafter model). Raises IncompatibleTokenizersError where a
    model's logits do not cover its tokenizer or the drafter's tokenizer
    cannot write the target's text."""
    width = check_compatibility(target, None, target_logits=target_logits)
    if drafter_logits is None:
        return width, None
    if drafter is None or drafter is target or _one_tokenizer(target, drafter, target_logits):
        check_compatibility(
            target, None, target_logits=target_logits, drafter_logits=drafter_logits
        )
        return width, VocabularyMatch("one", width, width)
    if drafter_logits < len(drafter):
        raise IncompatibleTokenizersError(
            f"the drafter model's logits have {drafter_logits} columns but its tokenizer has "
            f"{len(drafter)} tokens: ids {drafter_logits} to {len(drafter) - 1} could never be "
            "predicted"
        )
    return width, _translated(target, drafter)


def _one_tokenizer(
    target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase, target_logits: int
) -> bool:
    """Whether the two tokenizers hold the same tokens at the same ids (`compatibility`)."""
    try:
        check_compatibility(target, drafter, target_logits=target_logits)
    except IncompatibleTokenizersError:
        return False
    return True


def _translated(
    target: PreTrainedTokenizerBase, drafter: PreTrainedTokenizerBase
) -> VocabularyMatch:
    target_keys, drafter_keys = token_keys(target), token_keys(drafter)
    drafter_index: dict[object, int] = {}
    for index, key in enumerate(drafter_keys):
        drafter_index.setdefault(key, index)
    drafter_of_target = torch.full((len(target_keys),), -1, dtype=torch.long)
    target_of_drafter = torch.full((len(drafter_keys),), -1, dtype=torch.long)
    for index, key in enumerate(target_keys):
        mine = drafter_index.get(key)
        if mine is not None:
            drafter_of_target[index] = mine
            if target_of_drafter[mine] < 0:
                target_of_drafter[mine] = index
    shared = int((drafter_of_target >= 0).sum())
    by_ids = shared == len(target_keys)
    target_codec, drafter_codec = TokenizerCodec(target), TokenizerCodec(drafter)
    written = 1.0 if by_ids else _written_share(target, target_codec, drafter_codec)
    if written < MIN_WRITTEN_SHARE:
        raise IncompatibleTokenizersError(
            f"the drafter's tokenizer writes back only {written:.0%} of the target's tokens"
            f" unchanged (at least {MIN_WRITTEN_SHARE:.0%} needed to draft through text;"
            f" {shared} of the target's {len(target_keys)} tokens are shared): choose a drafter"
            " whose tokenizer covers the target's text"
        )
    translation = Translation(
        target=target_codec,
        drafter=drafter_codec,
        target_of_drafter=target_of_drafter,
        drafter_of_target=drafter_of_target,
        by_ids=by_ids,
        samples=by_ids or shared >= MIN_SAMPLING_SHARE * len(target_keys),
    )
    return VocabularyMatch(
        "ids" if by_ids else "text", shared, len(target_keys), written, translation
    )


def _written_share(
    target: PreTrainedTokenizerBase, target_codec: TokenizerCodec, drafter: TokenizerCodec
) -> float:
    """The share of the target's (non-special) tokens whose text, encoded by
    the drafter's tokenizer and decoded, comes back unchanged (at most
    `WRITTEN_PROBES` of them, evenly spread)."""
    special = set(target.all_special_ids)
    ids = [i for i in range(len(target)) if i not in special]
    ids = ids[:: max(1, len(ids) // WRITTEN_PROBES)]
    if not ids:
        return 1.0
    kept = 0
    for index in ids:
        text = target_codec.decode([index])
        if not text or "\ufffd" in text:
            kept += 1  # a part of a character: its bytes travel inside whole text
            continue
        kept += drafter.decode(drafter.encode(text)) == text
    return kept / len(ids)


def token_keys(tokenizer: PreTrainedTokenizerBase) -> list[object]:
    """Each id's token as a key two vocabularies can share: the bytes it
    stands for, or ("added", content) for an added or special token."""
    added = {index: str(token) for index, token in tokenizer.added_tokens_decoder.items()}
    strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    style = _string_style(tokenizer)
    keys: list[object] = []
    for index, token in enumerate(strings):
        if index in added:
            keys.append(("added", added[index]))
        elif token is None:
            keys.append(("missing", index))
        else:
            keys.append(_bytes_of(token, style))
    return keys


def _string_style(tokenizer: PreTrainedTokenizerBase) -> str:
    """How the tokenizer writes bytes in its token strings: "bytes" (byte-level
    BPE), "pieces" (SentencePiece's word marker and byte tokens) or "plain"."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "pieces" if any(WORD_MARKER in t for t in tokenizer.get_vocab()) else "plain"
    described = json.dumps(json.loads(backend.to_str()).get("decoder"))
    if "ByteLevel" in described:
        return "bytes"
    if "Metaspace" in described or WORD_MARKER in described or "ByteFallback" in described:
        return "pieces"
    return "plain"


def _bytes_of(token: str, style: str) -> bytes | tuple[str, str]:
    if style == "bytes":
        table = _byte_of_character()
        if all(character in table for character in token):
            return bytes(table[character] for character in token)
        return ("string", token)
    if style == "pieces":
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        return token.replace(WORD_MARKER, " ").encode()
    return token.encode()


@lru_cache(maxsize=1)
def _byte_of_character() -> dict[str, int]:
    """Byte-level BPE's alphabet: the printable character standing for each byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    characters = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {chr(character): byte for byte, character in zip(printable, characters, strict=True)}
