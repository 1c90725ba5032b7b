"""Appending the target's answers to a data directory, shard by shard.

For `distill --data DIR`: each new shard gets prompts the target writes
itself (`prompts.write_prompt_batch`, seeded by the run's seed and the shard's
number, none equal to a prompt already in the directory) and, for a share of
them, prompts that hand the target a text it wrote earlier in the directory
with a task (`prompts.document_prompt`: long inputs), the writer's greedy
answers to them (`data.batched_generate`, token ids only: features are
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrepl.engine.widths import processor_name
from specrepl.models.prompting import PromptEncodingError
from specrepl.train.data import DataProgress, ProgressCallback, batched_generate
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
    seed: int = 0
    shard_records: int = 64
    answer_batch: int = 32
    prompt_batch: int = 64
    prompt_tokens: int = 80
    document_share: float = 0.0
    """The share of a shard's prompts that hand the target a text it wrote
    earlier (`prompts.document_prompt`; none while the directory is empty)."""

    @classmethod
    def batched(
        cls,
        answer_batch: int,
        *,
        max_new_tokens: int,
        writer_dtype: str,
        seed: int,
        document_share: float = 0.0,
    ) -> AnswerRecipe:
        """A recipe that answers `answer_batch` prompts at once, in shards of
        twice as many (64 at least), its prompts written as many at a time."""
        return cls(
            max_new_tokens=max_new_tokens,
            writer_dtype=writer_dtype,
            seed=seed,
            shard_records=max(64, 2 * answer_batch),
            answer_batch=answer_batch,
            prompt_batch=max(64, answer_batch),
            document_share=document_share,
        )

    def shard_seed(self, number: int) -> int:
        """The seed of shard `number`'s prompts: each shard draws its own."""
        return self.seed * 1_000_003 + number

    def as_record(self, number: int, documents: int = 0) -> dict[str, Any]:
        """What a shard records of how it was made; `documents`: how many of
        its prompts hand the target a text (DOCUMENT_SOURCE)."""
        with_documents = (
            {"document_prompts": documents, "documents": DOCUMENT_SOURCE} if documents else {}
        )
        return {
            "prompts": PROMPT_SOURCE,
            "prompt_seed": self.shard_seed(number),
            "prompt_max_tokens": self.prompt_tokens,
            **with_documents,
            "answers": "greedy",
            "writer_dtype": self.writer_dtype,
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
) -> tuple[list[list[int]], int]:
    """`recipe.shard_records` encoded prompts for shard `number`, none of them
    in `seen` (which grows by them): a share `recipe.document_share` hand the
    target some of `documents` (texts it wrote earlier) with a task, the rest
    the writer writes itself. Also: how many hand it a text."""
    seed = recipe.shard_seed(number)
    device = next(writer.parameters()).device
    # the sampler draws on the writer's device: a GPU's draws differ from a CPU's
    rng, generator = random.Random(seed), torch.Generator(device=device).manual_seed(seed)
    prompts = _document_prompts(recipe, seed, documents, encode=encode, seen=seen)
    with_documents = len(prompts)
    texts: set[str] = set()
    fruitless = 0
    while len(prompts) < recipe.shard_records:
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
            if _prompt_key(ids) not in seen and len(prompts) < recipe.shard_records:
                seen.add(_prompt_key(ids))
                prompts.append(ids)
        fruitless = fruitless + 1 if len(prompts) == before else 0
        if fruitless >= FRUITLESS_BATCHES:
            raise RuntimeError(
                f"the target wrote no usable prompt in {FRUITLESS_BATCHES} batches in a row"
            )
    return prompts, with_documents


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
) -> DataSummary:
    """Append shards to `data` until it holds `token_budget` answer tokens (the
    shard that passes it is finished); returns what the directory holds."""
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
        prompts, with_documents = _shard_prompts(
            writer,
            tokenizer,
            recipe,
            number,
            encode=encode,
            end_tokens=end_tokens,
            seen=seen,
            documents=documents,
        )
        prompts.sort(key=len)
        records: list[TokenRecord] = []
        for start in range(0, len(prompts), recipe.answer_batch):
            generated = batched_generate(
                writer,
                prompts[start : start + recipe.answer_batch],
                max_new_tokens=recipe.max_new_tokens,
                end_tokens=end_tokens,
                pad_id=pad_id,
                keep_features=False,
            )
            for ids, length in zip(generated.ids, generated.prompt_lengths, strict=True):
                records.append(TokenRecord(ids.numpy(), length))
                tokens += int(ids.shape[0]) - length
            report()
        held.extend(records)
        data.append(
            records,
            recipe=recipe.as_record(number, with_documents),
            cpu_seconds=time.process_time() - cpu,
            wall_seconds=time.perf_counter() - wall,
            cpu=processor_name(next(writer.parameters()).device),
            date=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
            made_by=f"specrepl {__version__}, torch {torch.__version__}",
        )
    return data.summary()
