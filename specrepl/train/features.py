"""The target's features for training records that hold token ids only.

Data kept in a repository (`shards.py`) holds no features: they are
recomputed from the ids with the target (`data.target_features`, a batched
forward pass over prompt and answer) when a record is first used in training,
and kept in memory while they fit a budget, so that later passes over small
data cost nothing more. On a GPU they are kept in its memory (a third of what
is free there) and computed in larger batches, so that a training step never
moves them through the host. A record that already carries features (the
shards of the cache's work directory) is used as it is.

It knows nothing of the file formats, the head or the training loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.train.data import target_features

__all__ = ["FEATURE_BUDGET_BYTES", "FeatureSource", "feature_budget_bytes", "forward_batch_for"]

FEATURE_BUDGET_BYTES = 4 << 30
"""Features kept in memory where the free memory cannot be read (4 GiB: 3.7M
positions of a 576-wide target in bfloat16); beyond the budget they are
recomputed whenever a record is used."""


CPU_FORWARD_BATCH = 8
"""Sequences per feature pass on a CPU: the hidden states of every layer of a
batch are alive at once, and larger batches gain nothing there."""
GPU_FORWARD_POSITIONS = 1 << 15
"""Positions per feature pass on a GPU (all layers' states of 32k positions of
a 576-wide model in float32 are 2.2 GB): enough to fill the device."""


def forward_batch_for(device: torch.device, longest: int) -> int:
    """Sequences per feature pass: CPU_FORWARD_BATCH on a CPU; on a GPU as many
    sequences of the `longest` length as make GPU_FORWARD_POSITIONS."""
    if device.type == "cpu":
        return CPU_FORWARD_BATCH
    return max(1, GPU_FORWARD_POSITIONS // max(1, longest))


def feature_budget_bytes(device: torch.device | None = None) -> int:
    """Features kept in memory: a third of the memory free now on `device`
    (host memory for a CPU or None; at least 1 GiB), or FEATURE_BUDGET_BYTES
    where the system does not say."""
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(1 << 30, free // 3)
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return FEATURE_BUDGET_BYTES
    return max(1 << 30, free // 3)


class FeatureSource:
    """Fills in the target's features of records that lack them."""

    def __init__(
        self,
        target: PreTrainedModel,
        *,
        budget_bytes: int | None = None,
        pad_id: int = 0,
        feature_layers: tuple[int, ...] = (),
    ) -> None:
        self.target = target
        self.feature_layers = tuple(feature_layers)
        hidden = int(target.config.get_text_config().hidden_size)
        self.width = hidden * (len(self.feature_layers) + 1)
        self.device = next(target.parameters()).device
        self.on_device = self.device.type != "cpu"  # a GPU keeps its features in its memory
        self.budget_bytes = (
            feature_budget_bytes(self.device) if budget_bytes is None else budget_bytes
        )
        self.pad_id = pad_id  # right padding under a mask: any id gives the same features
        self.kept_bytes = 0
        self.computed = 0
        self.seconds = 0.0  # spent computing features (a GPU's work waited for)

    def with_features(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """`records` in order, each with its "features" (L - 1, hidden) in
        bfloat16: the record's own, kept ones, or computed now in one batched
        pass. Computed features are kept in the record while the budget allows.
        A record's own features of another width (captured while writing, the
        final layer's only, for a head that fuses earlier layers) are replaced."""
        missing = [record for record in records if not self._has_features(record)]
        if not missing:
            return list(records)
        began = time.perf_counter()
        longest = max(int(r["ids"].shape[0]) for r in missing)
        computed = target_features(
            self.target,
            [r["ids"] for r in missing],
            pad_id=self.pad_id,
            batch_size=forward_batch_for(self.device, longest),
            feature_layers=self.feature_layers,
            on_model_device=self.on_device,
        )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - began
        self.computed += len(missing)
        fresh: dict[int, torch.Tensor] = {}
        for record, features in zip(missing, computed, strict=True):
            size = features.numel() * features.element_size()
            if self.kept_bytes + size <= self.budget_bytes:
                record["features"] = features
                self.kept_bytes += size
            else:
                fresh[id(record)] = features
        return [
            {**record, "features": fresh[id(record)]} if id(record) in fresh else record
            for record in records
        ]

    def _has_features(self, record: dict[str, Any]) -> bool:
        features = record.get("features")
        return features is not None and int(features.shape[-1]) == self.width
