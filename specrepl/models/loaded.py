"""One loaded model: the model, what the user should know about it, and its tuning.

A `LoadedModel` describes a model as loaded (source, kind, dtype, device,
quantization, size, load time), carries its `Tuning`, and can let go of a
model that can be loaded again and bring it back, tuned as before. This
module knows nothing about where models come from, pairs or decoding.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.devices import release_memory
from specrepl.engine.forward import logits_width, model_device
from specrepl.engine.placement import describe_placement, placed_map
from specrepl.engine.tuning import Tuning
from specrepl.models.devices import dtype_name
from specrepl.models.errors import ModelLoadError
from specrepl.models.quantization import quantization_of
from specrepl.models.tuning import apply_tuning

__all__ = ["LoadedModel"]


@dataclass
class LoadedModel:
    """One loaded model and what the user should know about it.

    `name` is the source the user asked for; `kind` is "embedded", "gguf",
    "directory" or "hub" (or "memory" for models wrapped by
    `ModelPair.from_models`); `from_cache` says a GGUF file was served from
    its converted copy rather than converted by this load; `gguf` is the GGUF
    file it was loaded from, if any (what the llama.cpp bench peer runs).

    A model loaded from files can be dropped from memory while nothing needs
    it (`release`: the session does so with a drafter that llama.cpp runs)
    and comes back as it was the next time `model` is read: loaded again by
    the same call from the same files (a GGUF file's converted copy, ~0.2 s
    for the embedded model), in eval mode, tuned as it was (`tuning`); or, if
    something else still held it, that same object. A model wrapped in memory
    (no `reload`) is never released.

    `tuning` is the model's `Tuning` (`specrepl.engine.tuning`), made here
    empty and filled by `specrepl.models.tuning` (and `width_plans`): what
    runs the model passes it to the generators and drafters. It outlives a
    release, so the model comes back with its width plan, linear forms and
    attention (and packed copies made again for its new layers, where the
    memory allows).
    """

    held: PreTrainedModel | None
    """The model while it is in memory; None once released (`model` loads it again)."""
    name: str
    kind: str
    dtype: torch.dtype
    device: torch.device
    quantization: str | None
    parameters: int
    memory_bytes: int
    load_seconds: float
    from_cache: bool = False
    gguf: Path | None = None
    reload: Callable[[], PreTrainedModel] | None = field(default=None, repr=False)
    """Loads the model again (None: it cannot be, so it is never released)."""
    reloads: int = field(default=0, init=False)
    """How many times the model was loaded again after a `release`."""
    tuning: Tuning = field(default_factory=Tuning)
    """How specrepl's forward passes run the model (see above)."""
    placement: dict[str, str] | None = None
    """Where transformers placed its parts (module to `cpu`, `disk`, `cuda:N`)
    when it is split or offloaded (`engine.placement.placed_map`); None: whole
    on `device`. Such a model is never tuned: its passes are stock."""
    _dropped: weakref.ref[PreTrainedModel] | None = field(default=None, init=False, repr=False)

    @classmethod
    def wrap(
        cls,
        model: PreTrainedModel,
        *,
        name: str,
        kind: str,
        load_seconds: float = 0.0,
        from_cache: bool = False,
        gguf: Path | None = None,
        reload: Callable[[], PreTrainedModel] | None = None,
    ) -> LoadedModel:
        """Describe an already-built model (put into eval mode); `reload` loads
        it again after a `release` (None: never released)."""
        model.eval()
        return cls(
            held=model,
            name=name,
            kind=kind,
            dtype=model.dtype,
            device=model_device(model),
            quantization=quantization_of(model),
            parameters=model.num_parameters(),
            memory_bytes=model.get_memory_footprint(),
            load_seconds=load_seconds,
            from_cache=from_cache,
            gguf=gguf,
            reload=reload,
            placement=placed_map(model),
        )

    @property
    def offloaded(self) -> bool:
        """Whether its parts are split over devices or offloaded (see `placement`)."""
        return self.placement is not None

    @property
    def model(self) -> PreTrainedModel:
        """The model, loaded again first if it was released (raises ModelLoadError
        if that fails: its files are gone, say). A released model that something
        else still held is taken back as it is, not loaded a second time."""
        if self.held is None:
            alive = None if self._dropped is None else self._dropped()
            if alive is not None:
                self.held = alive
            elif self.reload is None:  # release() keeps such a model: never reached
                raise ModelLoadError(f"{self.name} was released and cannot be loaded again")
            else:
                model = self.reload()
                model.eval()
                apply_tuning(model, self.tuning)
                self.held, self.reloads = model, self.reloads + 1
            self._dropped = None
        return self.held

    @property
    def resident(self) -> bool:
        """Whether the model is in memory now (False after a `release`)."""
        return self.held is not None

    @property
    def releasable(self) -> bool:
        """Whether `release` can drop the model (it can be loaded again)."""
        return self.reload is not None

    def release(self) -> bool:
        """Let go of the model until `model` is next read, keeping its tuning,
        and give its memory back (`devices.release_memory`); returns whether it
        was let go (False for one that cannot be loaded again, which stays). The
        memory is freed only if nothing else holds the model (a drafter built
        on it, a kept cache)."""
        if self.reload is None:
            return False
        if self.held is not None:
            self._dropped = weakref.ref(self.held)
            self.held = None
            release_memory()
        return True

    @property
    def logits_width(self) -> int:
        return logits_width(self.model)

    def to_dict(self) -> dict[str, Any]:
        """What was loaded, JSON-ready (for --json output and benchmark reports);
        `attention` is what its passes attend with."""
        return {
            "name": self.name,
            "kind": self.kind,
            "dtype": dtype_name(self.dtype),
            "quantization": self.quantization,
            "parameters": self.parameters,
            "memory_bytes": self.memory_bytes,
            "load_seconds": self.load_seconds,
            "from_cache": self.from_cache,
            "gguf": None if self.gguf is None else str(self.gguf),
            "attention": self.tuning.attention or self.model.config._attn_implementation,
            "placement": self.placement,
        }

    def describe(self) -> str:
        """One line: name, kind, dtype, quantization, parameters and memory."""
        dtype = dtype_name(self.dtype)
        quantization = f" {self.quantization}" if self.quantization else ""
        cached = ", cached copy" if self.from_cache else ""
        placed = "" if self.placement is None else f"; placed: {self.describe_placement()}"
        return (
            f"{self.name} [{self.kind}{cached}] {dtype}{quantization}, "
            f"{_count(self.parameters)} params, {_bytes(self.memory_bytes)}{placed}"
        )

    def describe_placement(self) -> str:
        """Where its parts live, in a few words (`whole on cpu` for a model
        that is not placed)."""
        if self.placement is None:
            return f"whole on {self.device}"
        return describe_placement(self.placement)


def _count(n: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def _bytes(n: int) -> str:
    for size, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= size:
            return f"{n / size:.1f} {suffix}"
    return f"{n} B"
