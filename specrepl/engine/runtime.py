"""The one way the decoding loop runs a model: a `ModelRuntime` and the model it runs.

A `RunnableModel` is a model the loop can run (`TorchModel`: a transformers
model with its `Tuning`; `llamacpp_runtime.LlamaCppModel`: a GGUF file in
llama.cpp). Each generation, or each conversation that keeps its state, opens
a `ModelRuntime` from it: the model's keys and values for a prefix of one
sequence, and the calls that move that prefix.

- `score(sequence, keep)`: feed the tokens of `sequence` the runtime does
  not hold yet, return the logits of the last `keep` positions (and the
  model's features at the positions fed, where asked and given);
- `length`: how many leading tokens of the sequence it holds;
- `rollback_to(length)`: drop the rest;
- `key_values()`: what a copy of the model drafting beside it takes keys
  and values from: a transformers cache (torch), the runtime itself
  (llama.cpp, whose `sequence_state` a llama.cpp copy takes), or None;
- `step_seconds()`: measured seconds of a pass by number of drafts, where
  the model was timed (the gamma policy reads them before a run).

The loop, `PromptCache` and the drafters that run a model talk to runtimes
and never to a cache type; how a runtime makes its passes cheap (width
plans, linear forms, llama.cpp's batches) is its own business. A third kind
(a static cache, compiled) is a third subclass.

This module knows nothing about drafting, acceptance or settings.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.forward import context_length, forward_pass, logits_width, model_device
from specrepl.engine.kv_cache import cached_length, new_cache, rollback_to
from specrepl.engine.placement import run_devices
from specrepl.engine.tuning import Tuning

__all__ = ["FeaturesUnavailable", "ModelRuntime", "RunnableModel", "TorchModel", "TorchRuntime"]


class FeaturesUnavailable(ValueError):
    """A drafter asked for the target's features from a runtime that cannot give them."""


class ModelRuntime(ABC):
    """One model's state over a prefix of one sequence (see the module docstring)."""

    name: str = "runtime"

    @property
    @abstractmethod
    def model(self) -> Any:
        """The `RunnableModel` (or transformers model) this runtime runs."""

    @property
    @abstractmethod
    def length(self) -> int:
        """How many leading tokens of the sequence the runtime holds."""

    @abstractmethod
    def score(
        self,
        sequence: torch.Tensor,
        keep: int,
        vocab_size: int,
        *,
        features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (keep, vocab_size) of the last `keep` positions of `sequence`
        (1-D ids), after feeding what the runtime does not hold; with
        `features`, the model's final hidden states (and `feature_layers`'
        outputs before them) at the positions fed, else None."""

    @abstractmethod
    def rollback_to(self, length: int) -> None:
        """Hold at most the first `length` tokens."""

    def key_values(self) -> Any:
        """What a copy drafting beside this runtime takes its keys and values
        from (see the module docstring), or None."""
        return None

    def step_seconds(self) -> Mapping[int, float] | None:
        """Measured seconds of one pass by number of drafts (None: not timed)."""
        return None


class RunnableModel(ABC):
    """A model the loop can run: what a runtime is opened from."""

    device: torch.device
    """Where its input ids go (and where the loop keeps the sequence)."""
    width: int
    """Logits per position (a padded vocabulary counts its padding)."""
    context: int | None
    """Positions the model can hold (None: not stated)."""
    runtime_name: str = "runtime"
    """What runs it, in words ("torch", "llama.cpp")."""
    gives_features: bool = False
    """Whether its runtimes' `score(..., features=True)` return the model's hidden states."""
    features_problem: str | None = None
    """Why its runtimes give no features, where a reason is known (None: none given)."""
    gives_key_values: bool = False
    """Whether its runtimes' `key_values()` hand a `DynamicCache` to a torch copy that takes one."""

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """Every device its passes run on (a clock synchronizes them all)."""
        return (self.device,)

    def one_token_seconds(self) -> float | None:
        """Measured seconds of a one-token pass (None: not timed)."""
        return None

    @abstractmethod
    def open(self, *, use_cache: bool = True) -> ModelRuntime:
        """A new, empty runtime (`use_cache=False`: one that recomputes every pass)."""

    @abstractmethod
    def runs(self, model: Any) -> bool:
        """Whether this is `model` (a runtime kept for one model serves no other)."""


class TorchModel(RunnableModel):
    """A transformers causal LM run eagerly, with its `Tuning`."""

    runtime_name = "torch"
    gives_features = True
    gives_key_values = True

    def __init__(self, model: PreTrainedModel, tuning: Tuning | None = None) -> None:
        self.model = model
        self.tuning = Tuning() if tuning is None else tuning
        self.device = model_device(model)
        self._devices = run_devices(model)
        self.width = logits_width(model)
        self.context = context_length(model)

    @property
    def devices(self) -> tuple[torch.device, ...]:
        return self._devices

    def one_token_seconds(self) -> float | None:
        return self.tuning.one_token_step

    def open(self, *, use_cache: bool = True) -> TorchRuntime:
        return TorchRuntime(self, new_cache(self.model) if use_cache else None)

    def runs(self, model: Any) -> bool:
        return (
            model is self
            or model is self.model
            or (isinstance(model, TorchModel) and model.model is self.model)
        )


class TorchRuntime(ModelRuntime):
    """A transformers model over a `DynamicCache` (None: every pass recomputes
    the whole sequence). Its passes run as its model's `Tuning` says."""

    name = "torch"

    def __init__(self, model: TorchModel, cache: DynamicCache | None) -> None:
        self._model = model
        self.cache = cache

    @property
    def model(self) -> TorchModel:
        return self._model

    @property
    def length(self) -> int:
        return cached_length(self.cache)

    def score(
        self,
        sequence: torch.Tensor,
        keep: int,
        vocab_size: int,
        *,
        features: bool = False,
        feature_layers: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return forward_pass(
            self._model.model,
            sequence,
            self.cache,
            keep,
            vocab_size,
            features=features,
            feature_layers=feature_layers,
            tuning=self._model.tuning,
        )

    def rollback_to(self, length: int) -> None:
        rollback_to(self.cache, length)

    def key_values(self) -> DynamicCache | None:
        return self.cache

    def step_seconds(self) -> Mapping[int, float] | None:
        plan = self._model.tuning.plan
        return None if plan is None else plan.step_seconds()


def as_runnable(
    model: RunnableModel | PreTrainedModel, tuning: Tuning | None = None
) -> RunnableModel:
    """`model` as the loop runs it: a transformers model becomes a `TorchModel`
    with `tuning`; a `RunnableModel` passes through."""
    if isinstance(model, RunnableModel):
        return model
    if isinstance(model, PreTrainedModel):
        return TorchModel(model, tuning)
    raise TypeError(
        f"a target must be a transformers causal LM or a RunnableModel, got {type(model).__name__}"
    )
