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

This module is the glue between the engine and the REPL: it never prints,
never reads input and knows nothing about the terminal, rich or
prompt_toolkit. Settings are only changed through `Settings.updated`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

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
    StepPieces,
)
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.devices import release_memory
from specrepl.engine.drafters.draft_head import (
    DraftHead,
    HeadLoadError,
    fastest_dtype,
    load_head,
    resolve_head,
)
from specrepl.engine.drafters.kinds import Drafter, NgramDrafter, build_drafter
from specrepl.engine.drafters.llamacpp import RuntimeChoice, choose_drafter_runtime
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.forward import context_length
from specrepl.engine.gamma import GammaPolicy
from specrepl.engine.generation import (
    ContextTooLongError,
    GenerationInterrupted,
    autoregressive_generate,
    speculative_generate,
)
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.processors import UnusableLogitsError
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import StepEvent
from specrepl.engine.widths import WidthPlan, tune_pair_widths, width_plan
from specrepl.models.pair import ModelLoadError
from specrepl.models.prompting import (
    PromptEncodingError,
    clean_prompt,
    conversation,
    fit_history,
    has_chat_template,
    prompt_ids,
)
from specrepl.store.paths import width_plans_file

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specrepl.models.pair import ModelPair

__all__ = ["ChatSession"]

#: Raised by torch when a device runs out of memory (`torch.OutOfMemoryError` in recent
#: releases is this class; older ones only have it under `torch.cuda`).
_OutOfMemoryError = torch.cuda.OutOfMemoryError

CACHE_SETTINGS = ("use_cache", "chat", "system_prompt")
"""Settings whose change drops the caches kept between turns (a change of drafter
starts its own; see `ChatSession._drafter`)."""


class _TextStream:
    """Turns a growing list of token ids into text deltas.

    Decodes from a window start that moves past each completed line, holds
    back text that ends in an incomplete character, and never re-emits text.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0
        self.emitted = 0

    def push(self, ids: tuple[int, ...]) -> str:
        self.ids.extend(ids)
        window = self.tokenizer.decode(self.ids[self.start :], skip_special_tokens=True)
        if window.endswith("\ufffd"):
            return ""
        delta = window[self.emitted :]
        if window.endswith("\n"):
            self.start, self.emitted = len(self.ids), 0
        else:
            self.emitted = len(window)
        return delta


class ChatSession:
    """The state of one REPL session; commands change it, prompts are answered by it."""

    def __init__(self, pair: ModelPair, settings: Settings | None = None) -> None:
        self.pair = pair
        self.history: list[Message] = []
        settings = settings or Settings()
        if pair.drafter is None:
            settings = settings.without_drafter_model()
        self._heads: dict[str, tuple[DraftHead, dict[str, Any]]] = {}
        self._runtimes: dict[str, RuntimeChoice | None] = {}
        self._check_head(settings)
        self.settings = settings
        self._ngram: NgramDrafter | None = None
        # kept from turn to turn (a chat does not re-read its history): each generator's
        # target (or drafter) cache, and the drafter with its own cache
        self._caches: dict[GeneratorName, PromptCache] = {
            name: PromptCache() for name in GENERATORS
        }
        self._kept_drafter: tuple[tuple[Any, ...], Drafter] | None = None
        self._kept_policy: tuple[tuple[Any, ...], GammaPolicy] | None = None

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
            self._check_head(updated)
        except HeadLoadError as error:
            raise SettingError(str(error)) from None
        try:
            self._ready_drafter(updated)
        except SettingError:
            self._release_unneeded_drafter()  # loaded again for settings that are refused
            raise
        old = self.settings
        self.settings = updated
        if any(getattr(old, name) != getattr(updated, name) for name in CACHE_SETTINGS):
            self.drop_caches()
        self._release_unneeded_drafter()
        return [Change(name, getattr(old, name), getattr(updated, name)) for name in changes]

    def reset(self) -> int:
        """Forget the chat history; returns how many turns (user + assistant) it had."""
        turns = len(self.history)
        self.history = []
        self._ngram = None  # counts kept between prompts belong to the history
        self.drop_caches()
        return turns

    def drop_caches(self) -> None:
        """Forget the caches kept between turns: the next turn reads its whole prompt."""
        for cache in self._caches.values():
            cache.drop()
        self._kept_drafter = None

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

    def warm_up(self, prompt: str = "Hello", *, retime_widths: bool = False) -> None:
        """One short run of each model, so that one-time start-up costs (kernel
        selection, allocator growth) do not land in the first answer's timings.
        Changes neither the settings nor the history.

        On a CPU it also times each model's forward widths (`widths.py`) once
        per model and machine, kept under the cache directory, so that steps
        are padded to cheaper widths (`retime_widths`: measured again now)."""
        settings = self.settings
        if self.pair.device.type == "cpu":
            self.tune_widths(retime=retime_widths)
        ids = self.prompt_ids(prompt)
        common = self.pair.generation_options(use_cache=settings.use_cache)
        autoregressive_generate(ids, self.pair.target.model, max_gen_len=2, **common)
        drafter = self.pair.drafter
        if drafter is not None and (drafter.resident or self._needs_torch_drafter(settings)):
            autoregressive_generate(ids, drafter.model, max_gen_len=2, **common)
        if settings.speculative and settings.drafter_kind != "ngram":  # n-gram counts may be kept
            speculative_generate(
                ids,
                self._drafter(settings),
                self.pair.target.model,
                gamma=settings.gamma,
                max_gen_len=settings.gamma + 2,
                **common,
            )
        self.drop_caches()  # the warm-up's prompt is no turn of the chat
        self._release_unneeded_drafter()  # the speculative warm-up chose the runtime

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
        cleaned = clean_prompt(prompt)
        prompt = cleaned.text
        answer = Answer(prompt=prompt, mode=self.prompt_mode(), settings=settings)
        if settings.chat and answer.mode == "raw":
            answer.notices.append("the tokenizer has no chat template: raw continuation")
        if cleaned.changed:
            answer.notices.append(cleaned.describe())
        if not prompt.strip():
            answer.refusal = "Nothing to answer: the prompt is empty."
            return answer
        generators = self.enabled_generators()
        if not generators:
            answer.refusal = (
                "Every generator is off: turn one on with /speculative, /target or /drafter."
            )
            return answer
        try:
            ids = self.prompt_ids(prompt)
        except PromptEncodingError as error:
            answer.refusal = f"The prompt cannot be encoded as plain text: {error}."
            return answer
        answer.prompt_tokens = len(ids)
        if not ids:
            answer.refusal = "Nothing to answer: the prompt has no tokens."
            return answer
        has_history = answer.mode == "chat" and bool(self.history)
        hint = " Use /reset to clear the chat history." if has_history else ""
        fitted, history, notice = ids, self.history, None
        if has_history:
            fitted, history, notice = self._fit_history(prompt, ids, generators, settings)
        if self._too_long(fitted, generators, hint) is not None:
            # too long even without the history: the refusal names the prompt as sent
            answer.refusal = self._too_long(ids, generators, hint)
            return answer
        if notice is not None:
            self.history, ids = history, fitted
            answer.notices.append(notice)
            answer.prompt_tokens = len(ids)
        for generator in generators:
            out_of_memory = False
            try:
                run = self._run(generator, ids, settings, on_event)
            except ContextTooLongError as error:
                answer.refusal = f"The prompt is too long: {error}.{hint}"
            except UnusableLogitsError as error:
                answer.refusal = (
                    f"The {generator} run was abandoned: {error}. Nothing was added to the chat"
                    " history; loading the models in float32 (--dtype, --drafter-dtype) may"
                    " avoid it."
                )
            except (_OutOfMemoryError, MemoryError) as error:
                out_of_memory = True
                answer.refusal = (
                    f"Out of memory during the {generator} run ({_summary(error)}): the run was"
                    " abandoned and nothing was added to the chat history; try a shorter"
                    " /length or /reset."
                )
            if answer.refusal is not None:
                answer.runs.clear()
                if out_of_memory:  # the failed run's tensors are unreachable only now
                    release_memory()
                return answer
            answer.runs[generator] = run
            if generator == "speculative":  # its first run chooses the drafter's runtime
                self._release_unneeded_drafter()
            if run.interrupted:
                break
        reply = answer.reply
        if answer.mode == "chat" and reply is not None and not answer.interrupted:
            self.history.extend(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply.text}]
            )
        return answer

    def _context_of(self, generator: GeneratorName) -> tuple[str, int | None]:
        """The role of the model a generator runs (target or drafter) and its context."""
        if generator == "drafter":
            return "drafter", context_length(self._drafter_model())
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
        turns = f"turn{'s' if dropped != 1 else ''}"
        notice = (
            f"the chat no longer leaves room for {settings.max_new_tokens} new tokens in the "
            f"{context}-token context: its oldest {dropped} {turns} were dropped ({len(ids)} "
            "prompt tokens now; /reset clears the rest)"
        )
        return ids, history, notice

    def _too_long(self, ids: list[int], generators: list[GeneratorName], hint: str) -> str | None:
        """The refusal for a prompt that leaves a generator's model no room, else None."""
        for generator in generators:
            role, context = self._context_of(generator)
            if context is not None and len(ids) >= context:
                return (
                    f"The prompt is too long: it has {len(ids)} tokens and the {role} model's"
                    f" context is {context} tokens (a prompt may have at most {context - 1}).{hint}"
                )
        return None

    def _run(
        self,
        generator: GeneratorName,
        ids: list[int],
        settings: Settings,
        on_event: EventCallback | None,
    ) -> Run:
        emit = on_event or (lambda event: None)
        stream = _TextStream(self.tokenizer)

        def on_step(step: StepEvent) -> None:
            pieces = self._pieces(step) if settings.debug else None
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
                result = speculative_generate(
                    ids,
                    drafter,
                    self.pair.target.model,
                    gamma=self._policy(settings, drafter),
                    **common,
                )
            else:
                model = self.pair.target.model if generator == "target" else self._drafter_model()
                result = autoregressive_generate(ids, model, **common)
        except GenerationInterrupted as interrupted:
            result = interrupted.result
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        run = Run(generator, replace(result, text=text), text)
        emit(RunFinished(generator, run))
        return run

    def _drafter(self, settings: Settings) -> Drafter:
        """The drafter the settings ask for; n-gram counts persist while `ngram_keep` is on."""
        options = settings.drafter_options()
        if options.kind == "ngram":
            kept = self._ngram
            if (
                kept is None
                or not settings.ngram_keep
                or (kept.max_order, kept.top_k_filler) != (options.order, options.filler)
            ):
                kept = NgramDrafter(
                    options.order, keep_between_prompts=options.keep, top_k_filler=options.filler
                )
                self._ngram = kept
            return kept
        model = self._drafter_model() if self._drafts_in_torch(settings) else None
        loaded = self.head(settings) if options.needs_head else None
        head = None if loaded is None else loaded[0]
        # kept with its cache while the drafter stays the same (a chat); another one
        # starts empty, and so does the speculative run's target cache. When sampling,
        # the drafter reads the prompt afresh each turn: a bf16 drafter's cache filled
        # token by token rounds differently from one filled at once, and a sampled
        # draft (unlike a greedy one) follows every change of its q, so a seeded
        # answer would no longer repeat a fresh session's token for token (a copy of
        # the target reads no prompt at all: it takes the target's keys and values)
        keep = settings.use_cache and settings.logits_processor().is_greedy
        runtime = self.drafter_runtime(settings)
        key = (options, settings.use_cache, keep, id(model), id(head), id(runtime))
        if self._kept_drafter is not None and self._kept_drafter[0] == key:
            return self._kept_drafter[1]
        drafter = build_drafter(
            options,
            model,
            head=head,
            use_cache=settings.use_cache,
            keep_between_prompts=keep,
            copy_of_target=self.pair.drafter_is_copy,
            model_runtime=None
            if runtime is None
            else runtime.model_drafter(
                options,
                self.pair.target.model,
                keep_between_prompts=keep,
                copy_of_target=self.pair.drafter_is_copy and settings.use_cache,
            ),
        )
        self._caches["speculative"].drop()
        self._kept_drafter = (key, drafter)
        return drafter

    def _policy(self, settings: Settings, drafter: Drafter) -> GammaPolicy:
        """The gamma policy the settings ask for, kept with what it has learnt of
        the drafter's sources and of the target's costs from turn to turn while
        the drafter and the policy's settings stay the same."""
        key = (id(drafter), settings.gamma_policy, settings.gamma, settings.confidence)
        if self._kept_policy is None or self._kept_policy[0] != key:
            self._kept_policy = (key, settings.gamma_policy_object())
        return self._kept_policy[1]

    def drafter_runtime(self, settings: Settings | None = None) -> RuntimeChoice | None:
        """What runs the drafter model under `settings` (None: no model drafts),
        chosen once per requested runtime (`llamacpp_drafter.choose_runtime`:
        "auto" times both runtimes here, ~0.5 s). Raises SettingError when
        llama.cpp is asked for and cannot run."""
        settings = settings or self.settings
        options = settings.drafter_options()
        drafter = self.pair.drafter
        if not options.needs_model or drafter is None:
            return None
        key = _runtime_key(options)
        if key not in self._runtimes:
            try:
                self._runtimes[key] = choose_drafter_runtime(options, drafter.model, drafter.gguf)
            except LlamaCppUnavailable as error:
                raise SettingError(f"the drafter cannot run in llama.cpp: {error}") from None
        return self._runtimes[key]

    def runtime_summary(self) -> str | None:
        """What runs the drafter model and why, once chosen (None before the
        first speculative run, or when no model drafts)."""
        options = self.settings.drafter_options()
        choice = self._runtimes.get(_runtime_key(options))
        return None if choice is None or not options.needs_model else choice.describe()

    def _check_head(self, settings: Settings) -> None:
        """Load the draft head the settings ask for, if any (HeadLoadError if it
        cannot be used with this target; SettingError if none is named)."""
        options = settings.drafter_options()
        if options.kind == "head" and options.head is None:
            raise SettingError(
                "the head drafter needs a draft head: /drafter_kind head PATH (or embedded, the "
                "head shipped for the embedded model); `python infer.py distill` trains one"
            )
        if options.needs_head:
            self.head(settings)

    def head(self, settings: Settings | None = None) -> tuple[DraftHead, dict[str, Any]] | None:
        """The settings' draft head and its description, loaded once per directory."""
        name = (settings or self.settings).drafter_head
        if name is None:
            return None
        if name not in self._heads:
            head, description = load_head(resolve_head(name), self.pair.target.model)
            if self.pair.device.type == "cpu" and head.output_rows.dtype == torch.float32:
                best, timed = fastest_dtype(head, (torch.float32, torch.bfloat16))
                head.to(best)
                description = {
                    **description,
                    "dtype": str(best).removeprefix("torch."),
                    "draft_seconds": timed,
                }
            self._heads[name] = (head, description)
        return self._heads[name]

    def tune_widths(self, *, retime: bool = False) -> dict[str, WidthPlan]:
        """Time the models' forward widths (CPU only; stored plans are reused unless
        `retime`) and install the plans; returns them by role ({} off a CPU)."""
        if self.pair.device.type != "cpu":
            return {}
        store = width_plans_file()
        plans = tune_pair_widths(self.pair, max(self.settings.gamma, 8), store=store, retime=retime)
        self._release_unneeded_drafter()  # a released drafter was loaded again to be timed
        return plans

    def width_plans(self) -> dict[str, WidthPlan | None]:
        """The width plan each model runs with, by role (None: not padded)."""
        plans: dict[str, WidthPlan | None] = {"target": width_plan(self.pair.target.model)}
        drafter = self.pair.drafter
        if drafter is not None and drafter.held is not self.pair.target.model:
            plans["drafter"] = drafter.width_plan()  # a released drafter's is kept
        return plans

    def head_summary(self) -> dict[str, Any] | None:
        """The draft head the settings name (its description and "path"), if one is loaded."""
        name = self.settings.drafter_head
        if name is None or name not in self._heads:
            return None
        return {**self._heads[name][1], "path": str(resolve_head(name))}

    def _drafter_model(self) -> Any:
        """The drafter's torch model, loaded again first if it was released."""
        if self.pair.drafter is None:
            raise SettingError("no drafter model is loaded")
        return self.pair.drafter.model

    def _ready_drafter(self, settings: Settings) -> None:
        """Choose the drafter's runtime under `settings` and load the drafter's
        torch model again now (not in the next answer) if they need it and it
        was released. Raises SettingError when llama.cpp is asked for and
        cannot run, or the model cannot be loaded again."""
        try:
            self.drafter_runtime(settings)
            if self._needs_torch_drafter(settings):
                self._drafter_model()
        except ModelLoadError as error:
            raise SettingError(f"the drafter model cannot be loaded again: {error}") from None

    def _drafts_in_torch(self, settings: Settings) -> bool:
        """Whether the speculative drafter `settings` ask for runs the drafter's
        torch model: a drafter that needs the model, unless llama.cpp runs it."""
        if not settings.drafter_options().needs_model:
            return False
        runtime = self.drafter_runtime(settings)
        return runtime is None or runtime.llama is None

    def _needs_torch_drafter(self, settings: Settings) -> bool:
        """Whether anything `settings` enable runs the drafter's torch model: the
        drafter-alone run, or a speculative drafter that needs the model and
        drafts in torch or has no runtime chosen yet ("auto" times a torch step).
        Chooses nothing."""
        if self.pair.drafter is None:
            return False
        if settings.drafter_gen:
            return True
        options = settings.drafter_options()
        if not (settings.speculative and options.needs_model):
            return False
        choice = self._runtimes.get(_runtime_key(options))
        return choice is None or choice.llama is None

    def _release_unneeded_drafter(self) -> None:
        """Drop the drafter's torch model from memory while nothing the settings
        enable needs it (llama.cpp drafts, say): `LoadedModel.release`, loaded
        again when a setting needs it. What holds the model goes first: the
        drafter-alone run's kept cache and a kept drafter built on it. A model
        that cannot be loaded again (wrapped in memory) or that is the target
        stays."""
        drafter = self.pair.drafter
        model = None if drafter is None else drafter.held
        if (
            drafter is None
            or model is None
            or not drafter.releasable
            or model is self.pair.target.model
            or self._needs_torch_drafter(self.settings)
        ):
            return
        self._caches["drafter"].drop()
        if self._kept_drafter is not None and id(model) in self._kept_drafter[0]:
            self._kept_drafter = None
        del model
        drafter.release()

    def _pieces(self, step: StepEvent) -> StepPieces:
        def piece(token: int) -> str:
            return self.tokenizer.decode([token], skip_special_tokens=False)

        appended = step.appended
        if len(appended) <= step.accepted:  # cut at an end token: the rest never counted
            return StepPieces(tuple(piece(token) for token in appended), None, None)
        rejected = step.rejected
        return StepPieces(
            accepted=tuple(piece(token) for token in appended[: step.accepted]),
            rejected=None if rejected is None else piece(rejected),
            target=piece(appended[step.accepted]),
        )


def _summary(error: BaseException, limit: int = 160) -> str:
    """The first line of an error's message, cut to `limit` characters."""
    lines = str(error).strip().splitlines()
    line = lines[0] if lines else type(error).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _runtime_key(options: DrafterOptions) -> str:
    """What a drafter-runtime choice depends on: the runtime asked for."""
    return options.runtime
