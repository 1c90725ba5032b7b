"""The target's features for training records that hold token ids only.

Data kept in a repository (`shards.py`) holds no features: they are
recomputed from the ids with the target (`data.target_features`, a batched
forward pass over prompt and answer) when a record is first used in training,
and kept in memory while they fit a budget, so that later passes over small
data cost nothing more. A record that already carries features (the shards of
the cache's work directory) is used as it is.

It knows nothing of the file formats, the head or the training loop.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.train.data import target_features

__all__ = ["FEATURE_BUDGET_BYTES", "FeatureSource", "feature_budget_bytes"]

FEATURE_BUDGET_BYTES = 4 << 30
"""Features kept in memory where the free memory cannot be read (4 GiB: 3.7M
positions of a 576-wide target in bfloat16); beyond the budget they are
recomputed whenever a record is used."""


def feature_budget_bytes() -> int:
    """Features kept in memory: a third of the memory free now (at least 1
    GiB), or FEATURE_BUDGET_BYTES where the system does not say."""
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
        self.budget_bytes = feature_budget_bytes() if budget_bytes is None else budget_bytes
        self.pad_id = pad_id  # right padding under a mask: any id gives the same features
        self.kept_bytes = 0
        self.computed = 0

    def with_features(self, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """`records` in order, each with its "features" (L - 1, hidden) in
        bfloat16: the record's own, kept ones, or computed now in one batched
        pass. Computed features are kept in the record while the budget allows.
        A record's own features of another width (captured while writing, the
        final layer's only, for a head that fuses earlier layers) are replaced."""
        missing = [record for record in records if not self._has_features(record)]
        if not missing:
            return list(records)
        computed = target_features(
            self.target,
            [r["ids"] for r in missing],
            pad_id=self.pad_id,
            feature_layers=self.feature_layers,
        )
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
