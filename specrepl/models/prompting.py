"""Prompt building: from what a person typed to the token ids the models continue.

Two rules hold for every text a person or a model wrote (the prompt, the system
prompt, earlier user and assistant turns):

- it is encoded as plain text. A pasted `<|im_end|>` or `<|im_start|>assistant`
  stays characters and can neither end the user's turn nor forge another one;
  only the control tokens that the chat template itself writes become special
  tokens. In chat mode this is the tokenizer's `apply_chat_template(...,
  sanitize_control_tokens=True)` (transformers >= 5.20), which leaves a
  conversation without control-token text byte-identical to the plain
  template. A tokenizer that can only read a control token's text as the
  control token itself (its ordinary vocabulary holds that string) makes the
  text unencodable: `PromptEncodingError`, never a silent special token.
- typed text is cleaned first (`clean_prompt`): terminal escape sequences and
  control characters other than newline and tab are dropped, a carriage
  return (alone or before a newline) becomes a newline, and a lone surrogate
  (undecodable input) becomes U+FFFD. Everything else, emoji, CJK,
  right-to-left scripts, combining marks and zero-width joiners included,
  is kept as typed.

`fit_history` drops a chat's oldest turns when its prompt no longer leaves room
for an answer in the context, and then enough of them to free a quarter of
it, so that the next turns extend what the caches hold instead of reading the
whole chat again.

This module knows nothing about models, generation or the terminal.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = [
    "FREED_WHEN_FULL",
    "CleanedPrompt",
    "PromptEncodingError",
    "chat_prompt_ids",
    "clean_prompt",
    "control_tokens",
    "conversation",
    "fit_history",
    "has_chat_template",
    "printable",
    "prompt_ids",
    "text_prompt_ids",
]

# ESC [ ... final byte (CSI: colours, cursor moves), ESC ] ... BEL or ESC \ (OSC:
# window titles, links), or ESC and one more byte (the other escape sequences)
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])"
)
# C0 controls but tab and newline, DEL, and the C1 controls
_CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")

MessageT = TypeVar("MessageT", bound=Mapping[str, str])


class PromptEncodingError(ValueError):
    """The conversation cannot be encoded with its text kept as plain text."""


@dataclass(frozen=True)
class CleanedPrompt:
    """Typed text after `clean_prompt`, with what cleaning changed."""

    text: str
    removed: int = 0
    """Characters dropped: escape sequences and control characters."""
    replaced: int = 0
    """Lone surrogates (undecodable input) replaced by U+FFFD."""

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.replaced)

    def describe(self) -> str:
        """One line for the user saying what was changed, or "" when nothing was."""
        parts = []
        if self.removed:
            parts.append(
                f"removed {_count(self.removed, 'control character')} (escape sequences and"
                " control characters other than newline and tab are not sent to the model)"
            )
        if self.replaced:
            parts.append(f"replaced {_count(self.replaced, 'undecodable character')} with �")
        return "; ".join(parts)


def clean_prompt(text: str) -> CleanedPrompt:
    """`text` without terminal escape sequences or control characters (see the module)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text, replaced = _SURROGATE.subn("\ufffd", text)
    length = len(text)
    text = _CONTROL_CHARACTER.sub("", _ESCAPE_SEQUENCE.sub("", text))
    return CleanedPrompt(text, removed=length - len(text), replaced=replaced)


def printable(text: str) -> str:
    """`text` safe to show in a terminal: the cleaning of `clean_prompt`, for
    model output (a model that writes an escape sequence must not be able to
    clear the screen or retitle the window)."""
    return clean_prompt(text).text


def control_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The tokenizer's special tokens (text -> id): the ones typed text must never produce."""
    special = {
        token.content: int(token_id)
        for token_id, token in tokenizer.added_tokens_decoder.items()
        if token.special
    }
    for content, token_id in zip(
        tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True
    ):
        special.setdefault(content, int(token_id))
    return special


def chat_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[Mapping[str, str]]
) -> list[int]:
    """The chat template over `messages` plus the generation prompt, message text as plain text.

    Raises PromptEncodingError when a message holds a control token that this
    tokenizer cannot write as plain text, when the installed transformers cannot
    keep message text apart from the template (older than 5.20), or when the
    template refuses the conversation.
    """
    if "sanitize_control_tokens" not in inspect.signature(tokenizer.apply_chat_template).parameters:
        raise PromptEncodingError(
            "the installed transformers cannot encode chat messages as plain text (that needs"
            " transformers 5.20 or later); upgrade it, or turn /chat off"
        )
    for message in messages:
        _check_plain(tokenizer, message["content"], f"the {message['role']} message")
    try:
        ids = tokenizer.apply_chat_template(
            list(messages),
            add_generation_prompt=True,
            return_dict=False,
            sanitize_control_tokens=True,
        )
    except ValueError as error:
        raise PromptEncodingError(
            f"the chat template cannot encode the conversation: {error}"
        ) from error
    return [int(token) for token in ids]


def text_prompt_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as plain text for raw continuation (with the tokenizer's usual start tokens).

    Raises PromptEncodingError when the text holds a control token that this
    tokenizer cannot write as plain text.
    """
    _check_plain(tokenizer, text, "the prompt")
    return [int(token) for token in tokenizer.encode(text, split_special_tokens=True)]


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    chat: bool,
    system_prompt: str | None = None,
    history: Sequence[Mapping[str, str]] = (),
) -> list[int]:
    """The ids a generator continues for `prompt`: with `chat` and a tokenizer
    that has a chat template, the template over the system prompt (if any),
    `history` and the prompt as the user's message; otherwise the prompt as
    plain text. The REPL, `--prompt`, `bench` and `soak` all encode through
    here. Raises PromptEncodingError as the two functions above do."""
    if chat and has_chat_template(tokenizer):
        return chat_prompt_ids(tokenizer, conversation(prompt, system_prompt, history))
    return text_prompt_ids(tokenizer, prompt)


def conversation(
    prompt: str, system_prompt: str | None = None, history: Sequence[Mapping[str, str]] = ()
) -> list[dict[str, str]]:
    """The messages the chat template is applied to: the system prompt (if
    any), `history`, then `prompt` as the user's message."""
    head = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*head, *(dict(message) for message in history), {"role": "user", "content": prompt}]


FREED_WHEN_FULL = 4
"""A chat that outgrows the context drops turns until 1/4 of the context is free
beyond the answer's room (`fit_history`)."""


def fit_history(
    ids: list[int],
    history: Sequence[MessageT],
    encode: Callable[[Sequence[MessageT]], list[int]],
    *,
    room: int,
    context: int | None,
) -> tuple[list[int], list[MessageT], int]:
    """Drop a chat's oldest turns until its prompt leaves `room` new tokens in `context`,
    and a quarter of `context` more (`FREED_WHEN_FULL`).

    `ids` is the prompt encoded with the whole `history` (user messages and their
    answers, in pairs); `encode` encodes it again with a shorter history. The
    oldest turn (a user message with its answer) goes first, until the prompt
    plus `room` fits with that quarter free or no history is left (the prompt
    may then still be too long: the caller refuses it). A chat that fits is
    left whole. Returns the prompt ids, the history kept and how many turns
    were dropped. The REPL and `bench` fit their chats here.

    Why the quarter: each drop changes the start of the prompt, so every cache
    kept between turns is read again from there (for a full context, tens of
    seconds on a 2-core CPU, for the speculative run and the target-only run
    each: docs/chat.md). Dropping only what the next answer needs made every
    later turn of a full chat such a turn; with a quarter free, the next turns
    append to the caches until it is used."""
    kept = list(history)
    dropped = 0
    if context is None or len(ids) + room <= context:
        return ids, kept, dropped
    limit = context - context // FREED_WHEN_FULL
    while kept and len(ids) + room > limit:
        kept = kept[2:]
        dropped += 1
        ids = encode(kept)
    return ids, kept, dropped


def _check_plain(tokenizer: PreTrainedTokenizerBase, text: str, where: str) -> None:
    """Refuse `text` if a control token in it would come out as the control token anyway."""
    present = [
        (text.find(content), content, token_id)
        for content, token_id in control_tokens(tokenizer).items()
        if content and content in text
    ]
    for _, content, token_id in sorted(present):
        as_text = tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
        if token_id in as_text:
            raise PromptEncodingError(
                f"{where} contains {content!r}, which this tokenizer can only read as its"
                " control token, not as text; remove it or write it differently"
            )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
