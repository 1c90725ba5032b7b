"""`python infer.py soak`: one long session, watched for memory growth and checked
for determinism.

`soak` runs many prompts through a single `ChatSession`, the way a long REPL
session would: it cycles over a list of prompts and over setting changes
(gamma and its policy, the drafter kind, the logits processor, the KV cache,
chat on and off, the drafter-only run), clears the history every few prompts,
and after each prompt

- samples the process's resident memory (RSS), and
- answers the same prompt again in a fresh `ChatSession` given the same
  settings, seed and history: every run must give the same tokens, both
  sessions must end with the same history, and a greedy speculative run must
  give the target's tokens.

Two kinds of answers cannot be repeated token for token and are counted as
skipped instead of compared: sampling with the `auto` gamma policy (its
choice depends on measured timings, and the number of drafts changes how the
random stream is consumed), and sampling with n-gram counts kept from earlier
prompts (a fresh session has not seen those prompts). Greedy answers are
compared under any policy: greedy speculative decoding gives the target's
tokens whatever was drafted.

This module never prints: `cli.py` loads the models and wires the subcommand,
`render.py` draws the result. It knows nothing about how tokens are generated.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from specrepl.chat.answers import Answer, EventCallback, Message
from specrepl.chat.flags import add_model_options, add_setting_options
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings

__all__ = [
    "DEFAULT_PROMPTS",
    "VARIANTS",
    "Mismatch",
    "SoakResult",
    "add_arguments",
    "repeatable",
    "resident_bytes",
    "soak",
    "usable_variants",
]

MIB = 2**20

#: Short prompts, cycled in order; each is answered many times under different settings.
DEFAULT_PROMPTS: tuple[str, ...] = (
    "Name three primary colours.",
    "Write one sentence about the sea.",
    "What is 17 times 3?",
    "List the days of the week, separated by commas.",
    "Repeat these words twice: alpha beta gamma delta.",
    "Explain in one sentence what a key-value cache is.",
    "Translate 'good morning, my friend' into French.",
    "Summarise: the cat slept on the mat because the mat was warm and the floor was cold.",
)

_BASE_VARIANT: dict[str, Any] = {
    "gamma": 4,
    "gamma_policy": "fixed",
    "drafter_kind": "model",
    "ngram_keep": False,
    "processor": "greedy",
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 0.9,
    "use_cache": True,
    "chat": True,
    "speculative": True,
    "target_gen": True,
    "drafter_gen": False,
}


def _variant(**changes: Any) -> dict[str, Any]:
    return {**_BASE_VARIANT, **changes}


#: The settings of each prompt, cycled in order (the seed changes with every
#: prompt too). Each variant sets the same keys, so a prompt's settings do not
#: depend on the variants before it, yet the session goes through every change.
VARIANTS: tuple[dict[str, Any], ...] = (
    _variant(gamma_policy="auto"),
    _variant(gamma=3, processor="topk", temperature=0.8, top_k=5),
    _variant(
        gamma=2, gamma_policy="heuristic", drafter_kind="ngram", ngram_keep=True, use_cache=False
    ),
    _variant(gamma=5, drafter_kind="lookup", processor="nucleus", chat=False),
    _variant(gamma_policy="confidence", use_cache=False, chat=False, drafter_gen=True),
    _variant(gamma=6, drafter_kind="ngram", processor="multinomial"),
    _variant(
        gamma=8,
        gamma_policy="auto",
        drafter_kind="ngram",
        ngram_keep=True,
        processor="topk",
        temperature=0.7,
        top_k=8,
    ),
    _variant(
        gamma=1, processor="topknucleus", temperature=1.2, top_k=10, top_p=0.8, use_cache=False
    ),
)


@dataclass(frozen=True)
class Mismatch:
    """A live answer that a fresh session did not repeat.

    `what` is the generator whose tokens differ, "runs" (different generators
    ran, or one refused), "history" (the sessions ended with different
    histories) or "lossless" (greedy speculative tokens differ from the
    target's).
    """

    prompt_index: int
    prompt: str
    what: str
    settings: dict[str, Any]
    expected: list[int]
    got: list[int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SoakResult:
    """What a soak saw: counts, memory samples and every mismatch.

    Memory figures are bytes. `rss_samples[i]` is the RSS after prompt i + 1;
    `rss_start` is before the first prompt. The growth figures are measured
    from the sample after the `warmup` first prompts, when the allocators have
    reached their working size.
    """

    prompts: int = 0
    compared: int = 0
    skipped: int = 0
    refusals: int = 0
    resets: int = 0
    warmup: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    rss_start: int = 0
    rss_samples: list[int] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def rss_after_warmup(self) -> int | None:
        if len(self.rss_samples) < max(self.warmup, 1):
            return None
        return self.rss_samples[self.warmup - 1] if self.warmup else self.rss_start

    @property
    def rss_end(self) -> int | None:
        return self.rss_samples[-1] if self.rss_samples else None

    @property
    def growth(self) -> int | None:
        """RSS at the end minus RSS after the warm-up (None if the warm-up did not end)."""
        start, end = self.rss_after_warmup, self.rss_end
        return None if start is None or end is None else end - start

    @property
    def max_growth(self) -> int | None:
        """The highest RSS after the warm-up, minus RSS after the warm-up."""
        start = self.rss_after_warmup
        if start is None:
            return None
        return max(self.rss_samples[self.warmup :], default=start) - start

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.interrupted

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompts": self.prompts,
            "compared": self.compared,
            "skipped": self.skipped,
            "refusals": self.refusals,
            "resets": self.resets,
            "warmup": self.warmup,
            "interrupted": self.interrupted,
            "seconds": self.seconds,
            "rss_start": self.rss_start,
            "rss_after_warmup": self.rss_after_warmup,
            "rss_end": self.rss_end,
            "growth": self.growth,
            "max_growth": self.max_growth,
            "rss_samples": self.rss_samples,
            "mismatches": [mismatch.to_dict() for mismatch in self.mismatches],
        }


def resident_bytes() -> int:
    """The process's resident set size now.

    Read from /proc/self/statm (Linux). Elsewhere the peak RSS from
    `getrusage` is the best the standard library offers: it can show growth
    but never a shrink. 0 where neither exists.
    """
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def repeatable(settings: Settings) -> bool:
    """Whether a fresh session must give the same tokens under these settings."""
    if settings.logits_processor().is_greedy:
        return True
    kept_counts = settings.drafter_kind == "ngram" and settings.ngram_keep
    return settings.gamma_policy != "auto" and not kept_counts


def usable_variants(
    session: ChatSession, variants: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The variants the session's pair can run: without a drafter model, those
    that need one (the model drafter, the drafter-only run) are left out."""
    if session.pair.drafter is not None:
        return [dict(variant) for variant in variants]
    return [
        dict(variant)
        for variant in variants
        if variant.get("drafter_kind") != "model" and not variant.get("drafter_gen")
    ]


def _tokens(answer: Answer) -> dict[str, list[int]]:
    return {name: list(run.result.token_ids) for name, run in answer.runs.items()}


def _differences(
    index: int,
    answer: Answer,
    history: list[Message],
    reference: Answer,
    reference_history: list[Message],
) -> list[Mismatch]:
    """How the live answer differs from the fresh session's answer."""
    settings = answer.settings.as_dict()

    def mismatch(what: str, expected: list[int], got: list[int]) -> Mismatch:
        return Mismatch(index, answer.prompt, what, settings, expected, got)

    found: list[Mismatch] = []
    live, fresh = _tokens(answer), _tokens(reference)
    if list(live) != list(fresh) or answer.refusal != reference.refusal:
        found.append(mismatch("runs", [], []))
    for name in live.keys() & fresh.keys():
        if live[name] != fresh[name]:
            found.append(mismatch(name, fresh[name], live[name]))
    if history != reference_history:
        found.append(mismatch("history", [], []))
    greedy = answer.settings.logits_processor().is_greedy
    both = {"speculative", "target"} <= live.keys()
    if greedy and both and live["speculative"] != live["target"]:
        found.append(mismatch("lossless", live["target"], live["speculative"]))
    return found


def _fresh_answer(
    session: ChatSession, history: list[Message], prompt: str
) -> tuple[Answer, list[Message]]:
    """`prompt` answered by a new session with the live session's settings and history."""
    fresh = ChatSession(session.pair, session.settings)
    fresh.history = [dict(message) for message in history]
    answer = fresh.answer(prompt)
    if answer.interrupted:  # Ctrl-C: the session catches it, the soak must stop
        raise KeyboardInterrupt
    return answer, fresh.history


class AnswerDrawer(Protocol):
    """What the soak needs to draw live answers as the REPL does (the REPL's
    `render.Renderer` is one); declared here so that soak imports no renderer."""

    def stream(self) -> AbstractContextManager[EventCallback]: ...

    def answer(self, answer: Answer, /) -> None: ...


def _draw(renderer: AnswerDrawer | None, session: ChatSession, prompt: str) -> Answer:
    if renderer is None:
        return session.answer(prompt)
    with renderer.stream() as on_event:
        answer = session.answer(prompt, on_event)
    renderer.answer(answer)
    return answer


def soak(
    session: ChatSession,
    prompts: int,
    *,
    texts: Sequence[str] = DEFAULT_PROMPTS,
    variants: Sequence[Mapping[str, Any]] = VARIANTS,
    reset_every: int = 4,
    warmup: int | None = None,
    check: bool = True,
    renderer: AnswerDrawer | None = None,
    on_prompt: Callable[[int, int], None] | None = None,
) -> SoakResult:
    """Answer `prompts` prompts in `session`, cycling over `texts` and `variants`.

    Before prompt i (from 0) the session gets variant i mod len(variants) and
    seed `session.settings.seed` (its value at the start) + i; every
    `reset_every` prompts the history is cleared (0: never). `warmup` prompts
    (default: two rounds of the variants, at most half the prompts) come before
    the memory reference. With `check`, each answer is compared with a fresh
    session's (see the module docstring). `renderer`, if given, streams and
    draws each live answer as the REPL does; `on_prompt(done, total)` is called
    after each prompt. Ctrl-C, also one that interrupts a generation, stops the
    soak: the result so far comes back with `interrupted` set. The session's
    settings are put back at the end.
    """
    if prompts < 1:
        raise ValueError(f"prompts must be >= 1, got {prompts}")
    if reset_every < 0:
        raise ValueError(f"reset_every must be >= 0, got {reset_every}")
    if not texts:
        raise ValueError("texts is empty: give at least one prompt")
    cycle = usable_variants(session, variants)
    if not cycle:
        raise ValueError("none of the variants can run on this pair")
    if warmup is None:
        warmup = min(2 * len(cycle), prompts // 2)
    if not 0 <= warmup <= prompts:
        raise ValueError(f"warmup must be between 0 and {prompts}, got {warmup}")
    original = session.settings
    result = SoakResult(warmup=warmup, rss_start=resident_bytes())
    started = time.perf_counter()
    try:
        for index in range(prompts):
            if reset_every and index and index % reset_every == 0:
                session.reset()
                result.resets += 1
            variant = cycle[index % len(cycle)]
            session.update(**variant, seed=original.seed + index)
            prompt = texts[index % len(texts)]
            history = list(session.history)
            answer = _draw(renderer, session, prompt)
            if answer.interrupted:
                raise KeyboardInterrupt
            if check and repeatable(session.settings):
                reference, reference_history = _fresh_answer(session, history, prompt)
                result.mismatches += _differences(
                    index, answer, session.history, reference, reference_history
                )
                result.compared += 1
            elif check:
                result.skipped += 1
            result.prompts += 1
            result.refusals += answer.refusal is not None
            result.rss_samples.append(resident_bytes())
            if on_prompt is not None:
                on_prompt(index + 1, prompts)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        result.seconds = time.perf_counter() - started
        session.update(**original.as_dict())
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py soak`: its own, and the model and setting flags
    every entry point takes (flags.py), which mean the same before or after `soak`."""
    parser.add_argument(
        "--prompts",
        dest="soak_prompts",
        type=int,
        metavar="N",
        default=200,
        help="prompts to answer in the one session (200)",
    )
    parser.add_argument(
        "--reset-every",
        type=int,
        metavar="K",
        default=4,
        help="clear the chat history every K prompts; 0: never (4)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="prompts before the memory reference (default: two rounds of the "
        f"{len(VARIANTS)} setting variants, at most half the prompts)",
    )
    parser.add_argument(
        "--max-growth-mib",
        type=float,
        metavar="X",
        help="fail (exit 1) when RSS grows by more than X MiB after the warm-up",
    )
    parser.add_argument(
        "--no-check",
        dest="soak_check",
        action="store_false",
        help="do not compare each answer with a fresh session's (half the time)",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure here")
    add_model_options(parser, after_subcommand=True)
    add_setting_options(parser, after_subcommand=True)
