"""Reading a clock on an accelerator: wait for the work queued on the device first.

CUDA and MPS run kernels asynchronously, so a timer read right after a model
call measures the launch, not the work. Every timing in specrepl (the
generation clock, the forward-width timings, bench's runs) synchronizes
through `synchronize`, so all of them treat every device the same way.
"""

from __future__ import annotations

import torch

__all__ = ["synchronize"]


def synchronize(device: torch.device) -> None:
    """Wait until the work queued on `device` is done; nothing to wait for on a CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
