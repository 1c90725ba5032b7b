"""The benchmark runner: every method timed on every prompt with one loaded pair.

For each prompt, in one process on the same loaded models, after a warm-up,
in an order that alternates from one prompt to the next, `Benchmark` runs
specrepl target-only, specrepl speculative (the chosen drafter kind and gamma
policy), optionally a fixed-gamma sweep, and with peers what a user would run
instead: transformers `generate()` plain, compiled, with `assistant_model`
(its default settings, and with the number of drafts matched to gamma) and
with `prompt_lookup_num_tokens`, and llama.cpp on the target's GGUF file
(plain and with its prompt lookup, `llamacpp.py`). All methods get the same end tokens and token
budget; each run is timed around the call with a clock that synchronizes the
device. Every run is compared token for token with the target-only output
(`output_match.py`: greedy runs must be identical).

A question with several turns is a conversation: each turn is measured as its
own prompt, asked with the earlier turns and the target-only answers to them in
its context (the same history for every method, encoded by
`prompting.prompt_ids` as the REPL encodes its chat; the oldest turns go, as the
REPL drops them, when the context would overflow). With `conversation`
(`bench --chat`) every turn of the file belongs to one chat, and each specrepl
method keeps its caches from one turn to the next as the REPL's session keeps
them for each generator: the target's `PromptCache` and a drafter built to keep
its own state. The peers keep nothing and read each turn's whole prompt.

It never prints: progress goes through a callback.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
from transformers import CompileConfig, GenerationConfig
from transformers.utils import logging as hf_logging

from specrepl.chat.answers import Message
from specrepl.chat.settings import Settings
from specrepl.engine.devices import synchronize
from specrepl.engine.drafters.draft_head import DraftHead, HeadLoadError, load_head, resolve_head
from specrepl.engine.drafters.kinds import DRAFTER_KINDS, Drafter, DrafterOptions, build_drafter
from specrepl.engine.drafters.llamacpp import RuntimeChoice, choose_drafter_runtime
from specrepl.engine.gamma import FixedGamma, GammaPolicy, make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.output_match import compare_outputs
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.results import StepEvent
from specrepl.engine.widths import WidthPlan, tune_pair_widths
from specrepl.measure.bench.figures import (
    HF_ASSISTED,
    HF_ASSISTED_MATCHED,
    HF_COMPILED,
    HF_GENERATE,
    HF_LOOKUP,
    LLAMACPP,
    LLAMACPP_LOOKUP,
    LONG_INPUT_TOKENS,
    SPECULATIVE,
    TARGET,
    Method,
    MethodRun,
    PromptRecord,
    predict_from_steps,
)
from specrepl.measure.bench.llamacpp import LlamaCpp, LlamaCppUnavailable, open_llamacpp
from specrepl.measure.bench.prompts import BenchError, BenchPrompt, BenchTurn, conversations
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import fit_history, has_chat_template, prompt_ids

__all__ = [
    "PEERS",
    "BenchOptions",
    "Benchmark",
    "Conversation",
    "GammaSpec",
    "ProgressCallback",
]

PEERS = ("hf", "hf-lookup", "hf-compiled", "llamacpp", "none")
HF_PEERS = frozenset({"hf", "hf-lookup", "hf-compiled"})
WARMUP_MAX_NEW_TOKENS = 32

# What a matched assistant is given (assistant_model.generation_config fields).
_ASSISTANT_FIELDS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
)

ProgressCallback = Callable[[int, int, str], None]
"""Called before each timed run with (runs done, runs in all, what runs now)."""


@dataclass(frozen=True)
class GammaSpec:
    """A gamma policy by name with its fixed value or maximum, and the
    confidence threshold the `confidence` policy stops below (the REPL's
    `--confidence`; the other policies ignore it)."""

    policy: str
    gamma: int
    confidence: float = Settings.confidence

    def build(self) -> GammaPolicy:
        return make_policy(self.policy, self.gamma, confidence=self.confidence)

    def describe(self) -> str:
        return str(self.gamma) if self.policy == "fixed" else f"{self.policy}≤{self.gamma}"


@dataclass(frozen=True)
class BenchOptions:
    """What to measure: budget, decoding rule, drafter, gamma, peers, sweep."""

    max_new_tokens: int = 128
    processor: LogitsProcessor = field(default_factory=lambda: Settings().logits_processor())
    gamma: GammaSpec = GammaSpec("fixed", 4)
    drafter_kind: str = "model"
    drafter: DrafterOptions = field(default_factory=DrafterOptions)  # order, filler, window...
    peers: tuple[str, ...] = ()
    sweep: tuple[int, ...] = ()
    seed: int = 0
    warmup: int = 1
    use_cache: bool = True
    chat: bool = True
    system_prompt: str | None = None
    tune_widths: bool = True
    compile_backend: str = "inductor"
    """torch.compile's backend for the hf-compiled peer."""
    conversation: bool = False
    """`--chat`: every prompt of the file is a turn of one chat, caches kept between turns."""
    long_input_tokens: int = LONG_INPUT_TOKENS
    """A turn whose prompt has at least this many tokens counts as a long input."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise BenchError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.drafter_kind not in DRAFTER_KINDS:
            raise BenchError(
                f"--drafter-kind must be one of {', '.join(DRAFTER_KINDS)}, "
                f"got {self.drafter_kind!r}"
            )
        unknown = [peer for peer in self.peers if peer not in PEERS]
        if unknown:
            raise BenchError(f"--peers must be one of {', '.join(PEERS)}, got {unknown[0]!r}")
        if self.warmup < 0:
            raise BenchError(f"--warmup must be >= 0, got {self.warmup}")
        if self.long_input_tokens < 1:
            raise BenchError(f"--long-input must be >= 1, got {self.long_input_tokens}")

    @property
    def greedy(self) -> bool:
        return self.processor.is_greedy

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_new_tokens": self.max_new_tokens,
            "processor": self.processor.describe(),
            "processor_parameters": self.processor.parameters(),
            "gamma": {
                "policy": self.gamma.policy,
                "value": self.gamma.gamma,
                "confidence": self.gamma.confidence,
            },
            "drafter_kind": self.drafter_kind,
            "drafter_options": {**asdict(self.drafter), "kind": self.drafter_kind},
            "peers": list(self.peers),
            "gamma_sweep": list(self.sweep),
            "seed": self.seed,
            "warmup_runs": self.warmup,
            "use_cache": self.use_cache,
            "chat_template": self.chat,
            "system_prompt": self.system_prompt,
            "tune_widths": self.tune_widths,
            "compile_backend": self.compile_backend,
            "conversation": self.conversation,
            "long_input_tokens": self.long_input_tokens,
        }


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' warnings (deprecations inside its own assisted generation)
    would break the progress bar: raise its logger to errors for the runs."""
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _transformers_default(name: str) -> Any:
    """transformers' built-in default of a generation option (None if unknown)."""
    defaults = getattr(GenerationConfig(), "_get_default_generation_params", None)
    return defaults().get(name) if callable(defaults) else None


@dataclass
class Conversation:
    """One benchmark chat as the REPL's session holds it: how many turns were
    asked, and the history the next turn is encoded with (each user turn and
    the target-only answer to it)."""

    history: list[Message] = field(default_factory=list)
    asked: int = 0

    def answered(self, question: str, answer: str | None) -> None:
        """One more turn asked; with an `answer` (chat mode), both join the history."""
        self.asked += 1
        if answer is not None:
            self.history += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]


@dataclass
class _Kept:
    """What `--chat` keeps from turn to turn for each specrepl method, as the
    REPL keeps it for each generator: the target's cache, and a drafter built
    to keep its own state (speculative methods)."""

    caches: dict[str, PromptCache] = field(default_factory=dict)
    drafters: dict[str, Drafter] = field(default_factory=dict)
    policies: dict[str, GammaPolicy] = field(default_factory=dict)
    """The gamma policy of each speculative method, with what it has learnt."""


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or not bottom:
        return None
    return top / bottom


class Benchmark:
    """Times every method on every prompt with one loaded pair.

    `records` grows as prompts finish, so that an interrupted benchmark still
    has everything measured until then.
    """

    def __init__(self, pair: ModelPair, options: BenchOptions) -> None:
        self.pair = pair
        self.options = options
        self.drafter_runtime: RuntimeChoice | None = None
        """What runs the drafter model, once `_make_drafter` has chosen."""
        self._head: DraftHead | None = None
        self.drafter = self._make_drafter()
        self.methods = self._make_methods()
        self._check_conversation()
        self.chat_template = options.chat and has_chat_template(pair.tokenizer)
        """Whether prompts are chat messages (then a turn's history is in its prompt)."""
        self._kept = _Kept()
        self.records: list[PromptRecord] = []
        self.skipped: list[tuple[BenchTurn, str]] = []
        self.width_plans: dict[str, WidthPlan] = {}
        self.unavailable: dict[str, str] = {}
        """Peers that were asked for and cannot run here, with the reason."""
        self.compile_seconds: float | None = None
        """The hf-compiled peer's first call (compilation included), not timed with the runs."""
        self.llamacpp: LlamaCpp | None = None
        """The llama.cpp peer once `open_llamacpp_peer` has loaded it."""

    # -- set-up ------------------------------------------------------------

    def _make_drafter(self) -> Drafter:
        options = replace(self.options.drafter, kind=self.options.drafter_kind)
        if options.needs_model and self.pair.drafter is None:
            raise BenchError(
                f"--drafter-kind {options.kind} needs a drafter model, and the config loads none: "
                "add a [drafter] table or use --drafter-kind ngram or lookup"
            )
        model = self.pair.drafter.model if self.pair.drafter is not None else None
        if options.needs_head:
            if options.head is None:
                raise BenchError(
                    f"--drafter-kind {options.kind} needs a draft head: give --drafter-head PATH "
                    "(or embedded), or a [drafter] head in the config"
                )
            try:
                self._head, _ = load_head(resolve_head(options.head), self.pair.target.model)
            except HeadLoadError as error:
                raise BenchError(str(error)) from None
        gguf = self.pair.drafter.gguf if self.pair.drafter is not None else None
        try:
            self.drafter_runtime = choose_drafter_runtime(options, model, gguf)
        except LlamaCppUnavailable as error:
            raise BenchError(f"the drafter cannot run in llama.cpp: {error}") from None
        return self._build_drafter(keep_between_prompts=False)

    def _build_drafter(self, *, keep_between_prompts: bool) -> Drafter:
        """A drafter as the options ask, on the head and runtime chosen once."""
        options = replace(self.options.drafter, kind=self.options.drafter_kind)
        runtime = self.drafter_runtime
        return build_drafter(
            options,
            self.pair.drafter.model if self.pair.drafter is not None else None,
            head=self._head,
            use_cache=self.options.use_cache,
            keep_between_prompts=keep_between_prompts,
            copy_of_target=self.pair.drafter_is_copy,
            model_runtime=None
            if runtime is None
            else runtime.model_drafter(
                options,
                self.pair.target.model,
                keep_between_prompts=keep_between_prompts,
                copy_of_target=self.pair.drafter_is_copy and self.options.use_cache,
            ),
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
        keep = self.options.use_cache and self.options.greedy
        self._kept = _Kept()
        for method in self.methods:
            if method.family != "specrepl":
                continue
            if self.options.use_cache:
                self._kept.caches[method.name] = PromptCache()
            if method.speculative:
                drafter = self._build_drafter(keep_between_prompts=keep)
                drafter.forget()  # a llama.cpp drafter's state is shared: the warm-up's
                self._kept.drafters[method.name] = drafter
                self._kept.policies[method.name] = self._policy(method)

    def _make_methods(self) -> list[Method]:
        options = self.options
        spec = options.gamma
        kind = options.drafter_kind
        drafting: dict[str, Any] = {"drafter_kind": kind}
        if self.drafter_runtime is not None:
            drafting["drafter_runtime"] = self.drafter_runtime.describe()
        methods = [
            Method(TARGET, "specrepl target-only", "specrepl"),
            Method(
                SPECULATIVE,
                f"specrepl speculative ({kind}, γ {spec.describe()})",
                "specrepl",
                speculative=True,
                settings={**drafting, "gamma_policy": spec.policy, "gamma": spec.gamma},
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
            for gamma in options.sweep
        ]
        return methods + self._peer_methods(set(options.peers) - {"none"})

    def _peer_methods(self, peers: set[str]) -> list[Method]:
        """What users run instead, as `peers` ask."""
        methods = self._hf_methods(peers) if peers & HF_PEERS else []
        if "llamacpp" in peers:
            methods += self._llamacpp_methods()
        return methods

    def _llamacpp_methods(self) -> list[Method]:
        """llama.cpp on the target's GGUF file, plain and with prompt lookup."""
        gguf = self.pair.target.gguf
        common = {"gguf": None if gguf is None else gguf.name, "threads": torch.get_num_threads()}
        gamma = self.options.gamma.gamma
        return [
            Method(LLAMACPP, "llama.cpp", "llamacpp", settings=common),
            Method(
                LLAMACPP_LOOKUP,
                f"llama.cpp prompt lookup ({gamma})",
                "llamacpp",
                settings={**common, "num_pred_tokens": gamma},
            ),
        ]

    def _hf_methods(self, peers: set[str]) -> list[Method]:
        """transformers `generate()` plain, compiled, assisted by the drafter
        model and with prompt lookup, as `peers` ask."""
        spec = self.options.gamma
        methods = [Method(HF_GENERATE, "HF generate", "hf")]
        if "hf-compiled" in peers:
            methods.append(
                Method(
                    HF_COMPILED,
                    "HF generate (static cache, torch.compile)",
                    "hf",
                    settings={
                        "cache_implementation": "static",
                        "compile_config": {
                            "dynamic": True,
                            "backend": self.options.compile_backend,
                        },
                    },
                )
            )
        if "hf" in peers and self.pair.drafter is not None:
            defaults = {name: _transformers_default(name) for name in _ASSISTANT_FIELDS}
            loaded = self.pair.drafter.model.generation_config
            effective = {
                name: getattr(loaded, name, None)
                if getattr(loaded, name, None) is not None
                else defaults[name]
                for name in _ASSISTANT_FIELDS
            }
            threshold = effective["assistant_confidence_threshold"]
            stop = f", stop below {threshold}" if threshold else ""
            methods.append(
                Method(
                    HF_ASSISTED,
                    f"HF assisted (default: {effective['num_assistant_tokens']} drafts{stop})",
                    "hf",
                    settings={"assistant_generation_config": effective},
                )
            )
            methods.append(
                Method(
                    HF_ASSISTED_MATCHED,
                    f"HF assisted (γ {spec.gamma})",
                    "hf",
                    settings={"assistant_generation_config": self._matched_assistant()},
                )
            )
        if not peers & {"hf", "hf-lookup"}:
            return methods
        methods.append(
            Method(
                HF_LOOKUP,
                f"HF prompt lookup ({spec.gamma})",
                "hf",
                settings={
                    "prompt_lookup_num_tokens": spec.gamma,
                    "max_matching_ngram_size": _transformers_default("max_matching_ngram_size"),
                },
            )
        )
        return methods

    def _matched_assistant(self) -> dict[str, Any]:
        """The assistant settings that draft as our gamma policy does: a constant
        number of drafts (the fixed gamma or the policy's maximum) and the
        policy's confidence stop (0: none)."""
        spec = self.options.gamma
        return {
            "num_assistant_tokens": spec.gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": float(spec.build().min_confidence),
        }

    @property
    def hf_options(self) -> dict[str, Any]:
        """`generate()` options shared by every HF peer: our end tokens, our
        decoding rule, no other processing."""
        eos = list(self.pair.eos_token_ids)
        pad = self.pair.tokenizer.pad_token_id
        options: dict[str, Any] = {
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else (eos[0] if eos else None),
            "use_cache": self.options.use_cache,
        }
        processor = self.options.processor
        if processor.is_greedy:
            options["do_sample"] = False
        else:
            parameters = processor.parameters()
            options.update(
                do_sample=True,
                temperature=float(parameters.get("temperature", 1.0)),
                top_k=int(parameters.get("top_k", 0)),
                top_p=float(parameters.get("top_p", 1.0)),
            )
        return options

    def prompt_ids(self, text: str, history: Sequence[Message] = ()) -> list[int]:
        """The prompt's token ids, encoded as the REPL encodes them
        (`prompting.prompt_ids`: the chat template over the system prompt,
        `history` and `text` when the tokenizer has one)."""
        return prompt_ids(
            self.pair.tokenizer,
            text,
            chat=self.options.chat,
            system_prompt=self.options.system_prompt,
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
            room=self.options.max_new_tokens,
            context=self.pair.context_length,
        )
        return ids, kept

    # -- timing one method ---------------------------------------------------

    def _timed(self, call: Callable[[], Any]) -> tuple[Any, float]:
        device = self.pair.device
        synchronize(device)
        start = time.perf_counter()
        value = call()
        synchronize(device)
        return value, time.perf_counter() - start

    def _specrepl(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        events: list[StepEvent] = []
        common = {
            **self.pair.generation_options(use_cache=self.options.use_cache, seed=seed),
            "logits_processor": self.options.processor,
            "max_gen_len": budget,
            "on_step": events.append,
            "prompt_cache": self._kept.caches.get(method.name),  # --chat: kept between turns
        }
        target = self.pair.target.model
        if not method.speculative:
            result, seconds = self._timed(lambda: autoregressive_generate(ids, target, **common))
        else:
            policy = self._kept.policies.get(method.name) or self._policy(method)
            drafter = self._kept.drafters.get(method.name, self.drafter)
            result, seconds = self._timed(
                lambda: speculative_generate(ids, drafter, target, gamma=policy, **common)
            )
        return MethodRun.from_result(method.name, result, seconds, events)

    def _policy(self, method: Method) -> GammaPolicy:
        if method.sweep_gamma is not None:
            return FixedGamma(method.sweep_gamma)
        return self.options.gamma.build()

    @contextlib.contextmanager
    def _assistant_config(self, **changes: Any) -> Iterator[Any]:
        """The drafter model with `changes` to its generation config, restored
        afterwards (transformers may adapt some of them in place)."""
        if self.pair.drafter is None:
            raise BenchError("an assisted peer needs a drafter model")
        model = self.pair.drafter.model
        config = model.generation_config
        saved = {name: getattr(config, name, None) for name in _ASSISTANT_FIELDS}
        for name, value in changes.items():
            setattr(config, name, value)
        try:
            yield model
        finally:
            for name, value in saved.items():
                setattr(config, name, value)

    def _hf(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        model = self.pair.target.model
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.pair.device)
        attention_mask = torch.ones_like(input_ids)
        options = {**self.hf_options, "max_new_tokens": budget}
        changes: dict[str, Any] = {}
        if method.name == HF_LOOKUP:
            options["prompt_lookup_num_tokens"] = self.options.gamma.gamma
        elif method.name == HF_COMPILED:
            options["cache_implementation"] = "static"
            options["compile_config"] = self._compile_config()
        elif method.name == HF_ASSISTED_MATCHED:
            changes = self._matched_assistant()
        assisted = method.name in (HF_ASSISTED, HF_ASSISTED_MATCHED)
        with self._assistant_config(**changes) if assisted else contextlib.nullcontext() as helper:
            if helper is not None:
                options["assistant_model"] = helper
            torch.manual_seed(seed)
            output, seconds = self._timed(
                lambda: model.generate(input_ids, attention_mask=attention_mask, **options)
            )
        tokens = [int(token) for token in output[0, len(ids) :].tolist()]
        return self._peer_run(method, tokens, seconds)

    def _peer_run(self, method: Method, tokens: list[int], seconds: float) -> MethodRun:
        """A peer's run from its new tokens: it stopped at an end token or the budget."""
        ended = bool(tokens) and tokens[-1] in self.pair.eos_token_ids
        return MethodRun(
            method=method.name,
            token_ids=tokens,
            seconds=seconds,
            stop_reason="eos" if ended else "length",
        )

    def _compile_config(self) -> CompileConfig:
        """What transformers documents for a fast `generate()`: a static cache
        and its forward compiled, with dynamic shapes so that prompts of other
        lengths reuse the graph. transformers compiles only on a GPU unless its
        `_compile_all_devices` switch is set, which it keeps for a CPU run."""
        config = CompileConfig(dynamic=True, backend=self.options.compile_backend)
        if self.pair.device.type == "cpu":
            config._compile_all_devices = True
        return config

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
            run = self._hf(method, ids, budget, self.options.seed)
        except Exception as error:  # torch.compile fails in many ways, all of them here
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            self.drop_peer(method.name, f"torch.compile failed here ({reason})")
            return
        self.compile_seconds = run.seconds

    def open_llamacpp_peer(self) -> None:
        """Load the llama.cpp peer before anything is timed; when it cannot run
        here (not installed, no GGUF file, does not load), its methods are
        dropped and `unavailable` says why."""
        names = {LLAMACPP, LLAMACPP_LOOKUP}
        if not any(method.name in names for method in self.methods):
            return
        try:
            self.llamacpp = open_llamacpp(
                self.pair.target.gguf,
                context_length=self.pair.context_length,
                draft_tokens=self.options.gamma.gamma,
                end_tokens=self.pair.eos_token_ids,
                threads=torch.get_num_threads(),
            )
        except LlamaCppUnavailable as error:
            for name in sorted(names):
                self.drop_peer(name, str(error))
            return
        version = {"llama_cpp_python": self.llamacpp.version}
        self.methods = [
            replace(m, settings={**m.settings, **version}) if m.name in names else m
            for m in self.methods
        ]

    def _llamacpp(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        if self.llamacpp is None:
            raise BenchError("the llama.cpp peer is not loaded (open_llamacpp_peer first)")
        peer = self.llamacpp
        lookup = method.name == LLAMACPP_LOOKUP
        tokens, seconds = self._timed(
            lambda: peer.generate(ids, budget, self.options.processor, seed, lookup=lookup)
        )
        return self._peer_run(method, tokens, seconds)

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
            return self._llamacpp(method, ids, budget, seed)
        return self._hf(method, ids, budget, seed)

    # -- the whole benchmark --------------------------------------------------

    def budget(self, prompt_tokens: int) -> int:
        """New tokens every method may make: the limit, or what the context leaves."""
        return min(self.options.max_new_tokens, self.pair.context_length - prompt_tokens)

    def max_gamma(self) -> int:
        return max((self.options.gamma.gamma, *self.options.sweep))

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
                self._run_or_drop(method, ids, budget, self.options.seed, "the warm-up")
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
        seed = self.options.seed + index
        runs: dict[str, MethodRun] = {}
        for step, method in enumerate(order):
            if on_progress is not None:
                on_progress(done + step, total, f"{turn.key} · {method.label}")
            run = self._run_or_drop(method, ids, budget, seed, turn.key)
            if run is not None:
                runs[method.name] = run
        self._compare(runs)
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

    def _compare(self, runs: dict[str, MethodRun]) -> None:
        """Tokens against target-only's, per-prompt speedups, predictions."""
        target = runs[TARGET]
        hf = runs.get(HF_GENERATE)
        for name, run in runs.items():
            if name != TARGET:
                run.match = compare_outputs(
                    run.token_ids, target.token_ids, greedy=self.options.greedy
                )
            run.speedup_vs_target = _ratio(run.tokens_per_second, target.tokens_per_second)
            if hf is not None:
                run.speedup_vs_hf = _ratio(run.tokens_per_second, hf.tokens_per_second)
            if run.drafted is not None:
                run.prediction = predict_from_steps(run.events, target.events)
                run.draft_cost_vs_target = _ratio(run.seconds_per_draft, target.target_step_seconds)

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
        with _quiet_transformers(), torch.no_grad():
            if self.options.tune_widths:
                if on_progress is not None:
                    on_progress(0, total, "timing forward widths")
                self.width_plans = tune_pair_widths(self.pair, self.max_gamma())
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
