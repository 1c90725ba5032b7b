"""`python infer.py distill`: train a draft head for the target, start to finish.

The stages, each resumable from its files in the work directory:
prompts the target writes (`prompts.make_prompts`), its greedy answers and
features (`data.make_answers`), training (`training.train_head`), then a head
directory (`head_store.save_head`) that records the target's fingerprint, the
draft vocabulary, the data, the settings, the time spent and the held-back
agreement. Rerunning the same command after Ctrl-C or a crash continues where
it stopped.

With `--data DIR` the answers are token ids in compact shards that can live
in a repository (`shards.py`), appended by `accumulate.accumulate_answers`,
and training recomputes the target's features from them, resuming from the
compact checkpoint kept with them (`checkpoint.py`, `--checkpoint`);
`--data-only` makes the data and stops.

This module runs the subcommand (`run(args, front)`; its flags are declared in
`options.py` and re-exported here for the command line): the target comes
from the application's front door and everything shown goes through the
front's view (app/front.py, app/render/distill.py), so it does not print. It
knows nothing about decoding.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from specrepl.engine.drafters.draft_head import head_parameters
from specrepl.engine.drafters.head_store import (
    HeadLoadError,
    load_head,
    save_head,
    target_fingerprint,
)
from specrepl.engine.signals import EXIT_OK, EXIT_USAGE
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import chat_prompt_ids
from specrepl.store.exclusive import Busy, held_exclusively
from specrepl.store.paths import distill_root
from specrepl.train.accumulate import AnswerRecipe, accumulate_answers, answer_batch_for
from specrepl.train.checkpoint import CheckpointRefused, start_from_head
from specrepl.train.data import DataProgress, load_shards, make_answers
from specrepl.train.options import (
    DistillOptions,
    add_arguments,
    check_arguments,
    options_from_args,
)
from specrepl.train.prompts import PROMPT_SOURCE, make_prompts
from specrepl.train.shards import DataRefused, DataSummary, TokenData
from specrepl.train.training import TrainProgress, batch_sequences_for, train_head
from specrepl.train.writer import choose_writer
from specrepl.version import __version__

__all__ = [
    "DistillFront",
    "DistillOptions",
    "DistillView",
    "add_arguments",
    "check_arguments",
    "distill",
    "open_data",
    "options_from_args",
    "run",
    "training_records",
    "write_data",
]

ANSWERS_LOCK = ".answers.lock"
"""Held in a data directory by the one process appending answers to it."""

TRAINING_LOCK = ".training.lock"
"""Held in a checkpoint (or work) directory by the one process training from it."""


def _chat_encoder(pair: ModelPair) -> Callable[[Sequence[Mapping[str, str]]], list[int]]:
    """Encodes a conversation as the target reads it (`chat_prompt_ids`)."""
    return functools.partial(chat_prompt_ids, pair.tokenizer)


def _encoder(pair: ModelPair) -> Callable[[str], list[int]]:
    """Encodes one user message: a conversation of one turn."""
    encode_chat = _chat_encoder(pair)
    return lambda text: encode_chat([{"role": "user", "content": text}])


def _pad_id(pair: ModelPair) -> int:
    tokenizer = pair.tokenizer
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else pair.eos_token_ids[0]


def open_data(pair: ModelPair, directory: Path) -> TokenData:
    """The data directory for this target; DataRefused for another target's."""
    return TokenData.open(
        directory,
        name=pair.target.name,
        fingerprint=target_fingerprint(pair.target.model),
        vocab_size=pair.vocab_size,
    )


def write_data(
    pair: ModelPair,
    options: DistillOptions,
    *,
    on_data: Callable[[DataProgress], None] | None = None,
    on_message: Callable[[str], None] | None = None,
) -> TokenData:
    """Append answers to `options.data` until it holds `options.data_tokens`
    answer tokens; the directory, opened."""
    say = on_message or (lambda message: None)
    if options.data is None:
        raise ValueError("write_data needs a data directory (options.data)")
    data = open_data(pair, options.data)
    if data.summary().answer_tokens >= options.data_tokens:
        return data
    with held_exclusively(options.data / ANSWERS_LOCK, "distill writing answers"):
        data = open_data(pair, options.data)  # read again: another writer may have appended
        if data.summary().answer_tokens < options.data_tokens:
            _append_answers(pair, options, data, on_data, say)
    return data


def _append_answers(
    pair: ModelPair,
    options: DistillOptions,
    data: TokenData,
    on_data: Callable[[DataProgress], None] | None,
    say: Callable[[str], None],
) -> None:
    """Append the target's answers to `data` up to `options.data_tokens`."""
    target = pair.target.model
    batch = options.answer_batch or answer_batch_for(next(target.parameters()).device)
    writer = choose_writer(
        target,
        options.writer_dtype,
        attention=pair.target.tuning.attention,
        rows=batch,
        answer_tokens=options.max_new_tokens // 2,
    )
    say(
        f"answers are written by the target in {writer.label} ({_timed(writer.timed)}),"
        f" as token ids into {options.data}"
    )
    recipe = AnswerRecipe.batched(
        batch,
        max_new_tokens=options.max_new_tokens,
        writer_dtype=writer.dtype,
        writer_form=writer.form,
        seed=options.seed,
        document_share=options.document_share,
        follow_up_share=options.follow_up_share,
    )
    try:
        with writer.writing():
            accumulate_answers(
                writer.model,
                pair.tokenizer,
                data,
                token_budget=options.data_tokens,
                recipe=recipe,
                encode=_encoder(pair),
                end_tokens=pair.eos_token_ids,
                pad_id=_pad_id(pair),
                progress=on_data,
                on_message=say,
                encode_chat=_chat_encoder(pair),
            )
    finally:
        writer.release()


def _timed(timed: dict[str, float]) -> str:
    """What the candidate writers measured, for one line of output."""
    return "; ".join(f"{label} {seconds:.1f} s a batch" for label, seconds in timed.items())


def _cache_data(
    pair: ModelPair,
    options: DistillOptions,
    on_data: Callable[[DataProgress], None] | None,
    say: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Prompts, answers and features in the work directory: the records, and
    how they were made."""
    target, tokenizer = pair.target.model, pair.tokenizer
    writer = choose_writer(
        target,
        options.writer_dtype,
        attention=pair.target.tuning.attention,
        answer_tokens=options.max_new_tokens // 2,
    )
    say(
        f"answers are written by the target in {writer.label} ({_timed(writer.timed)});"
        " features come from the target"
    )
    try:
        with writer.writing():
            prompts = make_prompts(
                writer.model,
                tokenizer,
                options.prompts,
                options.work / "prompts.jsonl",
                seed=options.seed,
                end_tokens=pair.eos_token_ids,
                batch_size=64,
                max_tokens=80,
                progress=on_data,
            )
            make_answers(
                writer.model,
                target,
                prompts,
                options.work,
                encode=_encoder(pair),
                end_tokens=pair.eos_token_ids,
                pad_id=_pad_id(pair),
                max_new_tokens=options.max_new_tokens,
                token_budget=options.data_tokens,
                progress=on_data,
                on_message=say,
            )
    finally:
        writer.release()
    made = {
        "max_new_tokens": options.max_new_tokens,
        "answers": f"greedy, written in {writer.label}",
    }
    return list(load_shards(options.work)), made


def training_records(
    data: TokenData, on_damaged: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The records of a data directory as training reads them: ids (int64),
    the prompt's length, and the record's place (shard number, index)."""
    return [
        {
            "ids": torch.from_numpy(record.ids.astype(np.int64)),
            "prompt_length": record.prompt_length,
            "shard": shard,
            "index": index,
        }
        for shard, index, record in data.numbered_records(on_damaged)
    ]


def _directory_data(
    pair: ModelPair,
    options: DistillOptions,
    on_data: Callable[[DataProgress], None] | None,
    say: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Answers appended to the data directory, read back as records of ids
    (their features are computed in training), and how they were made."""
    data = write_data(pair, options, on_data=on_data, on_message=say)
    records = training_records(data, say)
    recipes = [shard.recipe for shard in data.shards]
    dtypes = sorted({str(recipe.get("writer_dtype")) for recipe in recipes})
    summary = data.summary()
    made = {
        "max_new_tokens": max((int(r.get("max_new_tokens", 0)) for r in recipes), default=0),
        "answers": f"greedy, written in {', '.join(dtypes)}",
        "directory": str(summary.directory),
        "shards": summary.shards,
        "cpu_seconds": summary.cpu_seconds,
        "cpu": sorted({shard.cpu for shard in data.shards}),
    }
    return records, made


def _start_from_head(pair: ModelPair, options: DistillOptions, say: Callable[[str], None]) -> None:
    """The checkpoint starts as `options.from_head`'s weights, unless one is
    there already (HeadLoadError: a head for another target)."""
    assert options.from_head is not None and options.checkpoint is not None
    target = pair.target.model
    head, _ = load_head(options.from_head, target)
    about = {
        "name": pair.target.name,
        "fingerprint": target_fingerprint(target),
        "vocab_size": pair.vocab_size,
    }
    written = start_from_head(
        options.checkpoint,
        head,
        target=about,
        settings=options.train.as_dict(),
        source=str(options.from_head),
    )
    if written:
        say(f"training starts from the head in {options.from_head}")
    else:
        say(f"--from-head ignored: {options.checkpoint} holds a checkpoint, resumed instead")


def distill(
    pair: ModelPair,
    options: DistillOptions,
    *,
    on_data: Callable[[DataProgress], None] | None = None,
    on_train: Callable[[TrainProgress], None] | None = None,
    on_message: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every stage; returns the head's description (also in its head.json)."""
    say = on_message or (lambda message: None)
    target = pair.target.model
    if not options.train.batch_sequences:  # 0: by the device the target is on
        per_step = batch_sequences_for(next(target.parameters()).device)
        options = replace(options, train=replace(options.train, batch_sequences=per_step))
    options.work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    make = _cache_data if options.data is None else _directory_data
    records, made = make(pair, options, on_data, say)
    data_seconds = time.perf_counter() - began
    if not records:
        raise RuntimeError(f"no training data in {options.data or options.work}")
    answer_tokens = sum(int(r["ids"].shape[0]) - int(r["prompt_length"]) for r in records)
    say(f"training on {len(records)} answers, {answer_tokens} answer tokens")
    checkpoint_directory = options.checkpoint if options.data is not None else None
    with held_exclusively(
        (checkpoint_directory or options.work) / TRAINING_LOCK, "distill training a head"
    ):
        if options.from_head is not None and options.checkpoint is not None:
            _start_from_head(pair, options, say)
        state = train_head(
            target,
            records,
            options.train,
            options.work,
            end_tokens=pair.eos_token_ids,
            vocab_size=pair.vocab_size,
            progress=on_train,
            on_message=say,
            checkpoint_directory=checkpoint_directory,
        )
    description = {
        "target": {
            "name": pair.target.name,
            "architecture": type(target).__name__,
            "hidden_size": int(target.config.get_text_config().hidden_size),
            "vocab_size": pair.vocab_size,
            "fingerprint": target_fingerprint(target),
        },
        "draft_vocab": int(state.head.token_ids.shape[0]),
        "parameters": head_parameters(state.head),
        "data": {
            "prompts": PROMPT_SOURCE,
            "prompt_count": len(records),
            "answer_tokens": answer_tokens,
            **made,
            "seed": options.seed,
        },
        "training": {
            **options.train.as_dict(),
            "seconds": round(state.seconds, 1),
            "tokens": state.tokens,
            "steps": state.steps,
            **state.history,
        },
        "data_seconds": round(data_seconds, 1),
        "held_back_agreement": [round(a, 4) for a in state.agreement],
        "made_by": f"specrepl {__version__}, torch {torch.__version__}",
        "made_on": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
    }
    save_head(state.head, options.output, description)
    return description


class DistillView(Protocol):
    """What `run` draws (app/render/distill.py's `DistillRenderer` has it)."""

    def fatal(self, message: str) -> None: ...

    def note(self, message: str) -> None: ...

    def distill_progress(
        self,
    ) -> AbstractContextManager[
        tuple[Callable[[DataProgress], None], Callable[[TrainProgress], None]]
    ]: ...

    def distilled(self, description: dict[str, Any], output: str) -> None: ...

    def data_written(self, summary: DataSummary, run_cpu_seconds: float) -> None: ...


class DistillFront(Protocol):
    """The command line's side of `distill` (app/front.py's `Front`)."""

    @property
    def view(self) -> DistillView: ...

    def load_target(self) -> ModelPair | int:
        """The config's target alone, loaded as every entry point loads it, or the
        exit status after the message (a bad flag or config, a target that cannot
        load). Ctrl-C is left to the caller."""
        ...

    def stopped(self, message: str) -> int:
        """Say that Ctrl-C ended the command; the exit status to return (130)."""
        ...


def run(args: argparse.Namespace, front: DistillFront) -> int:
    """`python infer.py distill`: the target loaded, the flags checked, every stage
    under progress bars, and what was written.

    Exit status: 0; 1 (the target cannot be loaded); 2 (a bad flag or config,
    a --data directory that holds another target's data or does not read, a
    checkpoint made for another target or head shape, a --from-head head made
    for another target, a data or checkpoint directory another distill is
    writing to); 130 (Ctrl-C: the last checkpoint and every whole shard are kept, the same
    command resumes).
    """
    view = front.view
    try:
        check_arguments(args)
        pair = front.load_target()
        if isinstance(pair, int):
            return pair
        options = options_from_args(args, distill_root() / target_fingerprint(pair.target.model))
    except ValueError as error:
        view.fatal(f"distill: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return front.stopped("Interrupted while loading the target.")
    if options.data_only:
        view.note(f"distill: data directory {options.data} (rerun the same command to resume)")
    elif options.data is not None:
        view.note(
            f"distill: data directory {options.data}, checkpoint in {options.checkpoint}"
            " (rerun the same command, here or elsewhere, to resume)"
        )
    else:
        view.note(f"distill: work directory {options.work} (rerun the same command to resume)")
    cpu = time.process_time()
    try:
        with view.distill_progress() as (on_data, on_train):
            if options.data_only:
                data = write_data(pair, options, on_data=on_data, on_message=view.note)
            else:
                description = distill(
                    pair, options, on_data=on_data, on_train=on_train, on_message=view.note
                )
    except (DataRefused, CheckpointRefused, HeadLoadError, Busy) as error:
        view.fatal(f"distill: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return front.stopped(
            "Interrupted: the last checkpoint and every whole shard are kept; run the same"
            " command again to resume."
        )
    if options.data_only:
        view.data_written(data.summary(), time.process_time() - cpu)
    else:
        view.distilled(description, str(options.output))
    return EXIT_OK
