"""A transformers model over a static cache, its passes compiled at fixed widths: the third runtime.

`StaticTorchModel` holds one transformers `StaticCache` (its keys and values
at fixed addresses, as long as the model's context or less) and, where asked
(`compile`), the model's forward compiled once per width bucket: on a GPU in
`reduce-overhead` mode, so that a pass replays as one CUDA graph instead of
hundreds of kernel launches. A pass of n new tokens is fed as the smallest
bucket of at least n tokens, the rest padding: a token attends only to the
positions before it, and the padding's keys and values sit past the real
length, where the next pass writes over them before any token can read them.
A prompt longer than the widest bucket, or a pass that would run past the
cache's end with its padding, is fed as it is, uncompiled, over the same
cache.

The length held is a host integer: rolling back sets each layer's fill mark
(a device tensor written in place, no synchronisation), never reads one.
The cache, and so the compiled graphs that read it at fixed addresses,
belong to the model: one runtime's prefix is in it at a time. When another
runtime passes (a chat keeps one for the speculative run and one for the
target alone), the prefix in the cache is copied out to the runtime that
held it, if that runtime is still referenced, and the new one's copied in:
once a generation, the held positions only.

`warm_up()` compiles every bucket ahead of the first answer and times each
(the gamma policy reads the times as `step_seconds`). Models with sliding-
window layers and models placed over several devices are refused.

This module knows nothing about drafting, acceptance or settings.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel, StaticCache

from specrepl.engine.devices import synchronize
from specrepl.engine.forward import context_length, logits_width, model_device, selected_features
from specrepl.engine.placement import placed_map
from specrepl.engine.runtime import ModelRuntime, RunnableModel, TorchModel, TorchRuntime

__all__ = ["DEFAULT_BUCKETS", "StaticRuntime", "StaticRuntimeRefused", "StaticTorchModel"]

DEFAULT_BUCKETS = (1, 5, 9, 17)
"""Widths compiled: one token, and gamma 4, 8 and 16's verification passes."""
DEFAULT_LENGTH = 4096
"""Positions the cache holds when the model states no context, or a longer one."""


class StaticRuntimeRefused(ValueError):
    """A model the static runtime cannot run, with the reason."""


class StaticTorchModel(RunnableModel):
    """A transformers causal LM over one static cache, compiled by width bucket
    where `compile` says (None: on a GPU only). See the module docstring."""

    runtime_name = "static"
    gives_features = True
    gives_key_values = False

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_length: int | None = None,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        compile: bool | None = None,
    ) -> None:
        placed = placed_map(model)
        if placed is not None:
            raise StaticRuntimeRefused(
                "the static runtime runs a model on one device; this one is placed over "
                + ", ".join(sorted(set(placed.values())))
            )
        if not buckets or min(buckets) < 1:
            raise StaticRuntimeRefused(f"buckets must be positive widths, got {tuple(buckets)}")
        self.model = model
        self.device = model_device(model)
        self.width = logits_width(model)
        stated = context_length(model)
        self.context = min(max_length or DEFAULT_LENGTH, stated or DEFAULT_LENGTH)
        self.buckets = tuple(sorted(set(buckets)))
        self.compiled = self.device.type == "cuda" if compile is None else compile
        self.cache = StaticCache(config=model.config, max_cache_len=self.context)
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):
            raise StaticRuntimeRefused(
                "the model has sliding-window layers, whose static cache cannot roll back: "
                "run it in torch"
            )
        self._allocate()
        self._forward: Callable[..., Any] = model.forward
        if self.compiled:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self._forward = torch.compile(model.forward, mode=mode, dynamic=False)
        self._live: weakref.ref[StaticRuntime] | None = None
        self._bucket_seconds: dict[int, float] = {}
        self.warm_up_seconds: float | None = None
        self._eager = TorchModel(model)

    def _allocate(self) -> None:
        """Fill the cache's tensors with one eager token, outside inference
        mode (a cache first filled inside it could not be written outside)."""
        with torch.inference_mode(False), torch.no_grad():
            self.model(
                input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device),
                past_key_values=self.cache,
                cache_position=torch.zeros(1, dtype=torch.long, device=self.device),
                use_cache=True,
                logits_to_keep=1,
            )
        self._set_length(0)

    def open(self, *, use_cache: bool = True) -> ModelRuntime:
        if not use_cache:  # every pass recomputes the whole sequence: nothing to hold
            return TorchRuntime(self._eager, None)
        return StaticRuntime(self)

    def runs(self, model: Any) -> bool:
        return (
            model is self
            or model is self.model
            or (isinstance(model, StaticTorchModel) and model.model is self.model)
        )

    def activate(self, runtime: StaticRuntime) -> None:
        """Put `runtime`'s prefix in the cache (see the module docstring)."""
        live = None if self._live is None else self._live()
        if live is runtime:
            return
        if live is not None:
            live.saved = [
                (layer.keys[:, :, : live.length].clone(), layer.values[:, :, : live.length].clone())
                for layer in self.cache.layers
            ]
        if runtime.saved is not None:
            for layer, (keys, values) in zip(self.cache.layers, runtime.saved, strict=True):
                held = keys.shape[2]
                layer.keys[:, :, :held].copy_(keys)
                layer.values[:, :, :held].copy_(values)
            runtime.saved = None
        self._live = weakref.ref(runtime)

    def bucket_for(self, width: int) -> int | None:
        """The compiled width a pass of `width` new tokens is fed as (None: none is wide enough)."""
        return next((bucket for bucket in self.buckets if bucket >= width), None)

    def warm_up(self, *, repeats: int = 3) -> dict[int, float]:
        """Compile and time every bucket (median seconds of `repeats` passes
        after the first), at the start of a context; the cache is left empty."""
        began = time.perf_counter()
        runtime = self.open()
        ids = torch.arange(1, max(self.buckets) + 2, device=self.device) % self.width
        with torch.no_grad():
            runtime.score(ids[:1], 1, self.width)
            for bucket in self.buckets:
                times = []
                for _ in range(repeats + 1):
                    synchronize(self.device)
                    start = time.perf_counter()
                    runtime.score(ids[: 1 + bucket], bucket, self.width)
                    synchronize(self.device)
                    times.append(time.perf_counter() - start)
                    runtime.rollback_to(1)
                self._bucket_seconds[bucket] = statistics.median(times[1:])
        runtime.rollback_to(0)
        self.warm_up_seconds = time.perf_counter() - began
        return dict(self._bucket_seconds)

    def one_token_seconds(self) -> float | None:
        return self._bucket_seconds.get(1)

    def step_seconds(self) -> Mapping[int, float] | None:
        """Measured seconds of a pass by number of drafts (the bucket it is fed as)."""
        if not self._bucket_seconds:
            return None
        steps = {}
        for drafts in range(max(self.buckets)):
            bucket = self.bucket_for(drafts + 1)
            if bucket in self._bucket_seconds:
                steps[drafts] = self._bucket_seconds[bucket]
        return steps

    def feed(
        self, ids: torch.Tensor, start: int, keep: int, *, features: bool
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Run the model over `ids` (1-D, on the device) at positions from
        `start`; the cache then holds `start + len(ids)` positions. Returns
        the logits of the last `keep` positions fed and, with `features`, the
        hidden states of every position fed (both taken out of the compiled
        graph's memory). An uncompiled feed computes only the logits kept (a
        long prompt's other positions never reach the output layer)."""
        count = ids.shape[0]
        bucket = self.bucket_for(count)
        fits = bucket is not None and start + bucket <= self.context
        forward = self._forward if fits else self.model.forward
        width = bucket if fits else count
        if start + width > self.context:
            raise ValueError(
                f"{start + count} positions do not fit the static cache of {self.context}"
            )
        if width > count:
            ids = torch.cat((ids, ids[-1:].expand(width - count)))
        positions = torch.arange(start, start + width, device=self.device)
        self._set_length(start)
        if fits and self.compiled and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        output = forward(
            input_ids=ids.unsqueeze(0),
            past_key_values=self.cache,
            cache_position=positions,
            position_ids=positions.unsqueeze(0),
            use_cache=True,
            logits_to_keep=0 if fits else keep,  # a compiled bucket's call never changes
            output_hidden_states=features,
        )
        self._set_length(start + count)
        logits = output.logits[0, :count][-keep:].clone()
        if not features:
            return logits, None
        return logits, tuple(state[:, :count].clone() for state in output.hidden_states)

    def _set_length(self, length: int) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(length)


class StaticRuntime(ModelRuntime):
    """One sequence's prefix in a `StaticTorchModel`'s cache, its length on the host."""

    name = "static"

    def __init__(self, model: StaticTorchModel) -> None:
        self._model = model
        self._length = 0
        self.saved: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        """Its prefix's keys and values while another runtime's are in the cache."""

    @property
    def model(self) -> StaticTorchModel:
        return self._model

    @property
    def length(self) -> int:
        return self._length

    def score(
        self,
        sequence: torch.Tensor,
        keep: int,
        vocab_size: int,
        *,
        features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        self._model.activate(self)
        total = sequence.shape[0]
        start = min(self._length, total - keep)
        if start >= total or start < 0:
            raise RuntimeError(f"cannot keep {keep} logits of a sequence of {total} tokens")
        with torch.no_grad():
            logits, hidden = self._model.feed(sequence[start:], start, keep, features=features)
        self._length = total
        logits = logits[:, :vocab_size]
        if hidden is None:
            return logits, None
        return logits, selected_features(hidden, feature_layers)[0]

    def rollback_to(self, length: int) -> None:
        self._length = min(self._length, max(length, 0))
        if self.saved is not None:
            self.saved = [(k[:, :, : self._length], v[:, :, : self._length]) for k, v in self.saved]
