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

Training is resumable: a checkpoint (head, optimizer, progress, random state)
is written atomically every `checkpoint_seconds`, and a rerun with the same
settings continues from it. The learning rate follows the share of the time or
token budget used, so a resumed run follows the same schedule.

This module never prints: progress goes through a callback.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.signals import Terminated
from specrepl.store.atomic import unreadable, write_atomically
from specrepl.store.paths import DISTILL_CHECKPOINT_FILE
from specrepl.train.features import FEATURE_BUDGET_BYTES, FeatureSource

__all__ = [
    "TrainProgress",
    "TrainSettings",
    "TrainState",
    "choose_draft_vocabulary",
    "evaluate_head",
    "train_head",
]

LABEL_TOP = 8  # the target's law is kept as its 8 likeliest tokens (renormalized)


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


@dataclass
class TrainState:
    """What a finished (or interrupted) training produced."""

    head: DraftHead
    seconds: float
    tokens: int
    steps: int
    agreement: tuple[float, ...]
    resumed: bool


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


def _batch(
    records: Sequence[dict], dtype: torch.dtype, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded tensors for a list of records: features (b, n, h), the next
    tokens (b, n), the label features f_{t+1} (b, n, h) and the loss mask (b, n).
    Position t reads (f_t, x_{t+1}) and is scored on x_{t+2}."""
    n = max(int(r["features"].shape[0]) - 1 for r in records)
    hidden = int(records[0]["features"].shape[1])
    b = len(records)
    features = torch.zeros(b, n, hidden, dtype=dtype)
    targets = torch.zeros(b, n, hidden, dtype=dtype)
    tokens = torch.zeros(b, n, dtype=torch.long)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for row, record in enumerate(records):
        f = record["features"].to(dtype)
        length = f.shape[0] - 1
        features[row, :length] = f[:-1]
        targets[row, :length] = f[1:]
        tokens[row, :length] = record["ids"][1 : length + 1]
        # from the last prompt position on: what drafting after the prompt sees
        mask[row, max(0, record["prompt_length"] - 1) : length] = True
    batch = {"features": features, "tokens": tokens, "targets": targets, "mask": mask}
    return {name: value.to(device) for name, value in batch.items()} if device else batch


def _losses(
    head: DraftHead, batch: dict[str, torch.Tensor], settings: TrainSettings
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The weighted loss and, per pass, the top-1 agreement counts on the mask.

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
        # pass j at position t starts its chain at t - j + 1: score it only if that is in the answer
        mask = base.clone()
        if j > 1:
            mask[:, : j - 1] = False
            mask[:, j - 1 :] &= base[:, : mask.shape[1] - (j - 1)]
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
        agreeing = (logits.detach().argmax(-1) == ids[:, 0]).sum()
        hits.append(torch.stack((agreeing, mask.sum())))
    return total / weight_sum, hits


def _batches(records: Sequence[dict], size: int, seed: int, epoch: int) -> list[list[int]]:
    """Indices grouped by length (little padding), in an order shuffled by
    (seed, epoch): a resumed run finds the same order again."""
    order = sorted(range(len(records)), key=lambda i: int(records[i]["ids"].shape[0]))
    groups = [order[i : i + size] for i in range(0, len(order), size)]
    random.Random(seed * 100_003 + epoch).shuffle(groups)
    return groups


@torch.no_grad()
def evaluate_head(
    head: DraftHead, records: Sequence[dict], settings: TrainSettings, dtype: torch.dtype
) -> tuple[float, ...]:
    """Top-1 agreement with the target of draft positions 1..depth on `records`
    (each position assuming the earlier drafts were right)."""
    hits = torch.zeros(settings.depth)
    total = torch.zeros(settings.depth)
    was_training = head.training
    head.eval()
    for start in range(0, len(records), settings.batch_sequences):
        batch = _batch(
            records[start : start + settings.batch_sequences], dtype, head.token_ids.device
        )
        _, counts = _losses(head, batch, settings)
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


def _read_checkpoint(path: Path, on_message: Callable[[str], None] | None) -> dict[str, Any] | None:
    """The saved training state, or None (with one line) when the file is damaged:
    training then starts from the beginning and overwrites it."""
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
        keys = {"head", "optimizer", "settings", "token_ids", "seconds", "tokens", "steps"}
        if isinstance(saved, dict) and keys <= saved.keys():
            return saved
        problem = "not a training checkpoint"
    except Exception as error:
        problem = unreadable(error)
    if on_message is not None:
        on_message(f"the training checkpoint {path} is damaged ({problem}): training starts over")
    return None


def _save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    write_atomically(path, lambda file: torch.save(payload, file))


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
    feature_budget: int = FEATURE_BUDGET_BYTES,
) -> TrainState:
    """Train a head for `target` on `records`, resuming from a checkpoint in
    `work_directory` made with the same settings. Stops at the time or token
    budget; Ctrl-C or SIGTERM stops after writing a checkpoint (and is re-raised).

    A record without "features" (ids only) gets the target's, computed when it
    is first used (`features.FeatureSource`, counted in the training time) and
    kept while they fit `feature_budget` bytes."""
    work_directory.mkdir(parents=True, exist_ok=True)
    checkpoint_path = work_directory / DISTILL_CHECKPOINT_FILE
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    indices = list(range(len(records)))
    rng.shuffle(indices)
    held = max(1, int(len(records) * settings.holdout))
    features = FeatureSource(target, budget_bytes=feature_budget)
    held_back = features.with_features([records[i] for i in indices[:held]])
    training = [records[i] for i in indices[held:]]
    token_ids = choose_draft_vocabulary(training, settings.draft_vocab, end_tokens, vocab_size)
    head = DraftHead.for_target(target, token_ids, copy_last_layer=settings.copy_last_layer).float()
    head.train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    seconds, tokens, steps, epoch, done_in_epoch, resumed = 0.0, 0, 0, 0, 0, False
    saved = _read_checkpoint(checkpoint_path, on_message) if checkpoint_path.exists() else None
    if saved is not None:
        same_vocabulary = torch.equal(saved["token_ids"].cpu(), token_ids.cpu())
        if saved.get("settings") == settings.as_dict() and same_vocabulary:
            head.load_state_dict(saved["head"])
            optimizer.load_state_dict(saved["optimizer"])
            seconds, tokens, steps = saved["seconds"], saved["tokens"], saved["steps"]
            epoch, done_in_epoch = saved["epoch"], saved["done_in_epoch"]
            resumed = True
    budget = settings.max_minutes * 60.0
    dtype = torch.float32

    def used() -> float:
        share = seconds / budget if budget > 0 else 0.0
        if settings.max_tokens:
            share = max(share, tokens / settings.max_tokens)
        return share

    def checkpoint() -> None:
        _save_checkpoint(
            checkpoint_path,
            {
                "settings": settings.as_dict(),
                "token_ids": token_ids,
                "head": head.state_dict(),
                "optimizer": optimizer.state_dict(),
                "seconds": seconds,
                "tokens": tokens,
                "steps": steps,
                "epoch": epoch,
                "done_in_epoch": done_in_epoch,
            },
        )

    last_checkpoint = time.perf_counter()
    agreement: tuple[float, ...] = ()
    try:
        while used() < 1.0:
            groups = _batches(training, settings.batch_sequences, settings.seed, epoch)
            for group in groups[done_in_epoch:]:
                if used() >= 1.0:
                    break
                began = time.perf_counter()
                chosen = features.with_features([training[i] for i in group])
                batch = _batch(chosen, dtype, head.token_ids.device)
                for parameters in optimizer.param_groups:
                    parameters["lr"] = _learning_rate(settings, used())
                loss, _ = _losses(head, batch, settings)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                optimizer.step()
                seconds += time.perf_counter() - began
                tokens += int(batch["mask"].sum())
                steps += 1
                done_in_epoch += 1
                measured = None
                if steps % evaluate_every == 0:
                    measured = agreement = evaluate_head(head, held_back, settings, dtype)
                if progress is not None:
                    shown = float(loss.detach())
                    progress(TrainProgress(seconds, budget, tokens, steps, shown, measured))
                if time.perf_counter() - last_checkpoint >= settings.checkpoint_seconds:
                    checkpoint()
                    last_checkpoint = time.perf_counter()
            else:
                epoch, done_in_epoch = epoch + 1, 0
    except (KeyboardInterrupt, Terminated):
        checkpoint()
        raise
    checkpoint()
    agreement = evaluate_head(head, held_back, settings, dtype)
    if progress is not None:
        progress(TrainProgress(seconds, budget, tokens, steps, math.nan, agreement))
    return TrainState(head.eval(), seconds, tokens, steps, agreement, resumed)
