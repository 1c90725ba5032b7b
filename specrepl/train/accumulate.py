"""Appending the target's answers to a data directory, shard by shard.

For `distill --data DIR`: each new shard gets prompts the target writes
itself (`prompts.write_prompt_batch`, seeded by the run's seed and the shard's
number, none equal to a prompt already in the directory) and, for a share of
them, prompts that hand the target a text it wrote earlier in the directory
with a task (`prompts.document_prompt`: long inputs), for another share
follow-ups to the shard's own first turns (`follow_ups.py`: second turns of a
chat), the writer's greedy answers to them (`data.batched_generate`, token ids only: features are
recomputed at training time), and is appended to the directory
(`shards.TokenData.append`) with the CPU time it took. It stops once the
directory holds the answer tokens asked for; an interruption loses the shard in
progress only, and the next run appends after the last whole shard.

It knows nothing of training or of the terminal: progress goes through a
callback, with the answer tokens per second of this run and the time left.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrepl.engine.widths import processor_name
from specrepl.models.prompting import PromptEncodingError
from specrepl.train.data import DataProgress, ProgressCallback, batched_generate
from specrepl.train.follow_ups import FOLLOW_UP_SOURCE, Answered, Conversation, follow_up_prompts
from specrepl.train.prompts import (
    DOCUMENT_SOURCE,
    DOCUMENT_TASKS,
    PROMPT_SOURCE,
    document_prompt,
    write_prompt_batch,
)
from specrepl.train.shards import DataSummary, TokenData, TokenRecord
from specrepl.version import __version__

__all__ = [
    "AnswerRecipe",
    "accumulate_answers",
    "answer_batch_for",
    "earlier_answers",
    "rate_and_time_left",
]

FRUITLESS_BATCHES = 20
"""Prompt batches in a row without one usable prompt before giving up."""


@dataclass(frozen=True)
class AnswerRecipe:
    """How a shard's prompts and answers are made (recorded with each shard)."""

    max_new_tokens: int = 256
    writer_dtype: str = "float32"
    writer_form: str = "stock"
    """How the writer's linear layers multiplied: `stock` or `packed`
    (`writer.py`; the same answers up to rounding, like any change of kernel)."""
    seed: int = 0
    shard_records: int = 64
    answer_batch: int = 32
    prompt_batch: int = 64
    prompt_tokens: int = 80
    document_share: float = 0.0
    """The share of a shard's prompts that hand the target a text it wrote
    earlier (`prompts.document_prompt`; none while the directory is empty)."""
    follow_up_share: float = 0.0
    """The share of a shard's prompts that follow up one of its own first
    turns and the answer to it (`follow_ups.py`)."""

    @classmethod
    def batched(
        cls,
        answer_batch: int,
        *,
        max_new_tokens: int,
        writer_dtype: str,
        seed: int,
        writer_form: str = "stock",
        document_share: float = 0.0,
        follow_up_share: float = 0.0,
    ) -> AnswerRecipe:
        """A recipe that answers `answer_batch` prompts at once, in shards of
        twice as many (64 at least), its prompts written as many at a time."""
        return cls(
            max_new_tokens=max_new_tokens,
            writer_dtype=writer_dtype,
            writer_form=writer_form,
            seed=seed,
            shard_records=max(64, 2 * answer_batch),
            answer_batch=answer_batch,
            prompt_batch=max(64, answer_batch),
            document_share=document_share,
            follow_up_share=follow_up_share,
        )

    def follow_ups_wanted(self) -> int:
        """How many of a shard's prompts are follow-ups."""
        return round(self.follow_up_share * self.shard_records)

    def shard_seed(self, number: int) -> int:
        """The seed of shard `number`'s prompts: each shard draws its own."""
        return self.seed * 1_000_003 + number

    def as_record(self, number: int, documents: int = 0, follow_ups: int = 0) -> dict[str, Any]:
        """What a shard records of how it was made; `documents`: how many of
        its prompts hand the target a text (DOCUMENT_SOURCE), `follow_ups`:
        how many follow up an earlier turn (FOLLOW_UP_SOURCE)."""
        with_documents = (
            {"document_prompts": documents, "documents": DOCUMENT_SOURCE} if documents else {}
        )
        if follow_ups:
            with_documents |= {"follow_up_prompts": follow_ups, "follow_ups": FOLLOW_UP_SOURCE}
        return {
            "prompts": PROMPT_SOURCE,
            "prompt_seed": self.shard_seed(number),
            "prompt_max_tokens": self.prompt_tokens,
            **with_documents,
            "answers": "greedy",
            "writer_dtype": self.writer_dtype,
            "writer_form": self.writer_form,
            "max_new_tokens": self.max_new_tokens,
            "seed": self.seed,
        }


def answer_batch_for(device: torch.device) -> int:
    """Answers written at once by default: 32 on a CPU (more rows cost time
    in proportion there), 512 on a GPU (a step costs about the same for 1 or
    512 rows of a small target, so wide batches buy throughput)."""
    return 512 if device.type == "cuda" else 32


def rate_and_time_left(
    start_tokens: int, tokens: int, budget: int, seconds: float
) -> tuple[float | None, float | None]:
    """This run's answer tokens per second and the seconds left to `budget` at
    that rate; (None, None) before anything was made."""
    made = tokens - start_tokens
    if made <= 0 or seconds <= 0:
        return None, None
    rate = made / seconds
    return rate, max(0, budget - tokens) / rate


def _prompt_key(ids: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(ids, dtype=np.uint32).tobytes()


def _shard_prompts(
    writer: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    recipe: AnswerRecipe,
    number: int,
    *,
    encode: Callable[[str], list[int]],
    end_tokens: Sequence[int],
    seen: set[bytes],
    documents: Sequence[str] = (),
) -> tuple[list[list[int]], int, dict[bytes, str]]:
    """`recipe.shard_records` encoded prompts for shard `number` but the
    follow-ups it wants (made once these are answered), none of them in
    `seen` (which grows by them): a share `recipe.document_share` hand the
    target some of `documents` (texts it wrote earlier) with a task, the rest
    the writer writes itself. Also: how many hand it a text, and the text of
    each self-written one by its prompt's key."""
    seed = recipe.shard_seed(number)
    device = next(writer.parameters()).device
    # the sampler draws on the writer's device: a GPU's draws differ from a CPU's
    rng, generator = random.Random(seed), torch.Generator(device=device).manual_seed(seed)
    prompts = _document_prompts(recipe, seed, documents, encode=encode, seen=seen)
    with_documents = len(prompts)
    texts: set[str] = set()
    questions: dict[bytes, str] = {}
    fruitless = 0
    first_turns = recipe.shard_records - recipe.follow_ups_wanted()
    while len(prompts) < first_turns:
        fresh = write_prompt_batch(
            writer,
            tokenizer,
            rng=rng,
            generator=generator,
            seen=texts,
            end_tokens=end_tokens,
            batch_size=recipe.prompt_batch,
            max_tokens=recipe.prompt_tokens,
        )
        before = len(prompts)
        for text in fresh:
            try:
                ids = encode(text)
            except PromptEncodingError:
                continue
            if _prompt_key(ids) not in seen and len(prompts) < first_turns:
                seen.add(_prompt_key(ids))
                questions[_prompt_key(ids)] = text
                prompts.append(ids)
        fruitless = fruitless + 1 if len(prompts) == before else 0
        if fruitless >= FRUITLESS_BATCHES:
            raise RuntimeError(
                f"the target wrote no usable prompt in {FRUITLESS_BATCHES} batches in a row"
            )
    return prompts, with_documents, questions


def _document_prompts(
    recipe: AnswerRecipe,
    seed: int,
    documents: Sequence[str],
    *,
    encode: Callable[[str], list[int]],
    seen: set[bytes],
) -> list[list[int]]:
    """round(document_share x shard_records) encoded prompts, each a task of
    DOCUMENT_TASKS over one text of `documents` (two or three for a task that
    names documents), drawn with the shard's seed; none when there are fewer
    than three documents."""
    wanted = round(recipe.document_share * recipe.shard_records)
    if wanted == 0 or len(documents) < 3:
        return []
    rng = random.Random(seed * 7 + 1)  # apart from the self-written prompts' draws
    prompts: list[list[int]] = []
    for _ in range(4 * wanted):  # a prompt too long for the target is drawn again
        if len(prompts) == wanted:
            break
        task = rng.choice(DOCUMENT_TASKS)
        count = rng.choice((2, 3)) if "documents" in task else 1
        try:
            ids = encode(document_prompt(task, rng.sample(list(documents), count)))
        except PromptEncodingError:
            continue
        if _prompt_key(ids) not in seen:
            seen.add(_prompt_key(ids))
            prompts.append(ids)
    return prompts


def earlier_answers(
    records: Iterable[TokenRecord],
    tokenizer: PreTrainedTokenizerBase,
    end_tokens: Sequence[int],
    *,
    limit: int = 4096,
    min_tokens: int = 32,
) -> list[str]:
    """Up to `limit` answers of `records` (those already in the directory)
    that ended (an end token) and hold at least `min_tokens` tokens, as text:
    the documents of prompts that hand the target a text. Drawn evenly over
    the records, in their order."""
    ends = set(end_tokens)
    answers = [
        record.ids[record.prompt_length : -1]
        for record in records
        if int(record.ids[-1]) in ends and len(record.ids) - record.prompt_length > min_tokens
    ]
    chosen = answers[:: max(1, len(answers) // limit)][:limit]
    texts = [tokenizer.decode(ids.tolist(), skip_special_tokens=True).strip() for ids in chosen]
    return [text for text in texts if text]


def accumulate_answers(
    writer: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: TokenData,
    *,
    token_budget: int,
    recipe: AnswerRecipe,
    encode: Callable[[str], list[int]],
    end_tokens: Sequence[int],
    pad_id: int,
    progress: ProgressCallback | None = None,
    on_message: Callable[[str], None] | None = None,
    encode_chat: Callable[[Conversation], list[int]] | None = None,
) -> DataSummary:
    """Append shards to `data` until it holds `token_budget` answer tokens (the
    shard that passes it is finished); returns what the directory holds.
    Follow-ups (`recipe.follow_up_share`) need `encode_chat`, which encodes a
    conversation as `encode` does one user message."""
    if encode_chat is None:  # no follow-ups can be encoded: every prompt a first turn
        recipe = replace(recipe, follow_up_share=0.0)
    held = list(data.records(on_message))  # grows by each shard written: read once
    seen = {_prompt_key(record.ids[: record.prompt_length]) for record in held}
    start_tokens = tokens = data.summary().answer_tokens
    began = time.perf_counter()

    def report() -> None:
        if progress is not None:
            rate, left = rate_and_time_left(
                start_tokens, tokens, token_budget, time.perf_counter() - began
            )
            progress(
                DataProgress("answer tokens", tokens, token_budget, tokens, rate, left),
            )

    report()
    documents: list[str] = []
    while tokens < token_budget:
        if recipe.document_share > 0:  # the answers there now
            documents = earlier_answers(held, tokenizer, end_tokens)
        number = int(data.next_file().removeprefix("shard-").removesuffix(".npz"))
        wall, cpu = time.perf_counter(), time.process_time()
        prompts, with_documents, questions = _shard_prompts(
            writer,
            tokenizer,
            recipe,
            number,
            encode=encode,
            end_tokens=end_tokens,
            seen=seen,
            documents=documents,
        )
        records: list[TokenRecord] = []
        for record in _shard_records(
            writer,
            tokenizer,
            recipe,
            number,
            prompts,
            questions,
            seen,
            encode_chat=encode_chat,
            end_tokens=end_tokens,
            pad_id=pad_id,
        ):
            records.append(record)
            tokens += len(record.ids) - record.prompt_length
            report()
        follow_ups = len(records) - len(prompts)
        held.extend(records)
        data.append(
            records,
            recipe=recipe.as_record(number, with_documents, follow_ups),
            cpu_seconds=time.process_time() - cpu,
            wall_seconds=time.perf_counter() - wall,
            cpu=processor_name(next(writer.parameters()).device),
            date=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            made_by=f"specrepl {__version__}, torch {torch.__version__}",
        )
    return data.summary()


def _shard_records(
    writer: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    recipe: AnswerRecipe,
    number: int,
    prompts: list[list[int]],
    questions: dict[bytes, str],
    seen: set[bytes],
    *,
    encode_chat: Callable[[Conversation], list[int]] | None,
    end_tokens: Sequence[int],
    pad_id: int,
) -> Iterator[TokenRecord]:
    """The shard's records: the answers to `prompts`, then to the follow-ups
    of its self-written first turns (`questions`) where the recipe wants
    them (none without `encode_chat`); `seen` grows by the follow-ups."""
    first_turns = []
    for record in _answers(writer, prompts, recipe, end_tokens, pad_id):
        first_turns.append(record)
        yield record
    if encode_chat is None or not recipe.follow_ups_wanted():
        return
    follow_ups = follow_up_prompts(
        writer,
        tokenizer,
        _answered(first_turns, questions, end_tokens),
        recipe.follow_ups_wanted(),
        seed=recipe.shard_seed(number),
        encode_chat=encode_chat,
        end_tokens=end_tokens,
        max_tokens=recipe.prompt_tokens,
    )
    follow_ups = [ids for ids in follow_ups if _prompt_key(ids) not in seen]
    seen.update(_prompt_key(ids) for ids in follow_ups)
    yield from _answers(writer, follow_ups, recipe, end_tokens, pad_id)


def _answers(
    writer: PreTrainedModel,
    prompts: list[list[int]],
    recipe: AnswerRecipe,
    end_tokens: Sequence[int],
    pad_id: int,
) -> Iterator[TokenRecord]:
    """The writer's greedy answers to `prompts`, as records, `recipe.answer_batch`
    at a time (shortest prompts first: less padding)."""
    ordered = sorted(prompts, key=len)
    for start in range(0, len(ordered), recipe.answer_batch):
        generated = batched_generate(
            writer,
            ordered[start : start + recipe.answer_batch],
            max_new_tokens=recipe.max_new_tokens,
            end_tokens=end_tokens,
            pad_id=pad_id,
            keep_features=False,
        )
        for ids, length in zip(generated.ids, generated.prompt_lengths, strict=True):
            yield TokenRecord(ids.numpy(), length)


def _answered(
    records: Sequence[TokenRecord], questions: dict[bytes, str], end_tokens: Sequence[int]
) -> list[Answered]:
    """The records whose prompt the writer wrote itself, with that prompt's text."""
    ends = set(end_tokens)
    answered = []
    for record in records:
        question = questions.get(_prompt_key(record.ids[: record.prompt_length]))
        if question is not None:
            answer = record.ids[record.prompt_length :].tolist()
            answered.append(Answered(question, answer, bool(answer) and answer[-1] in ends))
    return answered
