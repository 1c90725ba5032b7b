"""A chat session: the loaded pair, the settings, the history, and one answer at a time.

`ChatSession.answer(prompt, on_event)` builds the prompt's token ids (the
tokenizer's chat template over the system prompt and the real multi-turn
history, or the raw text when chat is off; `prompting.py` encodes every text
as plain text, so a pasted control token cannot end or forge a turn), runs
every enabled generator in turn (speculative, then the target alone, then the
drafter alone) with the same seed, and returns an `Answer` with one `Run` per
generator and the speedup. While it runs it reports `RunStarted`, `RunStep`
and `RunFinished` events so that a front end can stream the output.

Bad input gets an answer with a `refusal` and changes nothing: an empty
prompt, one too long for a model's context, one that cannot be encoded as
plain text, and a run that fails (out of memory, or a model whose logits are
unusable) leave the history and the settings as they were.

What the session keeps of its drafting from turn to turn is `drafting.py`'s
(built by the one drafter builder, as `bench` builds it), the words of its
refusals `refusals.py`'s and the text it streams `streaming.py`'s.

This module is the glue between the engine and the REPL: it never prints,
never reads input and knows nothing about the terminal, rich or
prompt_toolkit. Settings are only changed through `Settings.updated`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from specrepl.chat.answers import (
    GENERATORS,
    Answer,
    Change,
    EventCallback,
    GeneratorName,
    Message,
    PromptMode,
    Run,
    RunFinished,
    RunStarted,
    RunStep,
)
from specrepl.chat.drafting import ChatDrafters
from specrepl.chat.refusals import (
    OUT_OF_MEMORY,
    RESET_HINT,
    RUN_FAILURES,
    history_dropped,
    prompt_too_long,
    run_failure,
)
from specrepl.chat.settings import SettingError, Settings
from specrepl.chat.streaming import TextStream, step_pieces
from specrepl.chat.target import ChatTarget
from specrepl.engine.devices import release_memory
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head_store import HeadLoadError
from specrepl.engine.drafters.runtime import RuntimeChoice
from specrepl.engine.forward import context_length
from specrepl.engine.generation import (
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
)
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import StepEvent
from specrepl.engine.widths import WidthPlan
from specrepl.models.prompting import (
    PromptEncodingError,
    clean_prompt,
    conversation,
    fit_history,
    has_chat_template,
    prompt_ids,
)
from specrepl.models.width_plans import ROLES, tune_pair_widths
from specrepl.store.paths import width_plans_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specrepl.models.pair import ModelPair

__all__ = ["ChatSession"]

CACHE_SETTINGS = ("use_cache", "chat", "system_prompt")
"""Settings whose change drops the caches kept between turns (a change of drafter
starts its own; see `ChatDrafters.drafter`)."""


class ChatSession:
    """The state of one REPL session; commands change it, prompts are answered by it."""

    def __init__(self, pair: ModelPair, settings: Settings | None = None) -> None:
        self.pair = pair
        self.history: list[Message] = []
        settings = settings or Settings()
        if pair.drafter is None:
            settings = settings.without_drafter_model()
        # kept from turn to turn (a chat does not re-read its history): each generator's
        # target (or drafter) cache, and (in `drafters`) the drafter with its own cache
        self._caches: dict[GeneratorName, PromptCache] = {
            name: PromptCache() for name in GENERATORS
        }
        self.target = ChatTarget(pair)
        self.drafters = ChatDrafters(pair, self._caches, self.target.runnable)
        self.drafters.check_head(settings)
        self.settings = settings

    # -- state -------------------------------------------------------------

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self.pair.tokenizer

    @property
    def has_chat_template(self) -> bool:
        return has_chat_template(self.tokenizer)

    def update(self, **changes: Any) -> list[Change]:
        """Apply validated setting changes; on error raise SettingError and change nothing."""
        updated = self.settings.updated(**changes)
        updated.check_drafter_model(self.pair.drafter is not None)
        try:
            self.drafters.check_head(updated)
        except HeadLoadError as error:
            raise SettingError(str(error)) from None
        self.target.check(updated)
        try:
            self.drafters.ready(updated)
        except SettingError:
            # loaded again for settings that are refused
            self.drafters.release_unneeded(self.settings)
            raise
        old = self.settings
        self.settings = updated
        if any(getattr(old, name) != getattr(updated, name) for name in CACHE_SETTINGS):
            self.drop_caches()
        self.drafters.release_unneeded(self.settings)
        if self.pair.drafter is not None and self.pair.drafter.tuning.plan is None:
            self.tune_widths(roles=("drafter",))  # left untimed at start-up
        return [Change(name, getattr(old, name), getattr(updated, name)) for name in changes]

    def reset(self) -> int:
        """Forget the chat history; returns how many turns (user + assistant) it had."""
        turns = len(self.history)
        self.history = []
        self.drafters.forget_counts()  # counts kept between prompts belong to the history
        self.drop_caches()
        return turns

    def drop_caches(self) -> None:
        """Forget the caches kept between turns: the next turn reads its whole prompt."""
        for cache in self._caches.values():
            cache.drop()
        self.drafters.forget_drafter()

    def kept_caches(self) -> dict[GeneratorName, int]:
        """How many tokens each generator's kept cache holds (0: none kept)."""
        return {name: cache.held for name, cache in self._caches.items()}

    def enabled_generators(self) -> list[GeneratorName]:
        return [name for name, setting in GENERATORS.items() if getattr(self.settings, setting)]

    # -- prompts -----------------------------------------------------------

    def prompt_mode(self) -> PromptMode:
        return "chat" if self.settings.chat and self.has_chat_template else "raw"

    def messages(self, prompt: str, history: list[Message] | None = None) -> list[Message]:
        """The conversation the chat template is applied to, ending with `prompt`
        (`history`: instead of the session's)."""
        earlier = self.history if history is None else history
        return conversation(prompt, self.settings.system_prompt, earlier)

    def prompt_ids(self, prompt: str, history: list[Message] | None = None) -> list[int]:
        """The token ids the generators continue (`history`: instead of the
        session's); every message's text is encoded as plain text (see
        `prompting.py`). Raises PromptEncodingError when that is impossible."""
        return prompt_ids(
            self.tokenizer,
            prompt,
            chat=self.settings.chat,
            system_prompt=self.settings.system_prompt,
            history=self.history if history is None else history,
        )

    # -- answering ---------------------------------------------------------

    def warm_up(
        self,
        prompt: str = "Hello",
        *,
        retime_widths: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """One short run of each model, so that one-time start-up costs (kernel selection,
        allocator growth) do not land in the first answer's timings (it changes neither the
        settings nor the history). On a CPU it also times the models' forward widths
        (`tune_widths`) once per model and machine, kept under the cache directory, so that
        steps are padded to cheaper widths (`retime_widths`: measured again now). What runs
        the target is chosen here (`ChatTarget`: "auto" measured once per machine, then
        stored), then a hybrid's head "auto" is settled (`ChatDrafters.choice`: likewise);
        `progress` is told when each starts."""
        settings = self.settings
        if self.pair.device.type == "cpu":
            self.tune_widths(retime=retime_widths)
        if progress is not None and self.target.summary(settings) is None:
            progress("choosing what runs the target…")
        target = self.target.runnable(settings)
        if settings.speculative and settings.drafter_options().chooses_head:
            if progress is not None:
                progress("choosing between the draft head and the drafter model…")
            self.drafters.choice(settings)
        ids = self.prompt_ids(prompt)
        common = self.pair.generation_options(use_cache=settings.use_cache)
        [target.open() for _ in ("speculative", "target")]  # llama.cpp: a context each, now
        autoregressive_generate(ids, target, max_gen_len=2, **common)
        drafter = self.pair.drafter
        if drafter is not None and (drafter.resident or self.drafters.needs_torch_model(settings)):
            autoregressive_generate(
                ids, drafter.model, max_gen_len=2, tuning=drafter.tuning, **common
            )
        if settings.speculative and settings.drafter_kind != "ngram":  # n-gram counts may be kept
            speculative_generate(
                ids,
                self._drafter(settings),
                target,
                gamma=settings.gamma,
                max_gen_len=settings.gamma + 2,
                **common,
            )
        self.drop_caches()  # the warm-up's prompt is no turn of the chat
        self.drafters.release_unneeded(self.settings)  # the warm-up chose the runtime

    def answer(self, prompt: str, on_event: EventCallback | None = None) -> Answer:
        """Run every enabled generator on `prompt`; never raises for a bad prompt.

        The prompt is cleaned first (`prompting.clean_prompt`): terminal escape
        sequences and control characters other than newline and tab are dropped,
        carriage returns become newlines, and a notice says what was removed;
        `Answer.prompt` and the history hold the cleaned text. Unicode is kept
        as typed.

        Refused, with nothing run and nothing changed: an empty prompt, one
        with more tokens than a model's context (the refusal names both
        numbers), and one holding a control token the tokenizer cannot write
        as text. A run that fails (out of memory, or a model whose logits are
        unusable) abandons the whole answer: its runs are dropped, memory is
        freed, the refusal says what happened, and the history stays as it was.

        Ctrl-C during a run stops it: the partial run is kept (marked
        interrupted), the remaining generators are skipped and the history is
        left as it was.
        """
        settings = self.settings
        answer = self._new_answer(prompt, settings)
        generators = self.enabled_generators()
        ids = self._encode(answer, generators)
        if ids is None:
            return answer
        hint = RESET_HINT if self._has_history(answer) else ""
        ids = self._fit(answer, ids, generators, hint)
        if ids is None:
            return answer
        self._run_generators(answer, ids, generators, hint, on_event)
        answer.tie = self.target.weigh_difference(answer, ids)
        self._remember_turn(answer)
        return answer

    def _new_answer(self, prompt: str, settings: Settings) -> Answer:
        """An answer to the cleaned `prompt`, yet without runs, with a notice of
        what the cleaning removed and of a chat the tokenizer cannot template."""
        cleaned = clean_prompt(prompt)
        answer = Answer(prompt=cleaned.text, mode=self.prompt_mode(), settings=settings)
        if settings.chat and answer.mode == "raw":
            answer.notices.append("the tokenizer has no chat template: raw continuation")
        if cleaned.changed:
            answer.notices.append(cleaned.describe())
        return answer

    def _encode(self, answer: Answer, generators: list[GeneratorName]) -> list[int] | None:
        """The answer's prompt as token ids; None, with the answer refused, for an
        empty prompt, every generator off, or a prompt not encodable as plain text."""
        if not answer.prompt.strip():
            answer.refusal = "Nothing to answer: the prompt is empty."
            return None
        if not generators:
            answer.refusal = (
                "Every generator is off: turn one on with /speculative, /target or /drafter."
            )
            return None
        try:
            ids = self.prompt_ids(answer.prompt)
        except PromptEncodingError as error:
            answer.refusal = f"The prompt cannot be encoded as plain text: {error}."
            return None
        answer.prompt_tokens = len(ids)
        if not ids:
            answer.refusal = "Nothing to answer: the prompt has no tokens."
            return None
        return ids

    def _has_history(self, answer: Answer) -> bool:
        return answer.mode == "chat" and bool(self.history)

    def _fit(
        self, answer: Answer, ids: list[int], generators: list[GeneratorName], hint: str
    ) -> list[int] | None:
        """The prompt ids every generator's context has room for: a chat drops its
        oldest turns when it must (`_fit_history`, said in a notice); None, with
        the answer refused, when the prompt is too long even without them."""
        fitted, history, notice = ids, self.history, None
        if self._has_history(answer):
            fitted, history, notice = self._fit_history(
                answer.prompt, ids, generators, answer.settings
            )
        if self._too_long(fitted, generators, hint) is not None:
            # too long even without the history: the refusal names the prompt as sent
            answer.refusal = self._too_long(ids, generators, hint)
            return None
        if notice is not None:
            self.history, ids = history, fitted
            answer.notices.append(notice)
            answer.prompt_tokens = len(ids)
        return ids

    def _run_generators(
        self,
        answer: Answer,
        ids: list[int],
        generators: list[GeneratorName],
        hint: str,
        on_event: EventCallback | None,
    ) -> None:
        """Run each generator in turn into `answer.runs` (with the answer's
        settings), until one is interrupted. A run that fails abandons the whole
        answer: its runs are dropped, memory is freed after running out, and the
        refusal says what happened."""
        for generator in generators:
            out_of_memory = False
            try:
                run = self._run(generator, ids, answer.settings, on_event)
            except RUN_FAILURES as error:
                answer.refusal = run_failure(generator, error, hint)
                out_of_memory = isinstance(error, OUT_OF_MEMORY)
            if answer.refusal is not None:
                answer.runs.clear()
                if out_of_memory:  # the failed run's tensors are unreachable only now
                    release_memory()
                return
            answer.runs[generator] = run
            if generator == "speculative":  # its first run chooses the drafter's runtime
                self.drafters.release_unneeded(self.settings)
            if run.interrupted:
                break

    def _remember_turn(self, answer: Answer) -> None:
        """A chat's answer joins the history with its prompt, unless it was
        refused or interrupted."""
        reply = answer.reply
        if answer.mode == "chat" and reply is not None and not answer.interrupted:
            self.history.extend(
                [
                    {"role": "user", "content": answer.prompt},
                    {"role": "assistant", "content": reply.text},
                ]
            )

    def _context_of(self, generator: GeneratorName) -> tuple[str, int | None]:
        """The role of the model a generator runs (target or drafter) and its context."""
        if generator == "drafter":
            return "drafter", context_length(self.drafters.model())
        return "target", context_length(self.pair.target.model)

    def _fit_history(
        self, prompt: str, ids: list[int], generators: list[GeneratorName], settings: Settings
    ) -> tuple[list[int], list[Message], str | None]:
        """A chat too long to leave `max_new_tokens` of room in the context drops its
        oldest turns (user and assistant together) until it fits; returns the prompt
        ids, the history and a notice (None when nothing was dropped)."""
        contexts = [self._context_of(generator)[1] for generator in generators]
        context = min((c for c in contexts if c is not None), default=None)
        ids, history, dropped = fit_history(
            ids,
            self.history,
            lambda kept: self.prompt_ids(prompt, kept),
            room=settings.max_new_tokens,
            context=context,
        )
        if not dropped:
            return ids, self.history, None
        notice = history_dropped(settings.max_new_tokens, context, dropped, len(ids))
        return ids, history, notice

    def _too_long(self, ids: list[int], generators: list[GeneratorName], hint: str) -> str | None:
        """The refusal for a prompt that leaves a generator's model no room, else None."""
        for generator in generators:
            role, context = self._context_of(generator)
            if context is not None and len(ids) >= context:
                return prompt_too_long(len(ids), role, context, hint)
        return None

    def _run(
        self,
        generator: GeneratorName,
        ids: list[int],
        settings: Settings,
        on_event: EventCallback | None,
    ) -> Run:
        emit = on_event or (lambda event: None)
        stream = TextStream(self.tokenizer)

        def on_step(step: StepEvent) -> None:
            pieces = step_pieces(self.tokenizer, step) if settings.debug else None
            emit(RunStep(generator, step, stream.push(step.appended), pieces))

        emit(RunStarted(generator, len(ids), settings))
        common = {
            **self.pair.generation_options(use_cache=settings.use_cache, seed=settings.seed),
            "logits_processor": settings.logits_processor(),
            "max_gen_len": settings.max_new_tokens,
            "on_step": on_step,
            "prompt_cache": self._caches[generator] if settings.use_cache else None,
        }
        try:
            if generator == "speculative":
                drafter = self._drafter(settings)
                target = self.target.runnable(settings)
                policy = self.drafters.policy(settings, drafter)
                result = speculative_generate(ids, drafter, target, gamma=policy, **common)
            elif generator == "target":
                result = autoregressive_generate(ids, self.target.runnable(settings), **common)
            else:  # the drafter alone
                loaded = self.pair.drafter
                model, tuning = self.drafters.model(), None if loaded is None else loaded.tuning
                result = autoregressive_generate(ids, model, tuning=tuning, **common)
        except GenerationInterrupted as interrupted:
            result = interrupted.result
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        run = Run(generator, replace(result, text=text), text)
        emit(RunFinished(generator, run))
        return run

    def _drafter(self, settings: Settings) -> Drafter:
        """The drafter the settings ask for (`ChatDrafters.drafter`)."""
        return self.drafters.drafter(settings, self.target.runnable(settings))

    def drafter_runtime(self, settings: Settings | None = None) -> RuntimeChoice | None:
        """What runs the drafter model under `settings` (`ChatDrafters.runtime`)."""
        return self.drafters.runtime(settings or self.settings)

    def runtime_summary(self) -> str | None:
        """What runs the drafter model and why, once chosen (None before the
        first speculative run, or when no model drafts)."""
        return self.drafters.runtime_summary(self.settings)

    def choose_draft_source(self, *, retime: bool = False) -> str:
        """A hybrid with head "auto": choose (`retime`: time again now) whether the
        head or the model drafts (`ChatDrafters.choice`); returns which and why."""
        choice = self.drafters.choice(self.settings, retime=retime)
        self.drafters.release_unneeded(self.settings)
        name = "the draft head" if choice.head else "the drafter model"
        return f"{name}: {choice.note}" if choice.note else f"{name}, {choice.describe()}"

    def head(self, settings: Settings | None = None) -> tuple[DraftHead, dict[str, Any]] | None:
        """The settings' draft head and its description, loaded once per directory."""
        return self.drafters.head(settings or self.settings)

    def tune_widths(
        self, *, retime: bool = False, roles: Sequence[str] = ROLES
    ) -> dict[str, WidthPlan]:
        """Time the models' forward widths (CPU only; stored plans are reused unless
        `retime`) into the models' tunings; returns them by role ({} off a CPU).
        The drafter is timed only while the settings run its torch model
        (`ChatDrafters.runs_torch_model`, its runtime chosen first), not where
        llama.cpp drafts; `update` times it when a later setting runs it."""
        if self.pair.device.type != "cpu":
            return {}
        if not self.drafters.runs_torch_model(self.settings):
            roles = [role for role in roles if role != "drafter"]
        gamma, store = max(self.settings.gamma, 8), width_plans_file()
        plans = tune_pair_widths(self.pair, gamma, store=store, retime=retime, roles=roles)
        self.drafters.release_unneeded(self.settings)  # loaded again to be timed
        return plans

    def width_plans(self) -> dict[str, WidthPlan | None]:
        """The width plan each model runs with, by role (None: not padded)."""
        plans: dict[str, WidthPlan | None] = {"target": self.pair.target.tuning.plan}
        drafter = self.pair.drafter
        if drafter is not None and drafter.held is not self.pair.target.model:
            plans["drafter"] = drafter.tuning.plan  # a released drafter's is kept
        return plans

    def head_summary(self) -> dict[str, Any] | None:
        """The draft head the settings name (its description and "path"), if one is loaded."""
        return self.drafters.head_summary(self.settings)
