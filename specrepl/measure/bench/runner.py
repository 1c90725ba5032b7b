"""The benchmark runner: every method timed on every prompt with one loaded pair.

For each prompt, in one process on the same loaded models, after a warm-up, in
an order that alternates from one prompt to the next, `Benchmark` runs specrepl
target-only, specrepl speculative (the drafter kind and gamma policy the
settings ask for, as the REPL runs them), optionally a fixed-gamma sweep, and
with peers what a user would run instead (`peers.py`: transformers `generate()`
in its forms, llama.cpp). All methods get the same end tokens and budget; each
run is timed by a clock that synchronizes the device (`peers.timed`) and
compared token for token with the target-only output (`output_match.py`: greedy
runs must be identical).

A question with several turns is a conversation: each turn is measured as its
own prompt, asked with the earlier turns and the target-only answers to them in
its context (the same history for every method, encoded by
`prompting.prompt_ids` as the REPL encodes its chat; the oldest turns go, as the
REPL drops them, when the context would overflow). With `conversation`
(`bench --chat`) every turn of the file belongs to one chat, and each specrepl
method keeps its caches from one turn to the next as the REPL's session keeps
them for each generator: the target's `PromptCache` and a drafter built to keep
its own state. The peers keep nothing and read each turn's whole prompt. It
never prints: progress goes through a callback."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from specrepl.chat.answers import Message
from specrepl.chat.draft_choice import DraftChoice
from specrepl.chat.drafting import (
    build_pair_drafter,
    choose_hybrid_source,
    drafter_runtime,
    drafter_spec,
    keeps_drafter_state,
)
from specrepl.chat.settings import SettingError
from specrepl.chat.target import ChatTarget
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.builder import load_drafter_head
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head_store import HeadLoadError
from specrepl.engine.drafters.runtime import RuntimeChoice
from specrepl.engine.gamma import FixedGamma, GammaPolicy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import StepEvent
from specrepl.engine.widths import WidthPlan
from specrepl.measure.bench.figures import (
    HF_COMPILED,
    SPECULATIVE,
    TARGET,
    Method,
    MethodRun,
    PromptRecord,
    compare_with_target,
)
from specrepl.measure.bench.llamacpp import LlamaCppUnavailable
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.peers import HF_PEERS, HfPeer, LlamaCppPeer, quiet_transformers, timed
from specrepl.measure.bench.prompts import (
    BenchError,
    BenchPrompt,
    BenchTurn,
    Conversation,
    conversations,
)
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import fit_history, has_chat_template, prompt_ids
from specrepl.models.width_plans import tune_pair_widths

__all__ = ["Benchmark", "ProgressCallback"]

WARMUP_MAX_NEW_TOKENS = 32

ProgressCallback = Callable[[int, int, str], None]
"""Called before each timed run with (runs done, runs in all, what runs now)."""


@dataclass
class _Kept:
    """What `--chat` keeps from turn to turn for each specrepl method, as the
    REPL keeps it for each generator: the target's cache, and a drafter built
    to keep its own state (speculative methods)."""

    caches: dict[str, PromptCache] = field(default_factory=dict)
    drafters: dict[str, Drafter] = field(default_factory=dict)
    policies: dict[str, GammaPolicy] = field(default_factory=dict)
    """The gamma policy of each speculative method, with what it has learnt."""


class Benchmark:
    """Times every method on every prompt with one loaded pair.

    `records` grows as prompts finish, so that an interrupted benchmark still
    has everything measured until then.
    """

    def __init__(self, pair: ModelPair, options: BenchOptions) -> None:
        self.pair = pair
        self.options = options
        self.settings = options.settings
        """What the REPL would run with: budget, decoding rule, drafter, gamma, ..."""
        self.processor = options.processor
        self.hf, self.llamacpp = HfPeer(pair, options), LlamaCppPeer(pair, options)
        self.target = ChatTarget.checked(pair, self.settings)  # runs both specrepl methods' target
        self.drafter_runtime: RuntimeChoice | None = None
        """What runs the drafter model, once `_make_drafter` has chosen."""
        self._head: DraftHead | None = None
        self.draft_choice: DraftChoice | None = None  # a hybrid's head "auto", once chosen
        self.drafter = self._make_drafter()
        self.methods = self._make_methods()
        self._check_conversation()
        self.chat_template = self.settings.chat and has_chat_template(pair.tokenizer)
        """Whether prompts are chat messages (then a turn's history is in its prompt)."""
        self._kept = _Kept()
        self.records: list[PromptRecord] = []
        self.skipped: list[tuple[BenchTurn, str]] = []
        self.width_plans: dict[str, WidthPlan] = {}
        self.unavailable: dict[str, str] = {}
        """Peers that were asked for and cannot run here, with the reason."""
        self.compile_seconds: float | None = None
        """The hf-compiled peer's first call (compilation included), not timed with the runs."""

    # -- set-up ------------------------------------------------------------

    def _make_drafter(self) -> Drafter:
        """The drafter the settings ask for, with its head loaded and its runtime
        chosen once, as the REPL's session loads and chooses them; BenchError
        for what the config cannot give."""
        options = self.options.drafter
        if options.needs_model and self.pair.drafter is None:
            raise BenchError(
                f"--drafter-kind {options.kind} needs a drafter model, and the config loads none: "
                "add a [drafter] table or use --drafter-kind ngram or lookup"
            )
        if options.needs_head:
            if options.head is None:
                raise BenchError(
                    f"--drafter-kind {options.kind} needs a draft head: give --drafter-head PATH "
                    "(or embedded), or a [drafter] head in the config"
                )
            try:
                self._head, _ = load_drafter_head(options.head, self.pair.target.model)
            except HeadLoadError as error:
                raise BenchError(str(error)) from None
        try:
            self.drafter_runtime = drafter_runtime(options, self.pair)
        except SettingError as error:
            raise BenchError(str(error)) from None
        return self._build_drafter(keep_between_prompts=False)

    def _choose_draft_source(self) -> None:
        """A hybrid with head "auto": the head or the model, chosen as the REPL chooses."""
        target, runtime = self.target.runnable(self.settings), self.drafter_runtime
        chosen = choose_hybrid_source(self.settings, self.pair, runtime, target=target)
        self.draft_choice, self._head = chosen
        self.settings = self.draft_choice.settle(self.settings)
        for method in self.methods:
            if method.speculative:
                method.settings["draft_source"] = self.draft_choice.describe()

    def _build_drafter(self, *, keep_between_prompts: bool) -> Drafter:
        """The drafter the settings ask for, on the head and runtime chosen once,
        built as the REPL's session builds it (`drafting.drafter_spec`)."""
        spec = drafter_spec(self.settings, self.pair, keep_between_prompts=keep_between_prompts)
        model = self.pair.drafter.model if self.pair.drafter is not None else None
        target, runtime = self.target.runnable(self.settings), self.drafter_runtime
        return build_pair_drafter(
            spec, self.pair, model=model, head=self._head, runtime=runtime, target=target
        )

    def _check_conversation(self) -> None:
        """`--chat` keeps a drafter per speculative method; llama.cpp holds one
        state, which the sweep's methods would share (each finding the turn
        another one read): refused."""
        llama = self.drafter_runtime is not None and self.drafter_runtime.llama is not None
        if self.options.conversation and self.options.sweep and llama:
            raise BenchError(
                "--chat with --gamma-sweep and a drafter in llama.cpp: the sweep's runs would"
                " share llama.cpp's one drafter state; drop --gamma-sweep or give"
                " --drafter-runtime torch"
            )

    def _keep_between_turns(self) -> None:
        """`--chat`: a fresh target cache and drafter for each specrepl method, kept
        from turn to turn as the REPL's session keeps them (the drafter keeps its
        state only when greedy, as there)."""
        keep = keeps_drafter_state(self.settings)
        self._kept = _Kept()
        for method in self.methods:
            if method.family != "specrepl":
                continue
            if self.settings.use_cache:
                self._kept.caches[method.name] = PromptCache()
            if method.speculative:
                drafter = self._build_drafter(keep_between_prompts=keep)
                drafter.forget()  # a llama.cpp drafter's state is shared: the warm-up's
                self._kept.drafters[method.name] = drafter
                self._kept.policies[method.name] = self._policy(method)

    def _make_methods(self) -> list[Method]:
        settings = self.settings
        kind = settings.drafter_kind
        drafting: dict[str, Any] = {"drafter_kind": kind}
        if self.drafter_runtime is not None:
            drafting["drafter_runtime"] = self.drafter_runtime.describe()
        runtime = {"target_runtime": self.target.choice(settings).describe()}
        methods = [
            Method(TARGET, "specrepl target-only", "specrepl", settings=runtime),
            Method(
                SPECULATIVE,
                f"specrepl speculative ({kind}, γ {settings.describe_gamma()})",
                "specrepl",
                speculative=True,
                settings={
                    **drafting,
                    **runtime,
                    "gamma_policy": settings.gamma_policy,
                    "gamma": settings.gamma,
                },
            ),
        ]
        methods += [
            Method(
                f"{SPECULATIVE}_g{gamma}",
                f"specrepl speculative ({kind}, γ {gamma})",
                "specrepl",
                speculative=True,
                sweep_gamma=gamma,
                settings={**drafting, "gamma_policy": "fixed", "gamma": gamma},
            )
            for gamma in self.options.sweep
        ]
        return methods + self._peer_methods(set(self.options.peers) - {"none"})

    def _peer_methods(self, peers: set[str]) -> list[Method]:
        """What users run instead, as `peers` ask."""
        methods = self.hf.methods(peers) if peers & HF_PEERS else []
        if peers & LlamaCppPeer.PEERS:
            methods += self.llamacpp.methods(peers)
        return methods

    def prompt_ids(self, text: str, history: Sequence[Message] = ()) -> list[int]:
        """The prompt's token ids, encoded as the REPL encodes them
        (`prompting.prompt_ids`: the chat template over the system prompt,
        `history` and `text` when the tokenizer has one)."""
        return prompt_ids(
            self.pair.tokenizer,
            text,
            chat=self.settings.chat,
            system_prompt=self.settings.system_prompt,
            history=history,
        )

    def fitted_prompt_ids(
        self, text: str, history: Sequence[Message]
    ) -> tuple[list[int], list[Message]]:
        """`text`'s ids after `history`, and the history kept: the oldest turns go
        while the prompt leaves no room for `max_new_tokens` (`prompting.fit_history`,
        as the REPL fits its chat)."""
        ids, kept, _ = fit_history(
            self.prompt_ids(text, history),
            history,
            lambda shorter: self.prompt_ids(text, shorter),
            room=self.settings.max_new_tokens,
            context=self.pair.context_length,
        )
        return ids, kept

    # -- timing one method ---------------------------------------------------

    def _specrepl(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        events: list[StepEvent] = []
        common = {
            **self.pair.generation_options(use_cache=self.settings.use_cache, seed=seed),
            "logits_processor": self.processor,
            "max_gen_len": budget,
            "on_step": events.append,
            "prompt_cache": self._kept.caches.get(method.name),  # --chat: kept between turns
        }
        target = self.target.runnable(self.settings)
        if not method.speculative:
            result, seconds = timed(
                self.pair.device, lambda: autoregressive_generate(ids, target, **common)
            )
        else:
            policy = self._kept.policies.get(method.name) or self._policy(method)
            drafter = self._kept.drafters.get(method.name, self.drafter)
            result, seconds = timed(
                self.pair.device,
                lambda: speculative_generate(ids, drafter, target, gamma=policy, **common),
            )
        return MethodRun.from_result(method.name, result, seconds, events)

    def _policy(self, method: Method) -> GammaPolicy:
        if method.sweep_gamma is not None:
            return FixedGamma(method.sweep_gamma)
        return self.settings.gamma_policy_object()

    def compile_peer(self, prompt: BenchPrompt) -> None:
        """Compile the hf-compiled peer before anything is timed: one short
        run on `prompt`, whose seconds go to `compile_seconds`. When it cannot
        compile here (no C++ compiler, an unknown backend, ...), the peer is
        dropped and `unavailable` says why; everything else runs as before."""
        method = next((m for m in self.methods if m.name == HF_COMPILED), None)
        if method is None:
            return
        ids = self.prompt_ids(prompt.text)
        budget = max(1, min(self.budget(len(ids)), WARMUP_MAX_NEW_TOKENS))
        try:
            run = self.hf.run(method, ids, budget, self.settings.seed)
        except Exception as error:  # torch.compile fails in many ways, all of them here
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            self.drop_peer(method.name, f"torch.compile failed here ({reason})")
            return
        self.compile_seconds = run.seconds

    def open_llamacpp_peer(self) -> None:
        """Load the llama.cpp peer before anything is timed; a method that cannot
        run here (not installed, no GGUF file, does not load) is dropped, and why said."""
        names = {method.name for method in self.methods} & LlamaCppPeer.NAMES
        if not names:
            return
        try:
            llama = self.llamacpp.open()
        except LlamaCppUnavailable as error:
            for name in sorted(names):
                self.drop_peer(name, str(error))
            return
        for name, reason in self.llamacpp.not_loaded().items():  # flash attention, say
            self.drop_peer(name, reason)
        version = {"llama_cpp_python": llama.version}
        self.methods = [
            replace(m, settings={**m.settings, **version}) if m.name in names else m
            for m in self.methods
        ]

    def drop_peer(self, name: str, reason: str) -> None:
        """Leave a peer out of this benchmark, runs already made included, and say why."""
        self.unavailable[name] = reason
        self.methods = [m for m in self.methods if m.name != name]
        for record in self.records:
            record.runs.pop(name, None)

    def _run_or_drop(
        self, method: Method, ids: list[int], budget: int, seed: int, where: str
    ) -> MethodRun | None:
        """`run_method`; a peer that fails (a crash in a third-party library, say)
        is dropped with the reason instead of ending the whole benchmark.
        specrepl's own methods are never dropped: their failure is a bug."""
        if method.family == "specrepl":
            return self.run_method(method, ids, budget, seed)
        try:
            return self.run_method(method, ids, budget, seed)
        except Exception as error:
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            self.drop_peer(method.name, f"failed on {where} ({reason})")
            return None

    def run_method(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        """Time one method on one prompt's ids with a budget of new tokens."""
        if method.family == "specrepl":
            return self._specrepl(method, ids, budget, seed)
        if method.family == "llamacpp":
            return self.llamacpp.run(method, ids, budget, seed)
        return self.hf.run(method, ids, budget, seed)

    # -- the whole benchmark --------------------------------------------------

    def budget(self, prompt_tokens: int) -> int:
        """New tokens every method may make: the limit, or what the context leaves."""
        return min(self.settings.max_new_tokens, self.pair.context_length - prompt_tokens)

    def max_gamma(self) -> int:
        return max((self.settings.gamma, *self.options.sweep))

    def total_runs(self, prompts: Sequence[BenchPrompt]) -> int:
        warmups = self.options.warmup * len(self.methods) if prompts else 0
        return warmups + sum(len(prompt.turns) for prompt in prompts) * len(self.methods)

    def warm_up(
        self, prompt: BenchPrompt, on_progress: ProgressCallback | None = None, *, total: int = 0
    ) -> int:
        """Run every method `options.warmup` times on `prompt`'s first turn (short,
        not recorded)."""
        ids = self.prompt_ids(prompt.text)
        budget = min(self.budget(len(ids)), WARMUP_MAX_NEW_TOKENS)
        done = 0
        if budget < 1:
            return done
        for _ in range(self.options.warmup):
            for method in list(self.methods):
                if on_progress is not None:
                    on_progress(done, total, f"warm-up · {method.label}")
                self._run_or_drop(method, ids, budget, self.settings.seed, "the warm-up")
                done += 1
        return done

    def measure(
        self,
        turn: BenchTurn,
        index: int,
        on_progress: ProgressCallback | None = None,
        *,
        conversation: Conversation | None = None,
        done: int = 0,
        total: int = 0,
    ) -> PromptRecord | None:
        """Run every method on one turn (order reversed on odd `index`), asked
        after `conversation`'s history, which it then joins with the target-only
        answer; None (and the history unchanged) when the turn leaves no room for
        a new token."""
        chat = conversation if conversation is not None else Conversation()
        ids, history = self.fitted_prompt_ids(turn.text, chat.history)
        budget = self.budget(len(ids))
        if budget < 1:
            reason = f"{len(ids)} prompt tokens fill the {self.pair.context_length}-token context"
            self.skipped.append((turn, reason))
            return None
        order = self.methods if index % 2 == 0 else self.methods[::-1]
        seed = self.settings.seed + index
        runs: dict[str, MethodRun] = {}
        for step, method in enumerate(order):
            if on_progress is not None:
                on_progress(done + step, total, f"{turn.key} · {method.label}")
            run = self._run_or_drop(method, ids, budget, seed, turn.key)
            if run is not None:
                runs[method.name] = run
        compare_with_target(runs, greedy=self.processor.is_greedy)
        record = PromptRecord(
            prompt=turn.prompt,
            prompt_tokens=len(ids),
            max_new_tokens=budget,
            order=[method.name for method in order],
            runs={method.name: runs[method.name] for method in self.methods},
            text=self.pair.tokenizer.decode(runs[TARGET].token_ids, skip_special_tokens=True),
            turn=turn.number,
            earlier_turns=chat.asked,
            history_turns=len(history) // 2,
            long_input=len(ids) >= self.options.long_input_tokens,
        )
        self.records.append(record)
        chat.history = history
        chat.answered(turn.text, record.text if self.chat_template else None)
        return record

    def _measure_all(
        self, prompts: Sequence[BenchPrompt], on_progress: ProgressCallback | None, total: int
    ) -> None:
        """Every turn of every conversation in order (`--chat`: one conversation
        of every turn, with the caches kept from turn to turn)."""
        if self.options.conversation:
            self._keep_between_turns()
        done = self.options.warmup * len(self.methods)
        index = 0
        for turns in conversations(prompts, one_chat=self.options.conversation):
            chat = Conversation()
            for turn in turns:
                self.measure(turn, index, on_progress, conversation=chat, done=done, total=total)
                done += len(self.methods)
                index += 1

    def run(
        self, prompts: Sequence[BenchPrompt], on_progress: ProgressCallback | None = None
    ) -> list[PromptRecord]:
        """Warm up on the first prompt, then measure every turn of every prompt in turn."""
        total = self.total_runs(prompts)
        if not prompts:
            return self.records
        with quiet_transformers(), torch.no_grad():
            if self.options.tune_widths:
                if on_progress is not None:
                    on_progress(0, total, "timing forward widths")
                self.width_plans = tune_pair_widths(self.pair, self.max_gamma())
            if self.settings.drafter_options().chooses_head:
                if on_progress is not None:
                    on_progress(0, total, "timing the draft head against the drafter model")
                self._choose_draft_source()
            if self.options.tune_widths or self.draft_choice is not None:
                # built again on the timed widths, as the REPL builds its drafter after
                # them (a llama.cpp drafter's automatic window needs the target's step)
                self.drafter = self._build_drafter(keep_between_prompts=False)
            if any(method.name == HF_COMPILED for method in self.methods):
                if on_progress is not None:
                    on_progress(0, total, "compiling the hf-compiled peer")
                self.compile_peer(prompts[0])
            if on_progress is not None and any(m.family == "llamacpp" for m in self.methods):
                on_progress(0, total, "loading the llama.cpp peer")
            self.open_llamacpp_peer()
            total = self.total_runs(prompts)
            self.warm_up(prompts[0], on_progress, total=total)
            self._measure_all(prompts, on_progress, total)
        if on_progress is not None:
            on_progress(total, total, "done")
        return self.records
