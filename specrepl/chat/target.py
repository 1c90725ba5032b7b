"""What runs a session's target: the `target_runtime` setting turned into a runnable model.

Both generators of a turn (speculative, and the target alone) run the target
in the same runtime, so every speedup divides by the target alone in the
runtime the speculative run verifies with. `ChatTarget` chooses it once per
setting value (`engine.target_choice`: measured, with the text checked on
the calibration prompts) and keeps it; where llama.cpp runs the target it
runs a GGUF file of the target's exact weights (`models.gguf_f32`: a float32
copy of a quantized file, written once). What "auto" measured is stored
(`paths.target_runtimes_file`) under the GGUF file, the machine, the thread
count and both runtimes' versions, so only the first start on a machine pays
for it; it is measured again after `MAX_VERDICT_AGE_DAYS` or once the store
is cleared. bench, the REPL and one-shot answers all ask here.

This module knows nothing about the terminal.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.llamacpp import LlamaCppUnavailable, build_identity
from specrepl.engine.near_ties import weigh_difference
from specrepl.engine.output_match import TieCheck
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.static_runtime import StaticRuntimeRefused
from specrepl.engine.target_choice import TargetChoice, Verdict, choose_target_runtime
from specrepl.engine.widths import machine_parts, processor_name
from specrepl.models.gguf_f32 import float32_gguf
from specrepl.models.prompting import prompt_ids
from specrepl.store.json_file import read_json_object, write_json_object
from specrepl.store.paths import fingerprint, target_runtimes_file

if TYPE_CHECKING:
    from specrepl.chat.answers import Answer
    from specrepl.models.pair import ModelPair

__all__ = ["CALIBRATION_PROMPTS", "MAX_VERDICT_AGE_DAYS", "ChatTarget", "verdict_key"]

MAX_VERDICT_AGE_DAYS = 30

CALIBRATION_PROMPTS = (
    "Name three colours of the rainbow.",
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a cat who likes the rain.",
)
"""Chat prompts whose greedy answers must be the same in both runtimes before
llama.cpp may run the target by itself choosing ("auto")."""


class ChatTarget:
    """The pair's target in the runtime the settings ask for (chosen once per value)."""

    def __init__(self, pair: ModelPair) -> None:
        self.pair = pair
        self._choices: dict[tuple[str, bool], TargetChoice] = {}

    @classmethod
    def checked(cls, pair: ModelPair, settings: Settings) -> ChatTarget:
        """A `ChatTarget` whose runtime for `settings` is chosen now (SettingError
        saying why, where a forced runtime cannot run the target)."""
        target = cls(pair)
        target.check(settings)
        return target

    def choice(self, settings: Settings) -> TargetChoice:
        """What runs the target under `settings`; raises LlamaCppUnavailable when
        llama.cpp is forced and cannot run it, StaticRuntimeRefused likewise."""
        key = _choice_key(settings)
        if key not in self._choices:
            self._choices[key] = self._choose(*key)
        return self._choices[key]

    def runnable(self, settings: Settings) -> RunnableModel:
        return self.choice(settings).runnable

    def check(self, settings: Settings) -> None:
        """Raise SettingError (saying why) when `settings` force a runtime that
        cannot run the target here."""
        try:
            self.choice(settings)
        except LlamaCppUnavailable as error:
            raise SettingError(f"llama.cpp cannot run the target: {error}") from None
        except StaticRuntimeRefused as error:
            raise SettingError(f"the static runtime cannot run the target: {error}") from None

    def weigh_difference(self, answer: Answer, ids: list[int]) -> TieCheck | None:
        """Where `answer`'s greedy speculative run parted from the target alone
        (after the prompt `ids`), the target asked whether that is a near-tie
        (`engine.near_ties`); None where there is nothing to weigh."""
        match = answer.output_match
        if match is None or not match.alarming:
            return None
        return weigh_difference(
            self.runnable(answer.settings),
            ids,
            answer.runs["target"].result.token_ids,
            answer.runs["speculative"].result.token_ids,
            self.pair.vocab_size,
        )

    def summary(self, settings: Settings) -> str | None:
        """What runs the target and why, once chosen (None before)."""
        choice = self._choices.get(_choice_key(settings))
        return None if choice is None else choice.describe()

    def _choose(self, requested: str, features: bool) -> TargetChoice:
        target = self.pair.target
        gguf = None
        if (
            requested not in ("torch", "static")
            and target.gguf is not None
            and not target.offloaded  # runs in torch only: no float32 file written for nothing
        ):
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
        on_gpu = target.device.type == "cuda"  # "auto" there weighs the static runtime
        store_key = requested == "auto" and (gguf is not None or on_gpu)
        key = verdict_key(self.pair, gguf) if store_key else None
        store = target_runtimes_file()
        saved = read_json_object(store) if key is not None else {}
        choice = choose_target_runtime(
            requested,
            target.model,
            target.tuning,
            gguf,
            context_length=self.pair.context_length,
            calibration=calibration,
            eos_token_ids=self.pair.eos_token_ids,
            earlier=_stored_verdict(saved.get(key), time.time()) if key is not None else None,
            features=features,
        )
        if key is not None and (choice.measured or choice.timed_reading):
            verdict, kept = choice.verdict(), saved.get(key) or {}
            measured_at = time.time() if choice.measured else kept["measured_at"]
            reading = {name: kept.get(name) for name in ("reads_wide_from", "reading")}
            if not features:  # a target whose drafter reads its features was not timed
                reading = {"reads_wide_from": verdict.reads_wide_from, "reading": verdict.reading}
            saved[key] = {
                "runtime": verdict.runtime,
                "reason": verdict.reason,
                "seconds": verdict.seconds,
                "measured_at": measured_at,  # the runtime's choice ages from its own timing
                **reading,
            }
            write_json_object(store, saved)  # a read-only cache only costs measuring again
        return choice


def _choice_key(settings: Settings) -> tuple[str, bool]:
    """What the choice depends on: the runtime asked for, and whether the
    drafter reads the target's features (a draft head, named)."""
    return settings.target_runtime, settings.drafter_options().needs_head


def verdict_key(pair: ModelPair, gguf: Path | None) -> str:
    """What a stored "auto" verdict must match: the target as loaded, its
    float32 GGUF file (if any), the machine (with its GPU where the target runs
    on one), the threads, the context and the runtimes' versions (llama.cpp's build)."""
    target = pair.target
    on_gpu = target.device.type == "cuda"
    parts = (
        f"{target.name} {target.dtype} {target.quantization} {target.device}",
        "no GGUF" if gguf is None else fingerprint(gguf)[:16],
        *((processor_name(target.device), f"context={pair.context_length}") if on_gpu else ()),
        *machine_parts(),
        build_identity(),
    )
    return " | ".join(parts)


def _stored_verdict(entry: Any, now: float) -> Verdict | None:
    """The verdict a stored entry holds, if it is well formed and not too old."""
    try:
        runtime, reason = str(entry["runtime"]), str(entry["reason"])
        seconds = {str(name): float(value) for name, value in entry["seconds"].items()}
        measured = float(entry["measured_at"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if runtime not in ("torch", "llamacpp", "static"):
        return None
    if now - measured > MAX_VERDICT_AGE_DAYS * 86400:
        return None
    wide, reading = entry.get("reads_wide_from"), entry.get("reading")
    if not (isinstance(reading, str) and (wide is None or isinstance(wide, int))):
        wide, reading = None, None  # kept before reading was timed, or damaged: timed again
    return Verdict(runtime, reason, seconds, wide, reading)
