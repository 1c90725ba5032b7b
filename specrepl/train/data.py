"""The target's answers and features for a draft head (self-distillation).

Given prompts (`prompts.py` has the target write them), this module makes:

1. the target's greedy answers, generated in batches (`batched_generate`:
   rows leave the batch as they end, the cache grows in place);
2. the target's final hidden state (after its last norm, the input of its
   output layer) at every position of prompt plus answer, captured during that
   same generation or computed afterwards in one batched pass
   (`target_features`): a draft head learns to predict the next feature and
   token from them.

The work directory of `distill` (in the user cache) holds `prompts.jsonl` and
numbered shards (`shard-00000.pt`, ...); each shard is a list of records
`{"ids": LongTensor (L,), "features": bfloat16 (L - 1, hidden), "prompt_length": int}`,
written atomically, so an interrupted run loses at most the shard in progress.
Data meant to be kept (in a repository) holds ids only: `shards.py`.

This module never prints: progress goes through a callback. It knows nothing
of the shard format kept in a repository, nor of training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specrepl.engine.forward import selected_features
from specrepl.engine.kv_cache import growing_cache
from specrepl.store.atomic import unreadable, write_atomically

__all__ = [
    "DataProgress",
    "GeneratedBatch",
    "ProgressCallback",
    "batched_generate",
    "load_shards",
    "make_answers",
    "target_features",
]


@dataclass(frozen=True)
class DataProgress:
    """One progress report: `stage` is "prompts", "answers" (done and total
    count shards) or "answer tokens" (done and total count answer tokens in a
    data directory, with this run's rate and the time left at that rate)."""

    stage: str
    done: int
    total: int
    tokens: int = 0
    tokens_per_second: float | None = None
    seconds_left: float | None = None


ProgressCallback = Callable[[DataProgress], None]


@dataclass
class GeneratedBatch:
    """Per row: the full sequence (prompt + continuation), its prompt length and
    the final hidden states at every position (bfloat16 on the CPU)."""

    ids: list[torch.Tensor]
    prompt_lengths: list[int]
    features: list[torch.Tensor]


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator):
    """Nucleus sampling on a batch of logits (B, V)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs > top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    choice = torch.multinomial(sorted_probs, 1, generator=generator)
    return order.gather(-1, choice).squeeze(-1)


@torch.no_grad()
def batched_generate(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    end_tokens: Sequence[int],
    pad_id: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    keep_features: bool = True,
) -> GeneratedBatch:
    """Continue every prompt (left-padded into one batch) until an end token or
    `max_new_tokens`; temperature 0 is greedy. Positions come from the mask,
    so padding changes nothing but rounding. The end token is kept.

    The cache grows in place (`kv_cache.growing_cache`), and rows that have
    finished leave the batch once an eighth of it has (one copy of the cache),
    so a batch costs what its unfinished answers cost."""
    device = next(model.parameters()).device
    rows = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = growing_cache(model, room=width + max_new_tokens)
    ends = torch.tensor(list(end_tokens), dtype=torch.long, device=device)
    answers: list[list[int]] = [[] for _ in range(rows)]
    features: list[list[torch.Tensor]] = [[] for _ in range(rows)]
    alive = torch.arange(rows, device=device)  # the original row of each batch row
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    fed, fed_positions = ids, positions
    for step in range(max_new_tokens):
        output = model(
            input_ids=fed,
            attention_mask=mask,
            position_ids=fed_positions,
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=keep_features,
            logits_to_keep=1,
        )
        logits = output.logits[:, -1]
        if temperature > 0:
            token = _sample(logits, temperature, top_p, generator)
        else:
            token = logits.argmax(-1)
        owners, finished_before = alive.tolist(), done.tolist()
        if keep_features:
            hidden = output.hidden_states[-1].to(torch.bfloat16).cpu()
            for slot, row in enumerate(owners):
                if not finished_before[slot]:
                    skip = width - len(prompts[row]) if step == 0 else 0
                    features[row].append(hidden[slot, skip:])
        for slot, (row, value) in enumerate(zip(owners, token.tolist(), strict=True)):
            if not finished_before[slot]:
                answers[row].append(value)
        done = done | torch.isin(token, ends)
        finished = int(done.sum())
        if finished == len(owners):
            break
        fed = token[:, None]
        mask = torch.cat((mask, mask.new_ones(len(owners), 1)), dim=1)
        fed_positions = fed_positions[:, -1:] + 1
        if finished and finished * 8 >= len(owners):
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            alive, done = alive[keep], done[keep]
            fed, mask, fed_positions = fed[keep], mask[keep], fed_positions[keep]
    result = GeneratedBatch([], [], [])
    for row, prompt in enumerate(prompts):
        sequence = torch.tensor([*prompt, *answers[row]], dtype=torch.long)
        result.ids.append(sequence)
        result.prompt_lengths.append(len(prompt))
        if keep_features:
            # features exist for every position fed: the prompt and all answer
            # tokens but the last (nothing was fed after it)
            row_features = torch.cat(features[row], dim=0)[: sequence.shape[0] - 1]
            result.features.append(row_features.clone())
    return result


def shard_path(directory: Path, index: int) -> Path:
    return directory / f"shard-{index:05d}.pt"


def make_answers(
    writer: PreTrainedModel,
    target: PreTrainedModel,
    prompts: Sequence[str],
    directory: Path,
    *,
    encode: Callable[[str], list[int]],
    end_tokens: Sequence[int],
    pad_id: int,
    max_new_tokens: int = 256,
    shard_size: int = 64,
    batch_size: int = 32,
    token_budget: int | None = None,
    progress: ProgressCallback | None = None,
    on_message: Callable[[str], None] | None = None,
) -> int:
    """Greedy answers to `prompts` and the target's features, one shard per
    `shard_size` prompts; shards already on disk are kept. `writer` writes the
    answers (the target, or a cheaper copy of it where that is faster: a copy
    agrees with the target on almost every token, and the features, hence the
    training labels, always come from `target`). Stops after the shard that
    passes `token_budget` answer tokens. Returns the answer tokens on disk.
    When the target writes, its features are the ones read during writing;
    a copy's answers are read by the target in one more pass.
    A shard that cannot be read (cut short, zero-filled, not a shard) is
    removed, with a line to `on_message`, and made again."""
    directory.mkdir(parents=True, exist_ok=True)
    shards = (len(prompts) + shard_size - 1) // shard_size
    tokens = 0
    for path in sorted(directory.glob("shard-*.pt")):
        records = _read_shard(path, on_message)
        tokens += sum(_answer_tokens(record) for record in records or ())
    for index in range(shards):
        path = shard_path(directory, index)
        if path.exists():
            continue
        if token_budget is not None and tokens >= token_budget:
            break
        chunk = [encode(text) for text in prompts[index * shard_size : (index + 1) * shard_size]]
        chunk.sort(key=len)
        sequences: list[torch.Tensor] = []
        prompt_lengths: list[int] = []
        features: list[torch.Tensor] = []
        for start in range(0, len(chunk), batch_size):
            generated = batched_generate(
                writer,
                chunk[start : start + batch_size],
                max_new_tokens=max_new_tokens,
                end_tokens=end_tokens,
                pad_id=pad_id,
                keep_features=writer is target,
            )
            sequences.extend(generated.ids)
            prompt_lengths.extend(generated.prompt_lengths)
            features.extend(generated.features)
        if writer is not target:
            features = target_features(target, sequences, pad_id=pad_id)
        records = [
            {"ids": ids, "features": feats, "prompt_length": length}
            for ids, feats, length in zip(sequences, features, prompt_lengths, strict=True)
        ]
        write_atomically(path, lambda file, r=records: torch.save(r, file))
        tokens += sum(_answer_tokens(record) for record in records)
        if progress is not None:
            progress(DataProgress("answers", index + 1, shards, tokens))
    return tokens


@torch.no_grad()
def target_features(
    model: PreTrainedModel,
    sequences: Sequence[torch.Tensor],
    *,
    pad_id: int,
    batch_size: int = 8,
    feature_layers: tuple[int, ...] = (),
    on_model_device: bool = False,
) -> list[torch.Tensor]:
    """The model's final hidden state at every position of each sequence but
    the last, as bfloat16 (L - 1, hidden) on the CPU (on the model's device
    with `on_model_device`: a GPU keeps them for training); with `feature_layers`,
    those decoder layers' outputs before it (L - 1, hidden x (layers + 1)), as
    the engine gives them to a drafter (`forward.selected_features`). Sequences
    are batched by length (right padding, masked) to waste little on padding."""
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    result: list[torch.Tensor | None] = [None] * len(sequences)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = max(len(sequences[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for slot, i in enumerate(rows):
            ids[slot, : len(sequences[i])] = sequences[i]
            mask[slot, : len(sequences[i])] = 1
        output = model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            output_hidden_states=True,
            logits_to_keep=1,
        )
        hidden = selected_features(output.hidden_states, feature_layers)
        hidden = hidden.to(torch.bfloat16)
        if not on_model_device:
            hidden = hidden.cpu()
        for slot, i in enumerate(rows):
            result[i] = hidden[slot, : len(sequences[i]) - 1].clone()
    return [features for features in result if features is not None]


def _answer_tokens(record: dict) -> int:
    return int(record["ids"].shape[0]) - int(record["prompt_length"])


def _read_shard(path: Path, on_message: Callable[[str], None] | None) -> list[dict] | None:
    """A shard's records, or None after removing a shard that does not load as
    a list of records (with one line saying so: it is made again)."""
    try:
        records = torch.load(path, weights_only=True)
        if isinstance(records, list):
            return records
        problem = "not a list of records"
    except Exception as error:
        problem = unreadable(error)
    if on_message is not None:
        on_message(f"the answer shard {path} is damaged ({problem}): it is made again")
    path.unlink(missing_ok=True)
    return None


def load_shards(directory: Path) -> Iterator[dict]:
    """Every record of every complete shard in `directory`, in shard order."""
    for path in sorted(directory.glob("shard-*.pt")):
        yield from torch.load(path, weights_only=True)
