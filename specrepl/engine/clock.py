"""The decoding loop's clock: seconds spent generating, read without waiting on a GPU.

A step's figures (drafting, the target's pass, the whole step) are spans
between stamps the loop takes. On a CPU a stamp is the host's clock. On a
CUDA GPU the host runs ahead of the device, so the host's clock alone would
time the launching of kernels, not their work, and waiting for the device at
every stamp would add a wait to the step for each: there a stamp also
records a CUDA event on each GPU's current stream, and a span is the time
between two events as the device measured it (the longest over the GPUs a
model is split across). Only the step's last stamp is waited for (`pause`),
and it comes after the step's one read of the verification, behind no model
pass. An MPS device has no such events: it is synchronized at each stamp.

`active` adds up the spans between `resume` and `pause`, so the consumer's
time between steps (printing, a REPL's rendering) is left out.

This module knows nothing about models, drafting or verification.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specrepl.engine.devices import synchronize

__all__ = ["Clock", "Stamp"]


@dataclass(frozen=True)
class Stamp:
    """A moment of the loop: the host's clock and, per CUDA device, an event."""

    host: float
    events: tuple[torch.cuda.Event, ...] = ()


class Clock:
    """Seconds spent inside the generator (see the module docstring)."""

    def __init__(self, devices: torch.device | Sequence[torch.device]) -> None:
        self.devices = (devices,) if isinstance(devices, torch.device) else tuple(devices)
        self._cuda = tuple(device for device in self.devices if device.type == "cuda")
        self._waited = tuple(device for device in self.devices if device.type == "mps")
        self.active = 0.0
        self.resumed = self.now()

    def now(self) -> Stamp:
        """A stamp, waiting for no CUDA device."""
        for device in self._waited:
            synchronize(device)
        events = []
        for device in self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        return Stamp(time.perf_counter(), tuple(events))

    def seconds(self, start: Stamp, end: Stamp) -> float:
        """Seconds from `start` to `end`; `end` must have been waited for (`pause`)."""
        if not end.events:
            return end.host - start.host
        spans = [a.elapsed_time(b) / 1000 for a, b in zip(start.events, end.events, strict=True)]
        return max(spans)

    def resume(self) -> Stamp:
        self.resumed = self.now()
        return self.resumed

    def pause(self) -> Stamp:
        """A stamp that ends a span of activity, waited for (its events done),
        so that every span up to it can be read."""
        stamp = self.now()
        for event in stamp.events:
            event.synchronize()
        self.active += self.seconds(self.resumed, stamp)
        return stamp
