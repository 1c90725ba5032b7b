"""Logits processors: turn a model's logits into the distribution to sample from.

The same processor is applied to the target's and the drafter's logits so that
rejection sampling compares p and q of the same kind (NOTES.md). Every method is
a pure function of its input: the caller's tensor is never modified.

A processor knows nothing about models or tokenizers. `probabilities` works on
the last dimension of a tensor of any shape, so the verifier can ask for the
target's distributions at every draft position at once.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

__all__ = [
    "PROCESSORS",
    "GreedyProcessor",
    "LogitsProcessor",
    "MultinomialProcessor",
    "NucleusProcessor",
    "TopKNucleusProcessor",
    "TopKProcessor",
    "make_processor",
]


def _check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _check_top_k(top_k: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")


def _check_top_p(top_p: float) -> None:
    if not (isinstance(top_p, (int, float)) and math.isfinite(top_p)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax in float32 that never returns NaN.

    Non-finite logits (half-precision overflow) count as impossible tokens; a row
    with no finite entry becomes a point mass on token 0 rather than NaNs.
    """
    logits = logits.float()
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        logits = logits.masked_fill(~finite, -math.inf)
        dead = ~finite.any(dim=-1, keepdim=True)
        first = torch.arange(logits.shape[-1], device=logits.device) == 0
        logits = logits.masked_fill(dead & first, 0.0)
    return torch.softmax(logits, dim=-1)


def _mask_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -math.inf)


def _mask_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = _softmax(sorted_logits)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False  # the most likely token always stays
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


class LogitsProcessor(ABC):
    """Maps logits to a probability distribution and samples from it."""

    name: str = ""
    is_greedy: bool = False

    @abstractmethod
    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        """Return new (float32) logits; must not modify its argument."""

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution over the last dimension, float32, rows sum to 1."""
        return _softmax(self._transform(logits.float().nan_to_num(nan=-math.inf)))

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token id per row of `probs` (shape `probs.shape[:-1]`)."""
        flat = probs.reshape(-1, probs.shape[-1])
        ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
        return ids.reshape(probs.shape[:-1])

    def parameters(self) -> dict[str, float | int]:
        return {}

    def describe(self) -> str:
        params = ", ".join(f"{key}={value}" for key, value in self.parameters().items())
        return f"{self.name}({params})" if params else self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.parameters()})"


@dataclass(frozen=True, repr=False)
class GreedyProcessor(LogitsProcessor):
    """Always the most likely token: a point mass on the argmax."""

    name = "greedy"
    is_greedy = True

    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.clone()

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float().nan_to_num(nan=-math.inf)
        top = torch.argmax(logits, dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return torch.argmax(probs, dim=-1)


@dataclass(frozen=True, repr=False)
class MultinomialProcessor(LogitsProcessor):
    """Sampling from softmax(logits / temperature)."""

    temperature: float = 1.0
    name = "multinomial"

    def __post_init__(self) -> None:
        _check_temperature(self.temperature)

    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.temperature

    def parameters(self) -> dict[str, float | int]:
        return {"temperature": self.temperature}


@dataclass(frozen=True, repr=False)
class TopKProcessor(LogitsProcessor):
    """Sampling among the top_k most likely tokens."""

    temperature: float = 1.0
    top_k: int = 50
    name = "topk"

    def __post_init__(self) -> None:
        _check_temperature(self.temperature)
        _check_top_k(self.top_k)

    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        return _mask_top_k(logits / self.temperature, self.top_k)

    def parameters(self) -> dict[str, float | int]:
        return {"temperature": self.temperature, "top_k": self.top_k}


@dataclass(frozen=True, repr=False)
class NucleusProcessor(LogitsProcessor):
    """Sampling from the smallest set of tokens whose probability reaches top_p."""

    temperature: float = 1.0
    top_p: float = 0.9
    name = "nucleus"

    def __post_init__(self) -> None:
        _check_temperature(self.temperature)
        _check_top_p(self.top_p)

    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        return _mask_top_p(logits / self.temperature, self.top_p)

    def parameters(self) -> dict[str, float | int]:
        return {"temperature": self.temperature, "top_p": self.top_p}


@dataclass(frozen=True, repr=False)
class TopKNucleusProcessor(LogitsProcessor):
    """Top-k first, then the nucleus of what is left."""

    temperature: float = 1.0
    top_k: int = 50
    top_p: float = 0.9
    name = "topknucleus"

    def __post_init__(self) -> None:
        _check_temperature(self.temperature)
        _check_top_k(self.top_k)
        _check_top_p(self.top_p)

    def _transform(self, logits: torch.Tensor) -> torch.Tensor:
        return _mask_top_p(_mask_top_k(logits / self.temperature, self.top_k), self.top_p)

    def parameters(self) -> dict[str, float | int]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


PROCESSORS: dict[str, type[LogitsProcessor]] = {
    cls.name: cls
    for cls in (
        GreedyProcessor,
        MultinomialProcessor,
        TopKProcessor,
        NucleusProcessor,
        TopKNucleusProcessor,
    )
}


def make_processor(
    name: str,
    *,
    temperature: float = 1.0,
    top_k: int = 50,
    top_p: float = 0.9,
) -> LogitsProcessor:
    """Build a processor by name, passing only the parameters it takes."""
    try:
        cls = PROCESSORS[name]
    except KeyError:
        raise ValueError(
            f"unknown processor {name!r}; choose one of: {', '.join(PROCESSORS)}"
        ) from None
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    accepted = {key: value for key, value in given.items() if key in cls.__dataclass_fields__}
    return cls(**accepted)
