"""The flags of `python infer.py distill` and the options they make.

`add_arguments` declares them (the model flags come before `distill`);
`check_arguments` refuses a bad one before the target is loaded;
`options_from_args` turns them into `DistillOptions`, everything `distill`
needs besides the target. It knows nothing of models, data or training
beyond the training settings' defaults.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from specrepl.train.training import TrainSettings

__all__ = ["TRAIN", "DistillOptions", "add_arguments", "check_arguments", "options_from_args"]

TRAIN = TrainSettings()
"""The training defaults, which the flags show."""


@dataclass(frozen=True)
class DistillOptions:
    """Everything `distill` needs besides the target."""

    work: Path
    output: Path | None
    prompts: int = 3500
    data_tokens: int = 500_000
    max_new_tokens: int = 256
    writer_dtype: str = "auto"
    answer_batch: int = 0
    """Answers written at once; 0: by device (`accumulate.answer_batch_for`)."""
    document_share: float = 0.25
    """With `data`: the share of a new shard's prompts that hand the target a
    text it wrote earlier (long inputs; `prompts.DOCUMENT_TASKS`)."""
    follow_up_share: float = 0.2
    """With `data`: the share of a new shard's prompts that follow up one of its
    own first turns and the answer to it (second turns of a chat; `follow_ups.py`)."""
    seed: int = 0
    train: TrainSettings = field(default_factory=TrainSettings)
    data: Path | None = None
    data_only: bool = False
    checkpoint: Path | None = None
    """With `data`: the committed training checkpoint's directory (DIR/checkpoint)."""
    from_head: Path | None = None
    """With `data`: a saved head whose weights start training where the
    checkpoint directory holds no checkpoint yet."""


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
        help="data and checkpoints when there is no --data (default: "
        "<cache>/distill/<target fingerprint>)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the trained head is written (needed unless --data-only)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the answers as token ids in DIR, compact shards that can live in a "
        "repository (docs/draft-heads.md), and train from them, the target's features "
        "recomputed (default: shards with features in the work directory)",
    )
    parser.add_argument(
        "--data-only",
        action="store_true",
        help="with --data: add answers until DIR holds --data-tokens answer tokens, then stop",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --data: the compact training checkpoint, to commit with the data "
        "(default: checkpoint/ inside the --data directory)",
    )
    parser.add_argument(
        "--from-head",
        type=Path,
        default=None,
        metavar="DIR",
        help="with --data: start training from this head (e.g. the shipped one,"
        " specrepl/heads/...) when the checkpoint directory holds no checkpoint yet;"
        " its shape and draft vocabulary are kept",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=DistillOptions.prompts,
        metavar="N",
        help=f"prompts the target writes (default {DistillOptions.prompts}; with --data each"
        " shard writes its own)",
    )
    parser.add_argument(
        "--data-tokens",
        type=int,
        default=DistillOptions.data_tokens,
        metavar="N",
        help="answer tokens to generate at most; with --data, the answer tokens DIR is to "
        f"hold, counting those already there (default {DistillOptions.data_tokens})",
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
        "--answer-batch",
        type=int,
        default=DistillOptions.answer_batch,
        metavar="N",
        help="with --data: answers written at once (default: 32 on a CPU, 512 on a GPU;"
        " a shard holds twice as many)",
    )
    parser.add_argument(
        "--document-share",
        type=float,
        default=DistillOptions.document_share,
        metavar="X",
        help="with --data: the share of a new shard's prompts that hand the target a text it"
        " wrote earlier, with a task (summarize, answer from it, extract, ...): long inputs"
        f" (default {DistillOptions.document_share}; 0: none)",
    )
    parser.add_argument(
        "--follow-up-share",
        type=float,
        default=DistillOptions.follow_up_share,
        metavar="X",
        help="with --data: the share of a new shard's prompts that follow up one of its own"
        " questions and the target's answer with a next message the target writes: second"
        f" turns of a chat (default {DistillOptions.follow_up_share}; 0: none)",
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
    parser.add_argument(
        "--fuse-layers",
        type=_layer_list,
        default=TRAIN.fused_layers,
        metavar="I,J",
        help="earlier decoder layers of the target whose outputs the head reads besides"
        " the final hidden state (EAGLE-3's fused features), e.g. 2,15; 'none' for the"
        " final one only (default)",
    )
    parser.add_argument(
        "--head-layers",
        type=int,
        default=TRAIN.layers,
        metavar="N",
        help=f"decoder layers in the head (default {TRAIN.layers})",
    )
    parser.add_argument("--learning-rate", type=float, default=TRAIN.learning_rate, metavar="X")
    parser.add_argument(
        "--batch-sequences",
        type=int,
        default=0,
        metavar="N",
        help="answers per training step (default: 1 on a CPU, more steps in the same time;"
        " 64 on a GPU, where a step of 64 costs little more than one)",
    )
    parser.add_argument(
        "--distill-seed",
        type=int,
        default=DistillOptions.seed,
        metavar="N",
        help=f"seed of the prompts and of training (default {DistillOptions.seed})",
    )


def _layer_list(text: str) -> tuple[int, ...]:
    """'2,15' as (2, 15); 'none' or '' as ()."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"layers are numbers separated by commas (e.g. 2,15), got {text!r}"
        ) from None


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming a bad flag (checked before the target is loaded)."""
    if args.data_only and args.data is None:
        raise ValueError("--data-only needs --data DIR")
    if args.checkpoint is not None and args.data is None:
        raise ValueError("--checkpoint needs --data DIR (without it, checkpoints go to --work)")
    if args.from_head is not None and (args.data is None or args.data_only):
        raise ValueError("--from-head needs --data DIR and training (not --data-only)")
    if args.out is None and not args.data_only:
        raise ValueError("--out DIR is needed (where the head is written), unless --data-only")
    checks = (
        ("--prompts", args.prompts, 1),
        ("--data-tokens", args.data_tokens, 1),
        ("--answer-tokens", args.answer_tokens, 1),
        ("--draft-vocab", args.draft_vocab, 2),
        ("--depth", args.depth, 1),
        ("--head-layers", args.head_layers, 1),
    )
    for flag, value, low in checks:
        if value < low:
            raise ValueError(f"{flag} must be at least {low}, got {value}")
    for flag, value in (
        ("--answer-batch", args.answer_batch),
        ("--batch-sequences", args.batch_sequences),
    ):
        if value < 0:
            raise ValueError(f"{flag} must be at least 1 (or 0: by device), got {value}")
    if not 0 <= args.document_share < 1:
        raise ValueError(f"--document-share must be in [0, 1), got {args.document_share}")
    if not 0 <= args.follow_up_share < 1 or args.document_share + args.follow_up_share >= 1:
        raise ValueError(
            "--follow-up-share must be in [0, 1) and leave room beside --document-share"
            f" for first turns, got {args.follow_up_share} (with {args.document_share})"
        )
    if not args.minutes > 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    if not 0 < args.learning_rate < 1:
        raise ValueError(f"--learning-rate must be in (0, 1), got {args.learning_rate}")


def options_from_args(args: argparse.Namespace, default_work: Path) -> DistillOptions:
    """Validated options; ValueError names a bad flag."""
    check_arguments(args)
    train = TrainSettings(
        draft_vocab=args.draft_vocab,
        depth=args.depth,
        learning_rate=args.learning_rate,
        batch_sequences=args.batch_sequences,
        max_minutes=args.minutes,
        max_tokens=args.train_tokens,
        seed=args.distill_seed,
        layers=args.head_layers,
        fused_layers=args.fuse_layers,
    )
    return DistillOptions(
        work=args.work or default_work,
        output=args.out,
        prompts=args.prompts,
        data_tokens=args.data_tokens,
        max_new_tokens=args.answer_tokens,
        writer_dtype=args.writer_dtype,
        answer_batch=args.answer_batch,
        document_share=args.document_share,
        follow_up_share=args.follow_up_share,
        seed=args.distill_seed,
        train=train,
        data=args.data,
        data_only=args.data_only,
        checkpoint=args.checkpoint or (args.data / "checkpoint" if args.data else None),
        from_head=args.from_head,
    )
