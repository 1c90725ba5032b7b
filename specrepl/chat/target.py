"""What runs a session's target: the `target_runtime` setting turned into a runnable model.

Both generators of a turn (speculative, and the target alone) run the target
in the same runtime, so every speedup divides by the target alone in the
runtime the speculative run verifies with. `ChatTarget` chooses it once per
setting value (`engine.target_choice`: measured, with the text checked on
the calibration prompts) and keeps it; where llama.cpp runs the target it
runs a GGUF file of the target's exact weights (`models.gguf_f32`: a float32
copy of a quantized file, written once). bench, the REPL and one-shot
answers all ask here.

This module knows nothing about the terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.target_choice import TargetChoice, choose_target_runtime
from specrepl.models.gguf_f32 import float32_gguf
from specrepl.models.prompting import prompt_ids

if TYPE_CHECKING:
    from specrepl.models.pair import ModelPair

__all__ = ["CALIBRATION_PROMPTS", "ChatTarget"]

CALIBRATION_PROMPTS = (
    "Name three colours of the rainbow.",
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a cat who likes the rain.",
)
"""Chat prompts whose greedy answers must be the same in both runtimes before
llama.cpp may run the target by itself choosing ("auto")."""


class ChatTarget:
    """The pair's target in the runtime a setting asks for (chosen once per value)."""

    def __init__(self, pair: ModelPair) -> None:
        self.pair = pair
        self._choices: dict[str, TargetChoice] = {}

    @classmethod
    def checked(cls, pair: ModelPair, settings: Settings) -> ChatTarget:
        """A `ChatTarget` whose runtime for `settings` is chosen now (SettingError
        saying why, where a forced runtime cannot run the target)."""
        target = cls(pair)
        target.check(settings)
        return target

    def choice(self, settings: Settings) -> TargetChoice:
        """What runs the target under `settings`; raises LlamaCppUnavailable when
        llama.cpp is forced and cannot run it."""
        requested = settings.target_runtime
        if requested not in self._choices:
            self._choices[requested] = self._choose(requested)
        return self._choices[requested]

    def runnable(self, settings: Settings) -> RunnableModel:
        return self.choice(settings).runnable

    def check(self, settings: Settings) -> None:
        """Raise SettingError (saying why) when `settings` force a runtime that
        cannot run the target here."""
        try:
            self.choice(settings)
        except LlamaCppUnavailable as error:
            raise SettingError(f"llama.cpp cannot run the target: {error}") from None

    def summary(self, settings: Settings) -> str | None:
        """What runs the target and why, once chosen (None before)."""
        choice = self._choices.get(settings.target_runtime)
        return None if choice is None else choice.describe()

    def _choose(self, requested: str) -> TargetChoice:
        target = self.pair.target
        gguf = None
        if requested != "torch" and target.gguf is not None:
            try:
                gguf = float32_gguf(target.gguf)
            except (OSError, ValueError, KeyError) as error:
                if requested == "llamacpp":
                    raise LlamaCppUnavailable(
                        f"no float32 GGUF file could be written from {target.gguf.name}: {error}"
                    ) from error
        calibration = [  # only `auto` compares the texts
            prompt_ids(self.pair.tokenizer, text, chat=True, system_prompt=None)
            for text in (CALIBRATION_PROMPTS if requested == "auto" else ())
        ]
        return choose_target_runtime(
            requested,
            target.model,
            target.tuning,
            gguf,
            context_length=self.pair.context_length,
            calibration=calibration,
            eos_token_ids=self.pair.eos_token_ids,
        )
