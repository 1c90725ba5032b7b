"""Whether a hybrid drafts with a draft head or with the drafter model: timed on this machine.

A hybrid whose head is "auto" (`DrafterOptions.chooses_head`) keeps prompt
lookup in front and drafts elsewhere with the head trained for its target,
where that hybrid ran faster here than the one with the drafter model, and
with the model otherwise. Which wins depends on the machine, not on a rule: a
head drafts for a few hundredths of a target step but is right less often
than a copy of the target, whose draft costs about a fifth of a target step in
llama.cpp on a 2-core CPU and about 0.6 in torch there.

`choose_draft_source` times both. Each drafts, greedy, on the
`CALIBRATION_PROMPTS` (after an untimed run of each), the two alternating
which goes first; the one whose runs took less time in all is kept. The runs
give the same tokens, the target's greedy text, so their times compare
directly. Both verify with the runtime that runs the target (torch or
llama.cpp, whose features the head reads too). The verdict is stored
(`paths.draft_choices_file`) under the pair, the head's weights, what runs
the model and the target, the gamma policy and the machine:
only the first start on a machine pays for it, and it is timed again after
`MAX_CHOICE_AGE_DAYS`, once the store is cleared, or when asked (`retime`:
`/draft_source retime`).

The REPL's session (`drafting.ChatDrafters`) and `bench` both choose here, so
they draft alike. This module builds no drafter itself (its caller hands it a
builder) and knows nothing of the terminal or of commands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specrepl.chat.settings import Settings
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.generation import GenerationInterrupted, speculative_generate
from specrepl.engine.llamacpp import build_identity
from specrepl.engine.processors import make_processor
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.widths import cpu_identity
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import prompt_ids
from specrepl.store.json_file import read_json_object, write_json_object
from specrepl.store.paths import ends_digest

__all__ = [
    "CALIBRATION_PROMPTS",
    "CALIBRATION_TOKENS",
    "MAX_CHOICE_AGE_DAYS",
    "DraftChoice",
    "choice_key",
    "choose_draft_source",
]

CALIBRATION_PROMPTS = (
    "Explain in a few sentences why bread goes stale, and how to keep it fresh longer.",
    "Write a short Python function that counts the vowels in a string, with a docstring.",
    "Here is a note from a colleague:\n\nThe delivery of the new desks is moved from Monday"
    " to Thursday because the van broke down. The old desks stay until then, so please do"
    " not empty your drawers yet. The IT team will move the computers on Friday morning,"
    " and the meeting room stays closed until Friday noon.\n\nSummarize the note in two"
    " sentences.",
)
"""What both hybrids draft on: an explanation, code, and a short pasted text
(where prompt lookup drafts too). None of them is a dev or a Spec-Bench prompt."""

CALIBRATION_TOKENS = 48
"""New tokens per calibration prompt."""

MAX_CHOICE_AGE_DAYS = 30


@dataclass(frozen=True)
class DraftChoice:
    """Whether the head drafts (`head`), and what that was decided on."""

    head: bool
    head_path: str | None = None
    """The head's directory (when a head was found for the target)."""
    note: str = ""
    """Why there was nothing to time (no head for the target, no drafter model)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds of the timed runs in all, by source ("head", "model")."""
    tokens: int = 0
    """Tokens each source's timed runs generated."""
    stored: bool = False
    """Read from the store (timed at an earlier start), not timed now."""
    measured_at: float = 0.0

    @property
    def source(self) -> str:
        return "head" if self.head else "model"

    def describe(self) -> str:
        """Why this source drafts: `chosen over the draft head by timing: its hybrid
        ran the 3 calibration prompts in 0.69 of the head's time (timed now)`."""
        if self.note:
            return f"{'the draft head' if self.head else 'the drafter model'} drafts: {self.note}"
        other = "drafter model" if self.head else "draft head"
        mine, theirs = (
            self.seconds.get(self.source),
            self.seconds.get("model" if self.head else "head"),
        )
        if not mine or not theirs:
            return f"chosen over the {other}"
        when = "timed at an earlier start" if self.stored else "timed now"
        return (
            f"chosen over the {other} by timing: its hybrid ran the {len(CALIBRATION_PROMPTS)}"
            f" calibration prompts in {mine / theirs:.2f} of the {other.split()[-1]}'s time"
            f" ({when})"
        )

    def settle(self, settings: Settings) -> Settings:
        """`settings` (a hybrid's, head "auto") naming what drafts: the head's
        directory, or no head (the model)."""
        return settings.updated(drafter_head=self.head_path if self.head else None)

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "seconds": self.seconds,
            "tokens": self.tokens,
            "measured_at": self.measured_at,
        }


def choice_key(pair: ModelPair, settings: Settings, head_path: Path, runtime: str) -> str:
    """What a stored choice must match: both models as loaded, the head's weights,
    what runs the drafter model (`runtime`), the gamma policy and cache, the
    machine and torch, and llama.cpp's build where it runs a model. A split or
    offloaded target is another target here: its passes cost far more, which
    may change which source pays."""
    target, drafter = pair.target, pair.drafter
    models = [f"{target.name} {target.dtype} {target.quantization} {target.device}"]
    if target.offloaded:
        models[0] += f" placed: {target.describe_placement()}"
    if drafter is not None:
        models.append(f"{drafter.name} {drafter.dtype} {drafter.quantization}")
    weights = head_path / "head.safetensors"
    try:
        head = ends_digest(weights, 1 << 20)[:16]
    except OSError:
        head = "unreadable"
    parts = (
        *models,
        f"head={head}",
        f"runtime={runtime}",
        f"gamma={settings.gamma_policy}:{settings.gamma} cache={settings.use_cache}",
        _device_name(pair.device),
        f"threads={torch.get_num_threads()}",
        f"torch={torch.__version__}",
        *((build_identity(),) if "llama.cpp" in runtime else ()),
    )
    return " | ".join(parts)


def _device_name(device: torch.device) -> str:
    """The machine a choice was timed on: the GPU's name and the host CPU, or the CPU."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (host {cpu_identity()})"
    return f"{device.type} {cpu_identity()}"


def choose_draft_source(
    pair: ModelPair,
    settings: Settings,
    build: Callable[[bool], Drafter],
    key: str,
    *,
    store: Path | None = None,
    retime: bool = False,
    target: RunnableModel | None = None,
) -> DraftChoice:
    """Whether the hybrid drafts faster with its head than with the drafter model
    on this machine: `build(True)` gives the hybrid with the head, `build(False)`
    the one with the model. A choice stored under `key` (less than
    `MAX_CHOICE_AGE_DAYS` old) is taken unless `retime`; one timed now is
    stored. Both verify with `target` (default: the target in torch).
    Ctrl-C while timing raises KeyboardInterrupt and stores nothing."""
    saved = read_json_object(store) if store is not None else {}
    now = time.time()
    if not retime:
        stored = _stored_choice(saved.get(key), now)
        if stored is not None:
            return stored
    try:
        choice = _time_sources(pair, settings, build, target)
    except GenerationInterrupted:
        raise KeyboardInterrupt from None
    if store is not None:
        saved[key] = choice.as_json()
        write_json_object(store, saved)  # a read-only cache only costs timing again
    return choice


def _time_sources(
    pair: ModelPair,
    settings: Settings,
    build: Callable[[bool], Drafter],
    target: RunnableModel | None = None,
) -> DraftChoice:
    """Both hybrids on the calibration prompts, greedy, alternating which runs first."""
    common = {
        **pair.generation_options(use_cache=settings.use_cache),
        "logits_processor": make_processor("greedy"),
        "tuning": pair.target.tuning,
    }
    prompts = [
        prompt_ids(pair.tokenizer, text, chat=settings.chat, system_prompt=settings.system_prompt)
        for text in CALIBRATION_PROMPTS
    ]
    drafters = {source: build(source == "head") for source in ("head", "model")}
    verifier = pair.target.model if target is None else target

    def run(source: str, ids: list[int], tokens: int) -> tuple[float, list[int]]:
        drafter = drafters[source]
        drafter.forget()  # a llama.cpp drafter's state is shared with the other builds
        policy = settings.gamma_policy_object()
        start = time.perf_counter()
        result = speculative_generate(
            ids, drafter, verifier, gamma=policy, max_gen_len=tokens, **common
        )
        return time.perf_counter() - start, list(result.token_ids)

    for source in drafters:  # one-time costs (first calls, allocations) stay out of the timing
        run(source, prompts[0], settings.gamma + 2)
    seconds = {source: 0.0 for source in drafters}
    generated = 0
    for index, ids in enumerate(prompts):
        order = ("head", "model") if index % 2 == 0 else ("model", "head")
        outputs = {}
        for source in order:
            spent, outputs[source] = run(source, ids, CALIBRATION_TOKENS)
            seconds[source] += spent
        generated += len(outputs["head"])
    for drafter in drafters.values():
        drafter.forget()
    return DraftChoice(
        seconds["head"] < seconds["model"],
        seconds=seconds,
        tokens=generated,
        measured_at=time.time(),
    )


def _stored_choice(entry: Any, now: float) -> DraftChoice | None:
    """The choice a stored entry holds, if it is well formed and not too old."""
    try:
        source = entry["source"]
        seconds = {str(name): float(value) for name, value in entry["seconds"].items()}
        measured = float(entry["measured_at"])
        tokens = int(entry["tokens"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if source not in ("head", "model") or now - measured > MAX_CHOICE_AGE_DAYS * 86400:
        return None
    return DraftChoice(
        source == "head", seconds=seconds, tokens=tokens, stored=True, measured_at=measured
    )
