"""A model's runtime kept from one generation to the next, so a chat does not re-read its history.

A `PromptCache` holds a `ModelRuntime` (`runtime.py`: a transformers cache, a
llama.cpp context) and the token ids whose keys and values it holds. The next
generation compares its prompt with those ids token by token, rolls the
runtime back to the longest common prefix (never the prompt's last token,
which must be fed for its logits) and feeds only the rest. Comparing ids
rather than turns means that a chat template which renders an earlier turn
differently the next time costs a longer feed, never a wrong answer.

The runtime is taken out while a generation uses it and put back only when
the generation ends normally: a run that is interrupted or fails leaves the
`PromptCache` empty, because its runtime may hold a half-written step. `keep`
costs nothing (the ids are read at the next `take`), so a drafter may call it
after every step.

This module knows nothing about drafting or chat templates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.runtime import ModelRuntime, RunnableModel, as_runnable
from specrepl.engine.tuning import Tuning

__all__ = ["PromptCache", "common_prefix"]


def common_prefix(held: Sequence[int] | torch.Tensor, inputs: Sequence[int]) -> int:
    """How many leading tokens `held` and `inputs` share."""
    held_ids = held.tolist() if isinstance(held, torch.Tensor) else list(held)
    length = min(len(held_ids), len(inputs))
    for index in range(length):
        if held_ids[index] != inputs[index]:
            return index
    return length


class PromptCache:
    """One model's runtime between generations (see the module docstring).

    Pass the same object to every `speculative_generate` or
    `autoregressive_generate` call of a conversation (`prompt_cache=`); one
    object per generator and model, since each holds one model's runtime.
    """

    def __init__(self) -> None:
        self._runtime: ModelRuntime | None = None
        self._ids: torch.Tensor | None = None

    @property
    def held(self) -> int:
        """How many tokens the kept runtime holds (0 when nothing is kept)."""
        return 0 if self._ids is None else int(self._ids.shape[0])

    def reusable(self, model: RunnableModel | PreTrainedModel | Any, inputs: Sequence[int]) -> int:
        """How many tokens of `inputs` the kept runtime would spare `model` from feeding."""
        if self._runtime is None or self._ids is None or not self._runtime.model.runs(model):
            return 0
        return min(common_prefix(self._ids, inputs), max(len(inputs) - 1, 0))

    def take(
        self,
        model: RunnableModel | PreTrainedModel,
        inputs: Sequence[int],
        at_most: int | None = None,
        *,
        tuning: Tuning | None = None,
    ) -> tuple[ModelRuntime, int]:
        """The runtime to continue `inputs` with and how many of their tokens it
        holds (at most `at_most`); a new one (a transformers model runs with
        `tuning`) when nothing kept serves. The `PromptCache` is empty until
        `keep` is called."""
        reused = self.reusable(model, inputs)
        if at_most is not None:
            reused = min(reused, max(at_most, 0))
        runtime = self._runtime
        if reused <= 0 or runtime is None:
            runtime = as_runnable(model, tuning).open()
        runtime.rollback_to(reused)
        self.drop()
        return runtime, reused

    def keep(self, runtime: ModelRuntime, sequence: torch.Tensor) -> None:
        """Keep `runtime`, which holds the first tokens of `sequence` (1-D ids),
        for next time. It is kept holding every token of `sequence` but the
        last at most, as a run of the target alone leaves it (a verification
        that kept drafts up to an end token holds them all): so the next turn
        feeds the same tokens after the same held ones in every run of a chat,
        and a prompt pass that reads them another way than a step does
        (`llamacpp_reading`) reads them alike in each."""
        runtime.rollback_to(min(runtime.length, sequence.shape[0] - 1))
        self._runtime = runtime
        self._ids = sequence[: runtime.length]

    def drop(self) -> None:
        """Forget the kept runtime (its memory is freed once no run holds it)."""
        self._runtime, self._ids = None, None
