"""Draft-head trials on equal budgets, with the target's features computed once.

`distill --data` recomputes the target's features at every run (about 9
minutes for 318k tokens on 2 cores of an AMD EPYC), so comparing head recipes
through it spends most of a short budget on the same forward passes. This
script splits the work:

    features  the embedded target's features over a data directory's records,
              for several layers at once, saved to one file (bfloat16;
              2.2 GB for 1,280 answers and 6 layers);
    train     one recipe (`TrainSettings`, the training code `distill` runs),
              reading its layers from that file; held-back records by shard
              layout, a compact checkpoint (`--checkpoint`) it resumes from,
              and the head written at the end;
    evaluate  held-back top-1 agreement per draft position of saved heads on
              the same records (and on 40 training records, to see overfitting).
    held-back the same, without a features file: N held-back records of the
              chosen shards, evenly spread, their features computed here
              (for data too large to keep every record's features); `--top N`
              adds how often the target's token is in the head's top 2..N.

    export HF_HUB_OFFLINE=1
    python scripts/head_trial.py features distill-data/smollm2-135m-instruct /tmp/f.pt
    OMP_NUM_THREADS=1 python scripts/head_trial.py train /tmp/f.pt /tmp/A --minutes 15 &
    OMP_NUM_THREADS=1 python scripts/head_trial.py train /tmp/f.pt /tmp/B --minutes 15 --fuse 2,15
    python scripts/head_trial.py evaluate /tmp/f.pt /tmp/A/head /tmp/B/head
    python scripts/head_trial.py held-back distill-data/smollm2-135m-instruct \
        --shards 47-53 --records 80 specrepl/heads/smollm2-135m-instruct /tmp/A/head

Run trials side by side with one thread each so they share the machine
alike. A measurement tool, not part of the product: the head it trains is
the one `distill` would train on the same records.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specrepl.engine.drafters.head_store import load_head, save_head, target_fingerprint
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec
from specrepl.train.data import target_features
from specrepl.train.distill import training_records
from specrepl.train.options import TRAIN
from specrepl.train.shards import TokenData
from specrepl.train.training import TrainSettings, evaluate_head, split_by_layout, train_head

STORED_LAYERS = (2, 8, 15, 22, 27)
"""Decoder layers whose outputs `features` keeps, before the final hidden state."""


def _target():
    return load_pair("embedded", ModelSpec("embedded", dtype="bfloat16")).target.model


def _layers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def features(data_directory: Path, output: Path) -> None:
    target = _target()
    vocab = int(target.config.vocab_size)
    data = TokenData.open(
        data_directory, name="embedded", fingerprint=target_fingerprint(target), vocab_size=vocab
    )
    records = training_records(data)
    computed = []
    for start in range(0, len(records), 64):
        chunk = [record["ids"] for record in records[start : start + 64]]
        computed += target_features(target, chunk, pad_id=0, feature_layers=STORED_LAYERS)
        print(f"{min(start + 64, len(records))}/{len(records)} records", flush=True)
    torch.save({"layers": STORED_LAYERS, "features": computed, "records": records}, output)


def _records(path: Path, fused: tuple[int, ...], hidden: int) -> list[dict]:
    saved = torch.load(path, weights_only=False)
    slots = [list(saved["layers"]).index(layer) for layer in fused] + [len(saved["layers"])]
    return [
        {
            **record,
            "features": torch.cat([feats[:, s * hidden : (s + 1) * hidden] for s in slots], dim=-1),
        }
        for record, feats in zip(saved["records"], saved["features"], strict=True)
    ]


def train(args: argparse.Namespace) -> None:
    target = _target()
    hidden = int(target.config.hidden_size)
    fused = _layers(args.fuse)
    settings = TrainSettings(
        draft_vocab=args.draft_vocab,
        depth=args.depth,
        learning_rate=args.learning_rate,
        batch_sequences=args.batch_sequences,
        max_minutes=args.minutes,
        layers=args.head_layers,
        fused_layers=fused,
    )

    def progress(report) -> None:
        if report.agreement:
            print(
                f"{report.seconds / 60:.1f} min, {report.tokens} tokens, held-back agreement"
                f" {[round(a, 3) for a in report.agreement]}",
                flush=True,
            )

    state = train_head(
        target,
        _records(args.features, fused, hidden),
        settings,
        args.out / "work",
        end_tokens=[2],
        vocab_size=int(target.config.vocab_size),
        progress=progress,
        evaluate_every=300,
        checkpoint_directory=args.out / "checkpoint",
    )
    about = {"name": "embedded", "fingerprint": target_fingerprint(target)}
    save_head(state.head, args.out / "head", {"target": about, "training": settings.as_dict()})
    print(f"held-back agreement {state.agreement}, {state.tokens} tokens, {state.steps} steps")


def evaluate(path: Path, heads: list[Path]) -> None:
    target = _target()
    hidden = int(target.config.hidden_size)
    for directory in heads:
        head, _ = load_head(directory, target)
        records = _records(path, head.config.fused_layers, hidden)
        held, training = split_by_layout(records, TRAIN.holdout)
        settings = TrainSettings(depth=4, batch_sequences=8)
        for name, chosen in (("held-back", held), ("training, first 40", training[:40])):
            agreement = evaluate_head(head.float(), chosen, settings, torch.float32)
            print(directory, name, [round(a, 3) for a in agreement], flush=True)


def _shard_range(text: str) -> range:
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def held_back(
    data_directory: Path, shards: range, count: int, heads: list[Path], top: int = 1
) -> None:
    target = _target()
    vocab = int(target.config.vocab_size)
    data = TokenData.open(
        data_directory, name="embedded", fingerprint=target_fingerprint(target), vocab_size=vocab
    )
    held, _ = split_by_layout(training_records(data), TRAIN.holdout)
    chosen = [record for record in held if record["shard"] in shards]
    step = max(1, len(chosen) // count)
    chosen = chosen[::step][:count]
    answer_tokens = sum(int(r["ids"].shape[0]) - r["prompt_length"] for r in chosen)
    print(
        f"{len(chosen)} held-back records of shards {shards.start}-{shards.stop - 1},"
        f" {answer_tokens} answer tokens",
        flush=True,
    )
    settings = TrainSettings(depth=4, batch_sequences=8)
    with_features: dict[tuple[int, ...], list[dict]] = {}  # by the layers a head fuses
    for directory in heads:
        head, _ = load_head(directory, target)
        layers = tuple(head.config.fused_layers)
        if layers not in with_features:
            ids = [r["ids"] for r in chosen]
            features = target_features(target, ids, pad_id=0, feature_layers=layers)
            with_features[layers] = [
                {**r, "features": f} for r, f in zip(chosen, features, strict=True)
            ]
        for k in range(1, top + 1):
            agreement = evaluate_head(
                head.float(), with_features[layers], settings, torch.float32, top=k
            )
            within = "" if top == 1 else f" target's token in the head's top {k}:"
            print(f"{directory}{within}", [round(a, 3) for a in agreement], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("features")
    made.add_argument("data", type=Path)
    made.add_argument("output", type=Path)
    trial = commands.add_parser("train")
    trial.add_argument("features", type=Path)
    trial.add_argument("out", type=Path)
    trial.add_argument("--minutes", type=float, default=15.0)
    trial.add_argument("--fuse", default="", help=f"e.g. 2,15 (from {STORED_LAYERS})")
    trial.add_argument("--depth", type=int, default=TRAIN.depth)
    trial.add_argument("--draft-vocab", type=int, default=TRAIN.draft_vocab)
    trial.add_argument("--head-layers", type=int, default=TRAIN.layers)
    trial.add_argument("--batch-sequences", type=int, default=TRAIN.batch_sequences)
    trial.add_argument("--learning-rate", type=float, default=TRAIN.learning_rate)
    judged = commands.add_parser("evaluate")
    judged.add_argument("features", type=Path)
    judged.add_argument("heads", type=Path, nargs="+")
    sampled = commands.add_parser("held-back")
    sampled.add_argument("data", type=Path)
    sampled.add_argument("heads", type=Path, nargs="+")
    sampled.add_argument("--shards", type=_shard_range, default=_shard_range("0-99999"))
    sampled.add_argument("--records", type=int, default=80)
    sampled.add_argument(
        "--top", type=int, default=1, help="also how often the target's token is in the head's"
        " top 2..N (the acceptance per level of a draft tree that tries them)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.command == "held-back":
        held_back(args.data, args.shards, args.records, args.heads, args.top)
    elif args.command == "features":
        features(args.data, args.output)
    elif args.command == "train":
        train(args)
    else:
        evaluate(args.features, args.heads)


if __name__ == "__main__":
    main()
