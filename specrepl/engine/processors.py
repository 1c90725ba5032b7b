"""Logits processors: turn a model's logits into the distribution to sample from.

The same processor is applied to the target's and the drafter's logits so that
rejection sampling compares p and q of the same kind: accepting a draft x with
probability min(1, p(x)/q(x)) keeps the target's law only when p and q are the
distributions each model's tokens are actually drawn from, after the same
temperature, top-k and top-p. Every method is a pure function of its input:
the caller's tensor is never modified.

A processor knows nothing about models or tokenizers. `probabilities` works on
the last dimension of a tensor of any shape, so the verifier can ask for the
target's distributions at every draft position at once.

Numerics (half-precision models overflow): a NaN logit counts as an impossible
token, a +inf logit takes its row's whole mass (the softmax's limit), and a row
with no finite logit at all is refused with `UnusableLogitsError` instead of
being sampled. Logits are shifted so each row's largest is 0 before the
temperature divides them, so a tiny temperature gives the argmax (ties share
the mass) and never NaN; every distribution returned keeps that largest entry,
so it sums to 1 with no division by zero. Ties in top-k and nucleus go to the
lower token id, as `argmax` does: `top_k=1` is greedy decoding exactly.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specrepl.engine.processor_specs import describe_processor

__all__ = [
    "PROCESSORS",
    "GreedyProcessor",
    "LogitsProcessor",
    "MultinomialProcessor",
    "NucleusProcessor",
    "TopKNucleusProcessor",
    "TopKProcessor",
    "UnusableLogitsError",
    "make_processor",
    "unread_usable_logits",
    "unusable_logits_error",
    "usable_logits",
]


class UnusableLogitsError(ValueError):
    """A model's logits have a row with no finite value: nothing can be sampled from it."""


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


def usable_logits(logits: torch.Tensor) -> torch.Tensor:
    """Float32 logits, non-finite values resolved, each row shifted so its largest is 0.

    NaN and -inf become -inf (impossible tokens). In a row with a +inf logit the
    +inf entries become 0 and every other entry -inf: they share the mass, as in
    the softmax's limit. A row with no finite logit (all NaN, or only NaN and
    infinities) raises UnusableLogitsError. The argument is not modified.
    """
    logits = logits.float()
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        if not bool(finite.any(dim=-1).all()):
            raise unusable_logits_error(logits)
        logits = logits.masked_fill(torch.isnan(logits), -math.inf)
        overflow = (logits == math.inf).any(dim=-1, keepdim=True)
        if bool(overflow.any()):
            winners = torch.where(logits == math.inf, 0.0, -math.inf)
            logits = torch.where(overflow, winners, logits)
    return logits - logits.amax(dim=-1, keepdim=True)


def unread_usable_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`usable_logits` for the usual logits, without reading anything back from
    their device: float32, each row shifted by its largest, and a one-element
    bool tensor on that device saying whether every row's largest was finite.
    Where it was, the rows are what `usable_logits` gives (a row whose largest
    is finite holds no NaN and no +inf); where not (NaN or an infinity: a
    half-precision overflow, rare), some rows are not, and the caller, after
    its read, takes `usable_logits` instead (which resolves or refuses them)."""
    logits = logits.float()
    largest = logits.amax(dim=-1, keepdim=True)
    return logits - largest, torch.isfinite(largest).all()


def unusable_logits_error(logits: torch.Tensor) -> UnusableLogitsError:
    """The error for logits with a row that has no finite value (said how many, and why)."""
    usable = torch.isfinite(logits).any(dim=-1)
    bad = int((~usable).sum())
    all_nan = bool(torch.isnan(logits)[~usable].all())
    return UnusableLogitsError(
        f"the model's logits are unusable: {bad} of {usable.numel()} positions"
        f" {'has' if bad == 1 else 'have'} no finite logit"
        f" ({'all NaN' if all_nan else 'only NaN or infinite values'});"
        " a half-precision model may have overflowed"
    )


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax of logits whose row maxima are 0 (so every row sums to at least 1 before
    normalising: never a division by zero, never NaN)."""
    return torch.softmax(logits, dim=-1)


def _point_masses(logits: torch.Tensor) -> torch.Tensor:
    """A one-hot row at each row's argmax (greedy decoding's law)."""
    top = torch.argmax(logits, dim=-1, keepdim=True)
    return torch.zeros_like(logits).scatter_(-1, top, 1.0)


def _scale(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`logits / temperature` for logits <= 0 with row maxima 0: the maxima stay 0 even when
    the temperature is so small that 0 / temperature would be NaN."""
    if temperature == 1.0:
        return logits
    return (logits / temperature).masked_fill(logits == 0, 0.0)


def _ranking(logits: torch.Tensor) -> torch.Tensor:
    """Token ids of each row from the most to the least likely, ties in id order."""
    return torch.sort(logits, dim=-1, descending=True, stable=True).indices


def _mask_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep exactly the k most likely tokens (ties: the lower ids, as argmax picks)."""
    if top_k >= logits.shape[-1]:
        return logits
    dropped = _ranking(logits)[..., top_k:]
    drop = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, dropped, True)
    return logits.masked_fill(drop, -math.inf)


def _mask_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p."""
    if top_p >= 1.0:
        return logits
    order = _ranking(logits)
    sorted_probs = _softmax(torch.gather(logits, -1, order))
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
        """New float32 logits from `usable_logits` output; must keep each row's 0 maximum
        and must not modify its argument."""

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution over the last dimension, float32, rows sum to 1.

        Raises UnusableLogitsError for a row with no finite logit (see `usable_logits`).
        """
        return _softmax(self._transform(usable_logits(logits)))

    def unread_probabilities(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`probabilities` without reading back from the device (`unread_usable_logits`):
        the distributions and whether they are all right (a one-element bool
        tensor; where not, the caller takes `probabilities` after its read)."""
        usable_rows, usable = unread_usable_logits(logits)
        return _softmax(self._transform(usable_rows)), usable

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token id per row of `probs` (shape `probs.shape[:-1]`)."""
        flat = probs.reshape(-1, probs.shape[-1])
        ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
        return ids.reshape(probs.shape[:-1])

    def parameters(self) -> dict[str, float | int]:
        return {}

    def describe(self) -> str:
        return describe_processor(self.name, self.parameters())

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
        return _point_masses(usable_logits(logits))

    def unread_probabilities(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        usable_rows, usable = unread_usable_logits(logits)
        return _point_masses(usable_rows), usable

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
        return _scale(logits, self.temperature)

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
        return _mask_top_k(_scale(logits, self.temperature), self.top_k)

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
        return _mask_top_p(_scale(logits, self.temperature), self.top_p)

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
        kept = _mask_top_k(_scale(logits, self.temperature), self.top_k)
        return _mask_top_p(kept, self.top_p)

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
"""The class of each name in `processor_specs.PROCESSOR_PARAMETERS`, in its order
(tests/test_processors.py checks that they agree)."""


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
