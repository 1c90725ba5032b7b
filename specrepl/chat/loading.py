"""The one front door that turns an application config into a loaded model pair.

Every entry point (the REPL, `--prompt`, `bench`, `soak`, `replay`, `distill`)
loads its models through `load_config_pair`, so a config and its flags load
the same pair wherever they are given.

This module imports no model library when it is imported: torch and
transformers load when a pair is asked for (the REPL draws its prompt while
they load). It knows nothing about the terminal: progress goes through a
callback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from specrepl.engine.signals import signals_held

if TYPE_CHECKING:
    from specrepl.chat.config import AppConfig
    from specrepl.models.pair import ModelPair

__all__ = ["load_config_pair"]


def load_config_pair(
    config: AppConfig, progress: Callable[[str], None], *, with_drafter: bool = True
) -> ModelPair:
    """The config's target and drafter (the target alone when `with_drafter`
    is False) on the config's device, loaded as every entry point loads them;
    `progress` is told each stage. Raises ModelLoadError or
    IncompatibleTokenizersError."""
    with signals_held():  # a signal inside torch's initialisation would abort the process
        from specrepl.models.loading import load_pair

    return load_pair(
        config.target,
        config.drafter if with_drafter else None,
        device=config.device,
        trust_remote_code=config.trust_remote_code,
        progress=progress,
    )
