"""Second turns for a draft head's data: the user asks again, the target answers.

A chat (the REPL, Spec-Bench's second turns) asks the target to answer after
an earlier question and its own answer, and a draft head trained on first
turns only has never drafted there. So a share of a shard's prompts are
follow-ups: one of the shard's own first turns the target wrote itself, with
the answer the writer just gave it, then a next user message the target
writes itself (Magpie again, over the conversation, started with an opener
from `FOLLOW_UP_OPENERS`). The writer then answers the whole conversation like
any prompt. Nothing outside the data directory is read.

This module makes those prompts; `accumulate.py` answers them and writes the
shard. It knows nothing of shards, features or training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrepl.models.prompting import PromptEncodingError
from specrepl.train.prompts import continue_user_turns, user_turn_prefix

__all__ = ["FOLLOW_UP_OPENERS", "FOLLOW_UP_SOURCE", "Answered", "follow_up_prompts"]

FOLLOW_UP_SOURCE = (
    "a next user message written by the target itself (Magpie-style, after one of the shard's"
    " self-written first turns and the writer's answer to it, an opener from"
    " specrepl.train.follow_ups.FOLLOW_UP_OPENERS, sampled at temperature 0.9, top-p 0.95)"
)
"""How follow-up prompts are made, as data records it."""

# What people send after an answer. "" leaves the message to the model.
FOLLOW_UP_OPENERS: tuple[str, ...] = (
    "",
    "",
    "",
    "",
    "Thanks!",
    "Can you",
    "Could you",
    "Why",
    "How",
    "What about",
    "What if",
    "Now",
    "Make it",
    "Rewrite it",
    "Shorter, please.",
    "Give me an example",
    "Explain",
    "And",
    "Are you sure",
    "Translate your answer into French.",
)

Conversation = Sequence[Mapping[str, str]]


@dataclass(frozen=True)
class Answered:
    """A first turn the target wrote itself and the writer's answer to it."""

    question: str
    answer_ids: Sequence[int]
    ended: bool
    """The answer ended with an end token (not cut at the length limit)."""


def follow_up_prompts(
    writer: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    answered: Sequence[Answered],
    wanted: int,
    *,
    seed: int,
    encode_chat: Callable[[Conversation], list[int]],
    end_tokens: Sequence[int],
    max_tokens: int = 80,
    min_answer_tokens: int = 16,
) -> list[list[int]]:
    """Up to `wanted` encoded follow-up prompts: drawn (with `seed`) among the
    first turns of `answered` whose answer ended and holds at least
    `min_answer_tokens` tokens, each the conversation so far plus a next user
    message the writer wrote itself. Fewer where the writer's messages were
    unusable or a conversation does not encode."""
    usable = [a for a in answered if a.ended and len(a.answer_ids) > min_answer_tokens]
    if wanted <= 0 or not usable:
        return []
    rng = random.Random(seed * 7 + 2)  # apart from the shard's other draws
    device = next(writer.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed * 7 + 2)
    chosen = rng.sample(usable, min(wanted, len(usable)))
    conversations = [
        [
            {"role": "user", "content": a.question},
            {"role": "assistant", "content": tokenizer.decode(list(a.answer_ids)[:-1]).strip()},
        ]
        for a in chosen
    ]
    openers = [rng.choice(FOLLOW_UP_OPENERS) for _ in conversations]
    written = continue_user_turns(
        writer,
        tokenizer,
        [user_turn_prefix(tokenizer, conversation) for conversation in conversations],
        openers,
        generator=generator,
        end_tokens=end_tokens,
        max_tokens=max_tokens,
    )
    prompts: list[list[int]] = []
    for conversation, message in zip(conversations, written, strict=True):
        if message is None:
            continue
        try:
            prompts.append(encode_chat([*conversation, {"role": "user", "content": message}]))
        except PromptEncodingError:
            continue
    return prompts
