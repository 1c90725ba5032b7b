"""Training a draft head on self-distilled data (see `data.py`; records that
hold token ids only, as `shards.py` keeps them, get the target's features from
`features.py` when first used).

The head reads the target's feature f_t and the token x_{t+1} and learns the
target's distribution over x_{t+2}: a soft cross-entropy against the target's
own softmax (computed from the stored f_{t+1} with the target's output rows,
restricted to the draft vocabulary and to its 8 likeliest tokens), plus a
small smooth-L1 pull of the head's output towards f_{t+1} (EAGLE's feature
regression). Drafting several tokens
feeds the head its own guesses, so training unrolls it the same way
(`DraftHead.unrolled`, the "training-time test" of EAGLE-3, arXiv 2503.01840):
pass j is scored on what draft position j would see, with weight `decay`^(j-1).

Training is resumable: a checkpoint is written atomically every
`checkpoint_seconds`, on Ctrl-C or SIGTERM and at the end. In the work
directory it holds head, optimizer and progress, and a rerun with the same
settings continues from it. With data kept in a directory (`--data`) it is the
compact checkpoint of `checkpoint.py`, committed with the data: the held-back
records are fixed by the data's layout (`split_by_layout`) and the draft
vocabulary by the first run (kept in the checkpoint), so data appended since
is simply used; the optimizer restarts (a warm restart). The learning rate
follows the share of the time or token budget used, so a resumed run follows
the same schedule.

This module never prints: progress goes through a callback.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specrepl.engine.drafters.draft_head import DraftHead, HeadConfig
from specrepl.engine.drafters.head_store import target_fingerprint
from specrepl.engine.signals import Terminated
from specrepl.store.paths import DISTILL_CHECKPOINT_FILE
from specrepl.train.checkpoint import (
    CacheCheckpoint,
    CommittedCheckpoint,
    Position,
    SavedHead,
    read_checkpoint,
)
from specrepl.train.features import FeatureSource

__all__ = [
    "TrainProgress",
    "TrainSettings",
    "TrainState",
    "batch_sequences_for",
    "choose_draft_vocabulary",
    "evaluate_head",
    "held_back_every",
    "split_by_layout",
    "train_head",
]

LABEL_TOP = 8  # the target's law is kept as its 8 likeliest tokens (renormalized)
RESTART_STEPS = 50  # after a committed checkpoint, the rate ramps up again over 50 steps
EVALUATION_SHARE_INVERSE = 9.0
"""A held-back check waits for at least 9 times its own measured duration of
training since the last one (every `evaluate_every` steps at most often), so
that checks on a large held-back set take at most a tenth of the time."""


@dataclass(frozen=True)
class TrainSettings:
    """How a head is trained; everything that changes the result is here."""

    draft_vocab: int = 8192
    depth: int = 2
    decay: float = 0.7
    feature_weight: float = 0.1
    learning_rate: float = 1e-3
    batch_sequences: int = 1
    max_minutes: float = 25.0
    max_tokens: int | None = None
    holdout: float = 0.03
    seed: int = 0
    checkpoint_seconds: float = 120.0
    copy_last_layer: bool = False
    layers: int = 1
    fused_layers: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The settings as JSON gives them back (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class TrainProgress:
    """One report: time and tokens used so far, the last loss, and the held-back
    top-1 agreement of draft positions 1..depth when it was just measured."""

    seconds: float
    budget_seconds: float
    tokens: int
    steps: int
    loss: float
    agreement: tuple[float, ...] | None = None
    feature_seconds: float = 0.0  # of `seconds`, spent computing the target's features


@dataclass
class TrainState:
    """What a finished (or interrupted) training produced."""

    head: DraftHead
    seconds: float
    tokens: int
    steps: int
    agreement: tuple[float, ...]
    resumed: bool
    history: dict[str, Any] = field(default_factory=dict)  # a committed checkpoint's sittings


def choose_draft_vocabulary(
    records: Sequence[dict], size: int, always: Sequence[int], vocab_size: int
) -> torch.Tensor:
    """The `size` tokens that appear most often in the answers (FR-Spec: by
    frequency in the data, not by id), plus `always` (the end tokens); sorted ids."""
    counts: Counter[int] = Counter()
    for record in records:
        counts.update(record["ids"][record["prompt_length"] :].tolist())
    chosen = [token for token, _ in counts.most_common(size)]
    for token in always:
        if token not in chosen:
            chosen = [*chosen[: size - 1], token] if len(chosen) >= size else [*chosen, token]
    if len(chosen) < size:  # small data: fill with the lowest unused ids
        used = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in used][: size - len(chosen)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def batch_sequences_for(device: torch.device) -> int:
    """Answers per training step by default: 1 on a CPU, where a step's time
    grows with its rows and more steps in the same time learn more; 64 on a
    GPU, where a step of 64 answers costs little more than one (about 125,000
    tokens a second on an H200 against a few thousand one answer at a time)."""
    return 1 if device.type == "cpu" else 64


def _batch(
    records: Sequence[dict],
    hidden: int,
    dtype: torch.dtype,
    device: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded tensors for a list of records: features (b, n, width: the
    fused layers' and the final one's), the next tokens (b, n), the final
    layer's f_{t+1} (b, n, hidden), the labels' source, and the loss mask (b, n).
    Position t reads (f_t, x_{t+1}) and is scored on x_{t+2}. The features
    are gathered on `device` (where a GPU keeps them, they never leave it)."""
    n = max(int(r["features"].shape[0]) - 1 for r in records)
    width = int(records[0]["features"].shape[1])
    b = len(records)
    device = device or torch.device("cpu")
    features = torch.zeros(b, n, width, dtype=dtype, device=device)
    targets = torch.zeros(b, n, hidden, dtype=dtype, device=device)
    tokens = torch.zeros(b, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for row, record in enumerate(records):
        f = record["features"].to(device=device, dtype=dtype, non_blocking=True)
        length = f.shape[0] - 1
        features[row, :length] = f[:-1]
        targets[row, :length] = f[1:, -hidden:]  # the final layer's: the label's source
        tokens[row, :length] = record["ids"][1 : length + 1]
        # from the last prompt position on: what drafting after the prompt sees
        mask[row, max(0, record["prompt_length"] - 1) : length] = True
    return {
        "features": features,
        "tokens": tokens.to(device),
        "targets": targets,
        "mask": mask.to(device),
    }


def _losses(
    head: DraftHead, batch: dict[str, torch.Tensor], settings: TrainSettings, top: int = 1
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The weighted loss and, per pass, the agreement counts on the mask: how
    often the target's token is the head's likeliest (among its `top` likeliest).

    Logits are computed only where a pass is scored: over a draft vocabulary
    they are the bulk of the cost."""
    base = batch["mask"]
    with torch.no_grad():  # the target's law, kept as its LABEL_TOP likeliest tokens
        top_logits, top_ids_scored = head.logits(batch["targets"][base]).float().topk(LABEL_TOP)
        top_probs = base.new_zeros((*base.shape, LABEL_TOP), dtype=torch.float32)
        top_ids = base.new_zeros((*base.shape, LABEL_TOP), dtype=torch.long)
        top_probs[base] = torch.softmax(top_logits, dim=-1)
        top_ids[base] = top_ids_scored
    outputs = head.unrolled(batch["features"], batch["tokens"], settings.depth)
    total = batch["features"].new_zeros((), dtype=torch.float32)
    hits = []
    weight_sum = 0.0
    for j, hidden in enumerate(outputs, start=1):
        mask = _pass_mask(base, j)
        scored = hidden[mask]
        logits = head.logits(scored).float()
        ids, probs = top_ids[mask], top_probs[mask]
        # soft cross-entropy -sum p log q = logsumexp(z) - sum p z, p on its top tokens
        cross_entropy = logits.logsumexp(-1) - (probs * logits.gather(-1, ids)).sum(-1)
        regression = F.smooth_l1_loss(
            scored.float(), batch["targets"][mask].float(), reduction="none"
        ).mean(-1)
        per_position = cross_entropy + settings.feature_weight * regression
        weight = settings.decay ** (j - 1)
        total = total + weight * per_position.sum() / max(1, per_position.shape[0])
        weight_sum += weight
        if top == 1:
            agreeing = (logits.detach().argmax(-1) == ids[:, 0]).sum()
        else:
            agreeing = (logits.detach().topk(top).indices == ids[:, :1]).any(-1).sum()
        hits.append(torch.stack((agreeing, mask.sum())))
    return total / weight_sum, hits


def _pass_mask(base: torch.Tensor, j: int) -> torch.Tensor:
    """Where pass j is scored: pass j at position t starts its chain at t - j + 1,
    so only where that position is in the answer too (`base`: the answer's mask)."""
    mask = base.clone()
    if j > 1:
        mask[:, : j - 1] = False
        mask[:, j - 1 :] &= base[:, : mask.shape[1] - (j - 1)]
    return mask


def _batches(records: Sequence[dict], size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped by length (little padding), in an order shuffled by
    (seed, epoch): a resumed run finds the same order again."""
    order = sorted(range(len(records)), key=lambda i: int(records[i]["ids"].shape[0]))
    groups = [order[i : i + size] for i in range(0, len(order), size)]
    random.Random(seed * 100_003 + epoch).shuffle(groups)
    return groups


@torch.no_grad()
def evaluate_head(
    head: DraftHead,
    records: Sequence[dict],
    settings: TrainSettings,
    dtype: torch.dtype,
    *,
    top: int = 1,
) -> tuple[float, ...]:
    """Top-1 agreement with the target of draft positions 1..depth on `records`
    (each position assuming the earlier drafts were right). With `top` k: how
    often the target's token is among the head's k likeliest, which is how
    often a draft tree that tries them there is accepted there."""
    hits = torch.zeros(settings.depth)
    total = torch.zeros(settings.depth)
    was_training = head.training
    head.eval()
    for start in range(0, len(records), settings.batch_sequences):
        batch = _batch(
            records[start : start + settings.batch_sequences],
            head.config.hidden_size,
            dtype,
            head.token_ids.device,
        )
        _, counts = _losses(head, batch, settings, top)
        for j, (h, n) in enumerate(counts):
            hits[j] += float(h)
            total[j] += float(n)
    head.train(was_training)
    return tuple(float(h / max(n, 1.0)) for h, n in zip(hits, total, strict=True))


def _learning_rate(settings: TrainSettings, used: float) -> float:
    """Warm-up over the first 2% of the budget, then a cosine down to 10%."""
    if used < 0.02:
        return settings.learning_rate * max(used / 0.02, 0.05)
    progress = min(1.0, (used - 0.02) / 0.98)
    return settings.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def held_back_every(holdout: float) -> int:
    """With `--data`, one record in this many is held back (33 for 3%)."""
    return max(2, round(1.0 / holdout)) if holdout > 0 else 0


def split_by_layout(records: Sequence[dict], holdout: float) -> tuple[list[dict], list[dict]]:
    """(held back, training) fixed by the data's layout: record `index` of its
    shard is held back when `index % held_back_every(holdout) == 0`. Appending
    shards adds records to both sides and never moves one across."""
    every = held_back_every(holdout)
    held: list[dict] = []
    training: list[dict] = []
    for record in records:
        if "index" not in record:
            raise ValueError("a record without its index in a shard cannot be split by layout")
        (held if every and int(record["index"]) % every == 0 else training).append(record)
    return held, training


def _drawn_split(records: Sequence[dict], settings: TrainSettings) -> tuple[list, list]:
    """(held back, training): a share `holdout` drawn with the seed (the work directory)."""
    indices = list(range(len(records)))
    random.Random(settings.seed).shuffle(indices)
    held = max(1, int(len(records) * settings.holdout))
    return [records[i] for i in indices[:held]], [records[i] for i in indices[held:]]


def train_head(
    target: PreTrainedModel,
    records: Sequence[dict],
    settings: TrainSettings,
    work_directory: Path,
    *,
    end_tokens: Sequence[int],
    vocab_size: int,
    progress: Callable[[TrainProgress], None] | None = None,
    evaluate_every: int = 200,
    on_message: Callable[[str], None] | None = None,
    feature_budget: int | None = None,
    checkpoint_directory: Path | None = None,
) -> TrainState:
    """Train a head for `target` on `records`, resuming from a checkpoint.
    Stops at the time or token budget; Ctrl-C or SIGTERM stops after writing a
    checkpoint (and is re-raised).

    Without `checkpoint_directory`: a share `holdout` of the records, drawn,
    is held back, and the checkpoint in `work_directory` is resumed when the
    settings and draft vocabulary are the same. With it (data kept in a
    directory; each record carries its "index" in its shard): the held-back
    records are fixed by `split_by_layout`, and the compact checkpoint there
    (`checkpoint.py`) is resumed with its own draft vocabulary, whatever was
    added to the data; CheckpointRefused for one made for another target or
    head shape.

    A record without "features" (ids only) gets the target's, computed when it
    is first used (`features.FeatureSource`, counted in the training time) and
    kept while they fit `feature_budget` bytes (default: a third of the free
    memory, `features.feature_budget_bytes`)."""
    torch.manual_seed(settings.seed)
    features = FeatureSource(
        target, budget_bytes=feature_budget, feature_layers=settings.fused_layers
    )
    saved: SavedHead | None = None
    if checkpoint_directory is None:
        held, training = _drawn_split(records, settings)
    else:
        held, training = split_by_layout(records, settings.holdout)
        fingerprint = target_fingerprint(target)
        config = HeadConfig.for_target(
            target, settings.draft_vocab, settings.layers, settings.fused_layers
        )
        saved = read_checkpoint(
            checkpoint_directory, fingerprint=fingerprint, config=config, on_message=on_message
        )
    held_back = features.with_features(held)
    token_ids = (
        saved.token_ids
        if saved is not None
        else choose_draft_vocabulary(training, settings.draft_vocab, end_tokens, vocab_size)
    )
    head = DraftHead.for_target(
        target,
        token_ids,
        layers=settings.layers,
        copy_last_layer=settings.copy_last_layer,
        fused_layers=settings.fused_layers,
    ).float()
    head.train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    store: CacheCheckpoint | CommittedCheckpoint
    if checkpoint_directory is None:
        work_directory.mkdir(parents=True, exist_ok=True)
        store = CacheCheckpoint(work_directory / DISTILL_CHECKPOINT_FILE, settings.as_dict())
    else:
        name = getattr(target.config, "name_or_path", "") or type(target).__name__
        about = {"name": name, "fingerprint": fingerprint, "vocab_size": vocab_size}
        records_kept = {
            "training_records": len(training),
            "held_back_records": len(held),
            "held_back_every": held_back_every(settings.holdout),
        }
        store = CommittedCheckpoint(
            checkpoint_directory, saved, about, settings.as_dict(), records_kept
        )
    resumed_at = store.resume(head, optimizer, on_message)
    # a committed checkpoint has no optimizer state: ramp the rate up again after it
    restart_steps = RESTART_STEPS if resumed_at is not None and saved is not None else 0
    position = resumed_at or Position()
    state = _train(
        head,
        optimizer,
        training,
        held_back,
        features,
        settings,
        position,
        store,
        progress,
        evaluate_every,
        restart_steps,
    )
    state.resumed = resumed_at is not None
    if isinstance(store, CommittedCheckpoint):
        state.history = store.history()
    return state


def _train(
    head: DraftHead,
    optimizer: torch.optim.Optimizer,
    training: Sequence[dict],
    held_back: Sequence[dict],
    features: FeatureSource,
    settings: TrainSettings,
    at: Position,
    store: CacheCheckpoint | CommittedCheckpoint,
    progress: Callable[[TrainProgress], None] | None,
    evaluate_every: int,
    restart_steps: int,
) -> TrainState:
    """The loop: steps until the budget is used, checkpoints on the way and at the end."""
    budget = settings.max_minutes * 60.0
    dtype = torch.float32
    first_step = at.steps

    def used() -> float:
        share = at.seconds / budget if budget > 0 else 0.0
        if settings.max_tokens:
            share = max(share, at.tokens / settings.max_tokens)
        return share

    def rate() -> float:
        ramp = min(1.0, (at.steps - first_step + 1) / restart_steps) if restart_steps else 1.0
        return _learning_rate(settings, used()) * ramp

    features_before = features.seconds  # the held-back records' are not training time

    def report(loss: float, agreement: tuple[float, ...] | None) -> TrainProgress:
        spent = features.seconds - features_before
        return TrainProgress(at.seconds, budget, at.tokens, at.steps, loss, agreement, spent)

    last_checkpoint = time.perf_counter()
    next_evaluation = 0.0  # training seconds: held-back checks take at most a tenth of the time
    agreement: tuple[float, ...] = ()
    try:
        while used() < 1.0 and training:
            groups = _batches(training, settings.batch_sequences, settings.seed, at.epoch)
            for group in groups[at.done_in_epoch :]:
                if used() >= 1.0:
                    break
                began = time.perf_counter()
                chosen = features.with_features([training[i] for i in group])
                batch = _batch(chosen, head.config.hidden_size, dtype, head.token_ids.device)
                for parameters in optimizer.param_groups:
                    parameters["lr"] = rate()
                loss, _ = _losses(head, batch, settings)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                optimizer.step()
                at.seconds += time.perf_counter() - began
                at.tokens += int(batch["mask"].sum())
                at.steps += 1
                at.done_in_epoch += 1
                measured = None
                if at.steps % evaluate_every == 0 and at.seconds >= next_evaluation:
                    evaluation_began = time.perf_counter()
                    measured = agreement = evaluate_head(head, held_back, settings, dtype)
                    spent = time.perf_counter() - evaluation_began
                    next_evaluation = at.seconds + EVALUATION_SHARE_INVERSE * spent
                if progress is not None:
                    progress(report(float(loss.detach()), measured))
                if time.perf_counter() - last_checkpoint >= settings.checkpoint_seconds:
                    store.save(head, optimizer, at, agreement)
                    last_checkpoint = time.perf_counter()
            else:
                at.epoch, at.done_in_epoch = at.epoch + 1, 0
    except (KeyboardInterrupt, Terminated):
        store.save(head, optimizer, at, agreement)
        raise
    agreement = evaluate_head(head, held_back, settings, dtype)
    store.save(head, optimizer, at, agreement)
    if progress is not None:
        progress(report(math.nan, agreement))
    return TrainState(head.eval(), at.seconds, at.tokens, at.steps, agreement, False)
