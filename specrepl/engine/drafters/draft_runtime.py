"""What a model drafter runs its model in: a `DraftRuntime`, and the torch one.

The model drafter (`model.ModelDrafter`) is one class whatever runs its
model; what differs between runtimes is only how tokens are fed and what is
held, so that is all a `DraftRuntime` does:

- `held()`: the tokens whose keys and values it holds, in order (a runtime
  several drafters share, a llama.cpp binding, records them itself);
- `feed(tokens)`: read `tokens` after those held; `last_logits` then gives
  the logits after the last one;
- `cut(length)`: hold the first `length` tokens only; `forget()`: none.

`TorchDraftRuntime` runs a transformers model as the loop runs the target
(`engine.runtime.TorchModel`: its passes as its `Tuning` says, a
`DynamicCache`, or none: every pass then reads everything again);
`llamacpp.LlamaCppDraftRuntime` runs a GGUF file in llama.cpp. A copy of the
target takes the target's keys and values through an `Importer`:
`TorchImporter` here (`kv_cache.copy_positions`, cast to the copy's dtype),
`llamacpp_kv.KvImporter` and `llamacpp_state.StateImporter` for llama.cpp.
They share one shape (`available`, `estimate`, `estimate_append`, `write`,
`append`, `appends`/`windows`: whether a write can keep what the copy holds,
and whether the copy can hold a window of the sequence (the target's
positions after a gap, `drop` letting the oldest go), and `fewest_positions`:
the shortest stretch worth a handover rather than a read in the pass the
drafter runs anyway). `learn_append_cost` keeps an importer's expected costs
(a position's, and an append call's own) from its timed appends.

This module knows nothing about drafting policies, llama.cpp or settings.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.kv_cache import cached_length, can_copy_positions, copy_positions
from specrepl.engine.runtime import RunnableModel, TorchModel
from specrepl.engine.tuning import Tuning

__all__ = [
    "AppendCosts",
    "DraftRuntime",
    "Importer",
    "TorchDraftRuntime",
    "TorchImporter",
    "learn_append_cost",
]


class DraftRuntime(ABC):
    """A drafter model's keys and values over the tokens it was fed (see the module docstring)."""

    name: str = "runtime"
    width: int
    """Logits per position."""
    context: int | None
    """Positions it can hold (None: not stated)."""

    @property
    def model(self) -> Any:
        """What it runs (a transformers model, a llama.cpp binding)."""
        return None

    @abstractmethod
    def held(self) -> list[int]:
        """The tokens it holds keys and values for, in order."""

    @abstractmethod
    def feed(self, tokens: list[int]) -> None:
        """Read `tokens` after those held (at least one)."""

    @abstractmethod
    def last_logits(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        """Logits (vocab_size,) after the last token fed, on the runtime's own
        device where it has one, else on `device`."""

    @abstractmethod
    def cut(self, length: int) -> None:
        """Hold at most the first `length` tokens."""

    def forget(self) -> None:
        """Hold nothing."""
        self.cut(0)


class Importer(Protocol):
    """Writes a target's keys and values into a copy's runtime (see the module docstring)."""

    appends: bool
    windows: bool
    fewest_positions: int

    def available(self, target_cache: Any) -> int: ...

    def estimate(self, count: int) -> float: ...

    def estimate_append(self, positions: int) -> float: ...

    def write(self, target_cache: Any, count: int, tokens: list[int]) -> float: ...

    def append(self, target_cache: Any, start: int, count: int, tokens: list[int]) -> float:
        """Keep the copy's first `start` and take the target's start..count-1
        (one that `windows` takes `held=`: keep that many instead, and put the
        positions after them, where the target holds them)."""
        ...

    def drop(self, after: int, count: int) -> None:
        """(One that `windows`:) let the copy's held `after`..`after + count - 1` go."""
        ...


class AppendCosts(Protocol):
    """What an importer expects an append to cost (seconds)."""

    seconds_per_position: float
    append_seconds: float  # the call's own, besides its positions


def learn_append_cost(
    importer: AppendCosts, positions: int, seconds: float, *, long_stretch: int
) -> None:
    """Update `importer`'s expected costs after an append of `positions` took
    `seconds`. A long append (at least `long_stretch` positions) teaches the
    cost a position, net of the call's own; a short one teaches the call's
    own cost, net of its positions'. Each moves 0.3 of the way. (Charging a
    slow long append's whole excess to the call made every short handover
    after it look dear, and none was made again to correct it.)"""
    fixed, per_position = importer.append_seconds, importer.seconds_per_position
    if positions >= long_stretch:
        sample = max(0.0, seconds - fixed) / positions
        importer.seconds_per_position = 0.7 * per_position + 0.3 * sample
    else:
        importer.append_seconds = 0.7 * fixed + 0.3 * max(0.0, seconds - positions * per_position)


class TorchDraftRuntime(DraftRuntime):
    """A transformers model run as `TorchModel` runs it, or as another torch
    `RunnableModel` given instead runs it (`static_runtime.StaticTorchModel`:
    over a static cache, compiled on a GPU), over its own token record."""

    def __init__(
        self,
        model: PreTrainedModel | RunnableModel,
        *,
        tuning: Tuning | None = None,
        use_cache: bool = True,
    ) -> None:
        self.runnable = model if isinstance(model, RunnableModel) else TorchModel(model, tuning)
        self.name = self.runnable.runtime_name
        self.width = self.runnable.width
        self.context = self.runnable.context
        self.device = self.runnable.device
        self.runtime = self.runnable.open(use_cache=use_cache)
        self._held: list[int] = []
        self._ids = torch.empty(256, dtype=torch.long, device=self.device)  # `_held` for the passes
        self._logits: torch.Tensor | None = None

    @property
    def model(self) -> PreTrainedModel:
        return self.runnable.model  # type: ignore[attr-defined,no-any-return]

    @property
    def tuning(self) -> Tuning:
        """The eager model's tuning (a static runtime's passes take none)."""
        return getattr(self.runnable, "tuning", None) or Tuning()

    @property
    def cache(self) -> DynamicCache | None:
        """The `DynamicCache` a copy of the target takes keys and values into
        (None: none held, or a static runtime's, which takes none)."""
        return getattr(self.runtime, "cache", None)

    def held(self) -> list[int]:
        return self._held[:]  # read back from `_ids` it would cost a device sync

    def record(self, tokens: list[int]) -> None:
        """Add `tokens` to the record without a pass (their keys and values were handed over)."""
        start, end = len(self._held), len(self._held) + len(tokens)
        if end > self._ids.shape[0]:
            grown = self._ids.new_empty(max(end, 2 * self._ids.shape[0]))
            grown[:start] = self._ids[:start]
            self._ids = grown
        self._ids[start:end] = torch.tensor(tokens, dtype=torch.long)
        self._held.extend(tokens)

    def feed(self, tokens: list[int]) -> None:
        self.record(tokens)
        self._logits = self.runtime.score(self._ids[: len(self._held)], 1, self.width)[0][0]

    def last_logits(self, vocab_size: int, device: torch.device) -> torch.Tensor:
        if self._logits is None:
            raise RuntimeError("no token was fed since the runtime was cut")
        return self._logits[:vocab_size]

    def cut(self, length: int) -> None:
        if length < len(self._held):
            del self._held[length:]
            self._logits = None
        self.runtime.rollback_to(len(self._held))


class TorchImporter:
    """Hands a torch target's keys and values (a `DynamicCache`) to a copy run
    by a `TorchDraftRuntime` (`kv_cache.copy_positions`), in the copy's dtype,
    or in the target's where the copy's tuning says it attends in its cache's
    dtype (`copy_attention.py`: measured cheaper than casting). The copy
    appends what it lacks; it holds no window."""

    appends = True
    windows = False
    fewest_positions = 1

    def __init__(self, runtime: TorchDraftRuntime) -> None:
        self.runtime = runtime
        self.cache_dtype: torch.dtype | None = None
        """The dtype the target's keys and values are kept in (None: not decided yet)."""

    def available(self, target_cache: Any) -> int:
        """Positions the target's cache holds (0 for one that cannot be copied)."""
        if not isinstance(target_cache, DynamicCache) or not can_copy_positions(target_cache):
            return 0
        if self.runtime.cache is None:
            return 0
        return cached_length(target_cache)

    def estimate(self, count: int) -> float:
        return 0.0  # a copy in memory: cheaper than any read

    def estimate_append(self, positions: int) -> float:
        return 0.0

    def write(self, target_cache: DynamicCache, count: int, tokens: list[int]) -> float:
        return self.append(target_cache, 0, count, tokens)

    def append(
        self, target_cache: DynamicCache, start: int, count: int, tokens: list[int]
    ) -> float:
        """Keep the copy's first `start` tokens (`tokens[:start]`) and take the
        target's positions start..count-1; returns the seconds taken."""
        started = time.perf_counter()
        runtime = self.runtime
        runtime.cut(start)
        assert runtime.cache is not None
        copy_positions(
            target_cache,
            runtime.cache,
            count,
            dtype=self._dtype(target_cache),
            device=runtime.device,
        )
        runtime.record(tokens[start:count])
        return time.perf_counter() - started

    def _dtype(self, target_cache: DynamicCache) -> torch.dtype:
        """The copy's own dtype, or (decided at the first copy, from its tuning)
        the target's, attended as such."""
        source = target_cache.layers[0].keys.dtype
        own = self.runtime.model.dtype
        if self.cache_dtype is None:
            self.cache_dtype = source if self.runtime.tuning.attends_in_cache_dtype else own
        return self.cache_dtype if self.cache_dtype == source else own
