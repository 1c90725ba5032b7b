"""The logits processors users can name, the parameters each takes, and how
a processor is written in a summary line.

Declared here, without torch, so that settings, commands and the REPL's first
screen can list and describe processors before torch is imported.
`processors.py` implements one class per name and checks, when it is
imported, that each class takes exactly the parameters named here.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PROCESSOR_NAMES", "PROCESSOR_PARAMETERS", "describe_processor"]

PROCESSOR_PARAMETERS: dict[str, tuple[str, ...]] = {
    "greedy": (),
    "multinomial": ("temperature",),
    "topk": ("temperature", "top_k"),
    "nucleus": ("temperature", "top_p"),
    "topknucleus": ("temperature", "top_k", "top_p"),
}
"""Each processor's parameters, in the order they are given positionally."""

PROCESSOR_NAMES: tuple[str, ...] = tuple(PROCESSOR_PARAMETERS)


def describe_processor(name: str, parameters: Mapping[str, object]) -> str:
    """`topk(temperature=0.7, top_k=40)`; a processor without parameters is its name."""
    shown = ", ".join(f"{key}={parameters[key]}" for key in PROCESSOR_PARAMETERS[name])
    return f"{name}({shown})" if shown else name
