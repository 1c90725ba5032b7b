"""Prompts the target writes itself, for its draft head's training data.

The "Magpie" recipe (Xu et al. 2024, arXiv 2406.08464): the chat template is
rendered up to the start of a user turn, optionally followed by an opening word
("Explain", "Translate into French:", ...), and the target samples the rest of
the user's message. No prompt set is read, so nothing used to measure speed
(Spec-Bench, `benchmarks/dev_prompts.jsonl`, the tests' prompts) can leak into
training.

This module never prints: progress goes through a callback. It knows nothing
of answers, features or training.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrepl.train.data import DataProgress, ProgressCallback, batched_generate

__all__ = [
    "DOCUMENT_SOURCE",
    "DOCUMENT_TASKS",
    "OPENERS",
    "PROMPT_SOURCE",
    "continue_user_turns",
    "document_prompt",
    "make_prompts",
    "read_prompts",
    "user_turn_prefix",
    "write_prompt_batch",
]

PROMPT_SOURCE = (
    "written by the target itself (Magpie-style: the chat template up to a user turn, an opener"
    " from specrepl.train.prompts.OPENERS, sampled at temperature 0.9, top-p 0.95)"
)
"""How the prompts are made, as data records it."""

# Opening words that steer the self-written prompts towards the kinds of
# request people send a chat model. "" leaves the message to the model.
OPENERS: tuple[str, ...] = (
    "",
    "",
    "",
    "",
    "",
    "",
    "Write",
    "Write a short story",
    "Write a poem",
    "Write an email",
    "Write a letter",
    "Explain",
    "Explain how",
    "Explain why",
    "Describe",
    "What is",
    "What are",
    "How do",
    "How can I",
    "Why",
    "Who was",
    "When did",
    "Where",
    "Can you",
    "Could you help me",
    "I need",
    "Please",
    "Summarize",
    "Summarize the following text:",
    "Translate",
    "Translate into French:",
    "Translate into German:",
    "Translate into Spanish:",
    "List",
    "Give me",
    "Suggest",
    "Compare",
    "What is the difference between",
    "Solve",
    "Calculate",
    "If a",
    "A train",
    "John has",
    "Write a Python function",
    "Write a function",
    "How do I write code",
    "Fix this code:",
    "What does this code do?",
    "Extract",
    "From the following text,",
    "Classify",
    "Rewrite",
    "Edit",
    "Imagine you are",
    "Pretend to be",
    "You are a",
    "Act as",
    "Tell me about",
    "What happened",
    "Is it true that",
    "Should I",
    "Create a plan",
    "Give me tips",
    "What are the benefits of",
)


DOCUMENT_SOURCE = (
    "a task from specrepl.train.prompts.DOCUMENT_TASKS over one to three answers the target"
    " wrote earlier in the same data directory (long inputs: summaries, questions on a text,"
    " extraction, rewriting)"
)
"""How prompts with a document are made, as data records it."""

# What people ask of a text they paste. The text is one or more answers the
# target wrote earlier, so nothing outside the data directory is read.
DOCUMENT_TASKS: tuple[str, ...] = (
    "Summarize the following text.",
    "Summarize the text below in two sentences.",
    "What is the main point of this text?",
    "List the key facts in the text below.",
    "Answer using only the text below: what is it about, and why does it matter?",
    "Extract every name, number and date from this text.",
    "Rewrite the following text in simpler words.",
    "Write a title and a one-line description for this text.",
    "Turn the text below into a bulleted list.",
    "What questions does this text leave open?",
    "Translate the first two sentences of this text into French.",
    "Continue the text below with one more paragraph.",
    "Compare the documents below: what do they have in common?",
    "Using the documents below, write a short answer to their common question.",
)


def document_prompt(task: str, documents: Sequence[str]) -> str:
    """A user message that hands the target a text: the task, then the text
    (several are numbered, as a retrieval prompt gives them)."""
    if len(documents) == 1:
        return f"{task}\n\n{documents[0]}"
    body = "\n\n".join(f"Document {i}:\n{text}" for i, text in enumerate(documents, start=1))
    return f"{task}\n\n{body}"


def user_turn_prefix(
    tokenizer: PreTrainedTokenizerBase, conversation: Sequence[Mapping[str, str]] = ()
) -> str:
    """The chat template rendered over `conversation` (earlier messages; none:
    a new chat, with the template's own system prompt) up to where the next
    user message starts."""
    marker = "\u2063USER\u2063"
    messages = [*conversation, {"role": "user", "content": marker}]
    return tokenizer.apply_chat_template(messages, tokenize=False).split(marker, 1)[0]


def continue_user_turns(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prefixes: Sequence[str],
    openers: Sequence[str],
    *,
    generator: torch.Generator,
    end_tokens: Sequence[int],
    max_tokens: int = 96,
    temperature: float = 0.9,
    top_p: float = 0.95,
) -> list[str | None]:
    """The user message the target writes after each of `prefixes` (a chat
    rendered up to a user turn), started with its opener: the text where it
    ended within `max_tokens`, holds no control token and has three words or
    more, else None."""
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(end_tokens))
    )
    ends = set(end_tokens)
    special = set(tokenizer.all_special_ids) | ends
    batch = [
        tokenizer.encode(prefix + opener, add_special_tokens=False)
        for prefix, opener in zip(prefixes, openers, strict=True)
    ]
    generated = batched_generate(
        model,
        batch,
        max_new_tokens=max_tokens,
        end_tokens=end_tokens,
        pad_id=pad_id,
        temperature=temperature,
        top_p=top_p,
        generator=generator,
        keep_features=False,
    )
    messages: list[str | None] = []
    for opener, sequence, start in zip(
        openers, generated.ids, generated.prompt_lengths, strict=True
    ):
        tail = sequence[start:].tolist()
        text = (opener + tokenizer.decode(tail[:-1])).strip() if tail else ""
        usable = (
            bool(tail)
            and tail[-1] in ends  # it ended before running out of tokens
            and not any(token in special for token in tail[:-1])  # plain text only
            and len(text.split()) >= 3
            and "<|" not in text
        )
        messages.append(text if usable else None)
    return messages


def write_prompt_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    rng: random.Random,
    generator: torch.Generator,
    seen: set[str],
    end_tokens: Sequence[int],
    batch_size: int = 32,
    max_tokens: int = 96,
    temperature: float = 0.9,
    top_p: float = 0.95,
) -> list[str]:
    """One batch of user messages the target writes itself (each started with
    an opener drawn by `rng`, see `continue_user_turns`) that are not in
    `seen` (which grows by them)."""
    prefix = user_turn_prefix(tokenizer)
    openers = [rng.choice(OPENERS) for _ in range(batch_size)]
    written = continue_user_turns(
        model,
        tokenizer,
        [prefix] * batch_size,
        openers,
        generator=generator,
        end_tokens=end_tokens,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
    )
    fresh: list[str] = []
    for text in written:
        if text is not None and text not in seen:
            seen.add(text)
            fresh.append(text)
    return fresh


def make_prompts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    count: int,
    path: Path,
    *,
    seed: int = 0,
    batch_size: int = 32,
    max_tokens: int = 96,
    temperature: float = 0.9,
    top_p: float = 0.95,
    end_tokens: Sequence[int],
    progress: ProgressCallback | None = None,
) -> list[str]:
    """Have the target write `count` distinct user messages; appends to
    `path` (JSON lines) and resumes from what it already holds."""
    prompts = read_prompts(path)
    seen = set(prompts)
    rng = random.Random(seed + len(prompts))
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed + len(prompts))
    while len(prompts) < count:
        fresh = write_prompt_batch(
            model,
            tokenizer,
            rng=rng,
            generator=generator,
            seen=seen,
            end_tokens=end_tokens,
            batch_size=batch_size,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
        )
        fresh = fresh[: count - len(prompts)]
        with path.open("a", encoding="utf-8") as handle:
            for text in fresh:
                handle.write(json.dumps({"prompt": text}, ensure_ascii=False) + "\n")
        prompts.extend(fresh)
        if progress is not None:
            progress(DataProgress("prompts", len(prompts), count))
    return prompts[:count]


def read_prompts(path: Path) -> list[str]:
    """The prompts in a JSON-lines file (`{"prompt": ...}` a line); [] if absent.
    A last line cut short by an interruption is ignored."""
    if not path.exists():
        return []
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            prompts.append(json.loads(line)["prompt"])
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return prompts
