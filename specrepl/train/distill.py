"""`python infer.py distill`: train a draft head for the target, start to finish.

The stages, each resumable from its files in the work directory:
prompts the target writes (`data.make_prompts`), its greedy answers and
features (`data.make_answers`), training (`training.train_head`), then a head
directory (`head_store.save_head`) that records the target's fingerprint, the
draft vocabulary, the data, the settings, the time spent and the held-back
agreement. Rerunning the same command after Ctrl-C or a crash continues where
it stopped.

This module declares the subcommand's flags and runs it (`run(args, front)`):
the target comes from the application's front door and everything shown goes
through the front's view (app/front.py, app/render/distill.py), so it does not
print. It knows nothing about decoding.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from specrepl.engine.drafters.draft_head import head_parameters
from specrepl.engine.drafters.head_store import save_head, target_fingerprint
from specrepl.engine.signals import EXIT_OK, EXIT_USAGE
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import chat_prompt_ids
from specrepl.store.paths import distill_root
from specrepl.train.data import DataProgress, load_shards, make_answers, make_prompts
from specrepl.train.training import TrainProgress, TrainSettings, train_head
from specrepl.version import __version__

__all__ = [
    "DistillFront",
    "DistillOptions",
    "DistillView",
    "add_arguments",
    "distill",
    "options_from_args",
    "run",
]

TRAIN = TrainSettings()
"""The training defaults, which the flags show."""


@dataclass(frozen=True)
class DistillOptions:
    """Everything `distill` needs besides the target."""

    work: Path
    output: Path
    prompts: int = 3500
    data_tokens: int = 500_000
    max_new_tokens: int = 256
    writer_dtype: str = "auto"
    seed: int = 0
    train: TrainSettings = field(default_factory=TrainSettings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py distill`; the model flags come before `distill`."""
    parser.description = (
        "Train a draft head for the target: it writes its own prompts, answers them, "
        "and a small network learns to draft from its hidden states. Resumable: run "
        "the same command again after an interruption."
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        metavar="DIR",
        help="data and checkpoints (default: <cache>/distill/<target fingerprint>)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="where the trained head is written"
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=DistillOptions.prompts,
        metavar="N",
        help=f"prompts the target writes (default {DistillOptions.prompts})",
    )
    parser.add_argument(
        "--data-tokens",
        type=int,
        default=DistillOptions.data_tokens,
        metavar="N",
        help=f"answer tokens to generate at most (default {DistillOptions.data_tokens})",
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=DistillOptions.max_new_tokens,
        metavar="N",
        help=f"longest answer (default {DistillOptions.max_new_tokens})",
    )
    parser.add_argument(
        "--writer-dtype",
        choices=("auto", "float32", "bfloat16"),
        default=DistillOptions.writer_dtype,
        help="precision of the model copy that writes the answers (auto: the "
        "faster one, timed here; features always come from the target)",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=TRAIN.max_minutes,
        metavar="M",
        help=f"training time budget (default {TRAIN.max_minutes:g})",
    )
    parser.add_argument(
        "--train-tokens",
        type=int,
        default=TRAIN.max_tokens,
        metavar="N",
        help="training token budget (stops at whichever comes first)",
    )
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=TRAIN.draft_vocab,
        metavar="N",
        help=f"tokens the head can draft, the most frequent (default {TRAIN.draft_vocab})",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=TRAIN.depth,
        metavar="N",
        help=f"draft positions unrolled in training (default {TRAIN.depth})",
    )
    parser.add_argument("--learning-rate", type=float, default=TRAIN.learning_rate, metavar="X")
    parser.add_argument(
        "--batch-sequences",
        type=int,
        default=TRAIN.batch_sequences,
        metavar="N",
        help=f"answers per training step (default {TRAIN.batch_sequences}: more steps in the"
        " same time)",
    )
    parser.add_argument(
        "--distill-seed",
        type=int,
        default=DistillOptions.seed,
        metavar="N",
        help=f"seed of the prompts and of training (default {DistillOptions.seed})",
    )


def options_from_args(args: argparse.Namespace, default_work: Path) -> DistillOptions:
    """Validated options; ValueError names a bad flag."""
    checks = (
        ("--prompts", args.prompts, 1),
        ("--data-tokens", args.data_tokens, 1),
        ("--answer-tokens", args.answer_tokens, 1),
        ("--draft-vocab", args.draft_vocab, 2),
        ("--depth", args.depth, 1),
        ("--batch-sequences", args.batch_sequences, 1),
    )
    for flag, value, low in checks:
        if value < low:
            raise ValueError(f"{flag} must be at least {low}, got {value}")
    if not args.minutes > 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    if not 0 < args.learning_rate < 1:
        raise ValueError(f"--learning-rate must be in (0, 1), got {args.learning_rate}")
    train = TrainSettings(
        draft_vocab=args.draft_vocab,
        depth=args.depth,
        learning_rate=args.learning_rate,
        batch_sequences=args.batch_sequences,
        max_minutes=args.minutes,
        max_tokens=args.train_tokens,
        seed=args.distill_seed,
    )
    return DistillOptions(
        work=args.work or default_work,
        output=args.out,
        prompts=args.prompts,
        data_tokens=args.data_tokens,
        max_new_tokens=args.answer_tokens,
        writer_dtype=args.writer_dtype,
        seed=args.distill_seed,
        train=train,
    )


@torch.no_grad()
def _steps_per_second(model: PreTrainedModel, rows: int = 16, steps: int = 4) -> float:
    """Batched decoding steps per second of `model` (after one warm-up pass)."""
    device = next(model.parameters()).device
    ids = torch.zeros((rows, 32), dtype=torch.long, device=device)
    model(input_ids=ids, use_cache=False, logits_to_keep=1)
    began = time.perf_counter()
    for _ in range(steps):
        model(input_ids=ids[:, :8], use_cache=False, logits_to_keep=1)
    return steps / (time.perf_counter() - began)


def answer_writer(target: PreTrainedModel, dtype: str) -> tuple[PreTrainedModel, str]:
    """The model that writes the answers: the target, or a bfloat16 copy where
    that is measured to be faster on this machine (answers only: the features
    that become labels always come from the target)."""
    if dtype == "float32" or (dtype == "auto" and target.dtype != torch.float32):
        return target, str(target.dtype).removeprefix("torch.")
    copy_bf16 = copy.deepcopy(target).to(torch.bfloat16).eval()
    if dtype == "bfloat16":
        return copy_bf16, "bfloat16"
    if _steps_per_second(copy_bf16) > 1.1 * _steps_per_second(target):
        return copy_bf16, "bfloat16"
    del copy_bf16
    return target, "float32"


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
    target, tokenizer = pair.target.model, pair.tokenizer
    options.work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    writer, writer_dtype = answer_writer(target, options.writer_dtype)
    say(f"answers are written by the target in {writer_dtype}; features come from the target")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else pair.eos_token_ids[0]
    prompts = make_prompts(
        writer,
        tokenizer,
        options.prompts,
        options.work / "prompts.jsonl",
        seed=options.seed,
        end_tokens=pair.eos_token_ids,
        batch_size=64,
        max_tokens=80,
        progress=on_data,
    )

    def encode(text: str) -> list[int]:
        return chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])

    make_answers(
        writer,
        target,
        prompts,
        options.work,
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=pad_id,
        max_new_tokens=options.max_new_tokens,
        token_budget=options.data_tokens,
        progress=on_data,
        on_message=say,
    )
    del writer
    data_seconds = time.perf_counter() - began
    records = list(load_shards(options.work))
    if not records:
        raise RuntimeError(f"no training data in {options.work}")
    answer_tokens = sum(int(r["ids"].shape[0]) - int(r["prompt_length"]) for r in records)
    say(f"training on {len(records)} answers, {answer_tokens} answer tokens")
    state = train_head(
        target,
        records,
        options.train,
        options.work,
        end_tokens=pair.eos_token_ids,
        vocab_size=pair.vocab_size,
        progress=on_train,
        on_message=say,
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
            "prompts": "written by the target itself (Magpie-style, see specrepl/train/data.py)",
            "prompt_count": len(records),
            "answer_tokens": answer_tokens,
            "max_new_tokens": options.max_new_tokens,
            "answers": f"greedy, written in {writer_dtype}",
            "seed": options.seed,
        },
        "training": {
            **options.train.as_dict(),
            "seconds": round(state.seconds, 1),
            "tokens": state.tokens,
            "steps": state.steps,
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

    Exit status: 0; 1 (the target cannot be loaded); 2 (a bad flag or config);
    130 (Ctrl-C: the last checkpoint is kept, the same command resumes).
    """
    view = front.view
    try:
        pair = front.load_target()
        if isinstance(pair, int):
            return pair
        options = options_from_args(args, distill_root() / target_fingerprint(pair.target.model))
    except ValueError as error:
        view.fatal(f"distill: {error}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return front.stopped("Interrupted while loading the target.")
    view.note(f"distill: work directory {options.work} (rerun the same command to resume)")
    try:
        with view.distill_progress() as (on_data, on_train):
            description = distill(
                pair, options, on_data=on_data, on_train=on_train, on_message=view.note
            )
    except KeyboardInterrupt:
        return front.stopped(
            "Interrupted: the last checkpoint is kept; run the same command again to resume."
        )
    view.distilled(description, str(options.output))
    return EXIT_OK
