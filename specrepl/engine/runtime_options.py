"""The names of the target's runtimes, as plain data (read before torch loads).

"auto" lets `target_choice.choose_target_runtime` measure; "torch" and
"llamacpp" force either; "static" runs the target in torch over a static
cache, compiled on a GPU (`static_runtime`). This module imports nothing.
"""

from __future__ import annotations

__all__ = ["TARGET_RUNTIMES"]

TARGET_RUNTIMES = ("auto", "torch", "llamacpp", "static")
