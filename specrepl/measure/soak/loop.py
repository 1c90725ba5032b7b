"""The soak: many prompts through one `ChatSession`, cycling over setting variants,
each answer checked against a fresh session's (see `soak`).

Two kinds of answers cannot be repeated token for token and are counted as
skipped instead of compared: sampling with the `auto` gamma policy (its
choice depends on measured timings, and the number of drafts changes how the
random stream is consumed), and sampling with n-gram counts kept from earlier
prompts (a fresh session has not seen those prompts). Greedy answers are
compared under any policy: greedy speculative decoding gives the target's
tokens whatever was drafted.

`SoakOptions` are the soak's own few fields; its settings are the session's,
from the config and flags as everywhere. This module never prints (it may be
given a drawer of answers) and knows nothing about how tokens are generated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from specrepl.chat.answers import Answer, EventCallback, Message
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.measure.soak.result import Mismatch, SoakResult, resident_bytes

__all__ = [
    "DEFAULT_PROMPTS",
    "VARIANTS",
    "AnswerDrawer",
    "SoakOptions",
    "repeatable",
    "soak",
    "usable_variants",
]

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

VARIED = (
    "gamma",
    "gamma_policy",
    "drafter_kind",
    "ngram_keep",
    "processor",
    "temperature",
    "top_k",
    "top_p",
    "use_cache",
    "chat",
    "speculative",
    "target_gen",
    "drafter_gen",
)
"""The settings every variant sets; the others keep the session's values."""


def _variant(**changes: Any) -> dict[str, Any]:
    """The `VARIED` settings: `changes` over the defaults of `Settings`, with a fixed gamma."""
    settings = Settings(gamma_policy="fixed").updated(**changes)
    return {name: getattr(settings, name) for name in VARIED}


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
class SoakOptions:
    """The soak's own fields; its settings are the session's (`Settings`)."""

    prompts: int = 200
    """Prompts to answer in the one session."""
    reset_every: int = 4
    """Clear the chat history every this many prompts; 0: never."""
    warmup: int | None = None
    """Prompts before the memory reference; None: two rounds of the variants the
    pair can run, at most half the prompts."""
    check: bool = True
    """Compare each answer with a fresh session's."""
    max_growth: int | None = None
    """Bytes the RSS may grow after the warm-up; more fails the soak (None: no limit)."""

    def __post_init__(self) -> None:
        if self.prompts < 1:
            raise ValueError(f"prompts must be >= 1, got {self.prompts}")
        if self.reset_every < 0:
            raise ValueError(f"reset_every must be >= 0, got {self.reset_every}")
        if self.warmup is not None and not 0 <= self.warmup <= self.prompts:
            raise ValueError(f"warmup must be between 0 and {self.prompts}, got {self.warmup}")


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
    options: SoakOptions,
    *,
    texts: Sequence[str] = DEFAULT_PROMPTS,
    variants: Sequence[Mapping[str, Any]] = VARIANTS,
    renderer: AnswerDrawer | None = None,
    on_prompt: Callable[[int, int], None] | None = None,
) -> SoakResult:
    """Answer `options.prompts` prompts in `session`, cycling over `texts` and `variants`.

    Before prompt i (from 0) the session gets variant i mod len(variants) and
    seed `session.settings.seed` (its value at the start) + i; every
    `options.reset_every` prompts the history is cleared (0: never). The
    warm-up prompts come before the memory reference. With `options.check`,
    each answer is compared with a fresh session's (see the module docstring).
    `renderer`, if given, streams and draws each live answer as the REPL does;
    `on_prompt(done, total)` is called after each prompt. Ctrl-C, also one that
    interrupts a generation, stops the soak: the result so far comes back with
    `interrupted` set. The session's settings are put back at the end.
    """
    if not texts:
        raise ValueError("texts is empty: give at least one prompt")
    cycle = usable_variants(session, variants)
    if not cycle:
        raise ValueError("none of the variants can run on this pair")
    warmup = options.warmup
    if warmup is None:
        warmup = min(2 * len(cycle), options.prompts // 2)
    original = session.settings
    result = SoakResult(warmup=warmup, rss_start=resident_bytes(), growth_limit=options.max_growth)
    started = time.perf_counter()
    try:
        for index in range(options.prompts):
            if options.reset_every and index and index % options.reset_every == 0:
                session.reset()
                result.resets += 1
            session.update(**cycle[index % len(cycle)], seed=original.seed + index)
            prompt = texts[index % len(texts)]
            _answer_and_check(session, index, prompt, options.check, renderer, result)
            result.rss_samples.append(resident_bytes())
            if on_prompt is not None:
                on_prompt(index + 1, options.prompts)
    except KeyboardInterrupt:
        result.interrupted = True
    finally:
        result.seconds = time.perf_counter() - started
        session.update(**original.as_dict())
    return result


def _answer_and_check(
    session: ChatSession,
    index: int,
    prompt: str,
    check: bool,
    renderer: AnswerDrawer | None,
    result: SoakResult,
) -> None:
    """Answer prompt `index` and, with `check`, compare the answer with a fresh
    session's where it must repeat; counted in `result`."""
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
