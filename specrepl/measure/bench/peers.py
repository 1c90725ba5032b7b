"""The peers: what a user would run instead of specrepl, given what specrepl is given.

`HfPeer` is transformers `generate()`: plain, compiled (a static cache and
torch.compile), with `assistant_model` (its default settings, and with the
number of drafts matched to gamma; a drafter with a tokenizer of its own is
given with both tokenizers, transformers' universal assisted generation) and
with `prompt_lookup_num_tokens`.
`LlamaCppPeer` is llama.cpp on the target's GGUF file, plain and with its
prompt lookup (the binding in `llamacpp.py`). Every peer gets specrepl's end
tokens, token budget and decoding rule, and is timed with `timed`, the clock
every method is timed with (specrepl's own included): the device synchronized
before and after the call.

Peers keep nothing from one run to the next. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from transformers import CompileConfig, GenerationConfig
from transformers.utils import logging as hf_logging

from specrepl.engine.devices import synchronize
from specrepl.measure.bench.figures import (
    HF_ASSISTED,
    HF_ASSISTED_MATCHED,
    HF_COMPILED,
    HF_GENERATE,
    HF_LOOKUP,
    LLAMACPP,
    LLAMACPP_EXACT,
    LLAMACPP_EXACT_FLASH,
    LLAMACPP_LOOKUP,
    Method,
    MethodRun,
)
from specrepl.measure.bench.llamacpp import LlamaCpp, LlamaCppUnavailable, open_llamacpp
from specrepl.measure.bench.options import BenchOptions
from specrepl.measure.bench.prompts import BenchError
from specrepl.models.gguf_f32 import float32_gguf
from specrepl.models.pair import ModelPair

__all__ = ["HF_PEERS", "HfPeer", "LlamaCppPeer", "quiet_transformers", "timed"]

HF_PEERS = frozenset({"hf", "hf-lookup", "hf-compiled"})

# What a matched assistant is given (assistant_model.generation_config fields).
_ASSISTANT_FIELDS = (
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "assistant_confidence_threshold",
)


def timed(device: torch.device, call: Callable[[], Any]) -> tuple[Any, float]:
    """`call()`'s value and its wall seconds, the device synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    value = call()
    synchronize(device)
    return value, time.perf_counter() - start


def peer_run(method: Method, tokens: list[int], seconds: float, pair: ModelPair) -> MethodRun:
    """A peer's run from its new tokens: it stopped at an end token or the budget."""
    ended = bool(tokens) and tokens[-1] in pair.eos_token_ids
    return MethodRun(
        method=method.name,
        token_ids=tokens,
        seconds=seconds,
        stop_reason="eos" if ended else "length",
    )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
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


class HfPeer:
    """transformers `generate()` on the pair's target, as `peers` ask for it."""

    def __init__(self, pair: ModelPair, options: BenchOptions) -> None:
        self.pair = pair
        self.options = options

    def methods(self, peers: set[str]) -> list[Method]:
        """`generate()` plain, compiled, assisted by the drafter model and with
        prompt lookup, as `peers` ask."""
        methods = [Method(HF_GENERATE, "HF generate", "hf")]
        if "hf-compiled" in peers:
            methods.append(self._compiled_method())
        if "hf" in peers and self.pair.drafter is not None:
            methods += self._assisted_methods()
        if peers & {"hf", "hf-lookup"}:
            methods.append(self._lookup_method())
        return methods

    def _compiled_method(self) -> Method:
        return Method(
            HF_COMPILED,
            "HF generate (static cache, torch.compile)",
            "hf",
            settings={
                "cache_implementation": "static",
                "compile_config": {"dynamic": True, "backend": self.options.compile_backend},
            },
        )

    def _assisted_methods(self) -> list[Method]:
        """The drafter model as `assistant_model`: with its own (or transformers')
        settings, and matched to our gamma policy."""
        assert self.pair.drafter is not None
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
        return [
            Method(
                HF_ASSISTED,
                f"HF assisted (default: {effective['num_assistant_tokens']} drafts{stop})",
                "hf",
                settings={"assistant_generation_config": effective},
            ),
            Method(
                HF_ASSISTED_MATCHED,
                f"HF assisted (γ {self.options.settings.gamma})",
                "hf",
                settings={"assistant_generation_config": self.matched_assistant()},
            ),
        ]

    def _lookup_method(self) -> Method:
        gamma = self.options.settings.gamma
        return Method(
            HF_LOOKUP,
            f"HF prompt lookup ({gamma})",
            "hf",
            settings={
                "prompt_lookup_num_tokens": gamma,
                "max_matching_ngram_size": _transformers_default("max_matching_ngram_size"),
            },
        )

    def matched_assistant(self) -> dict[str, Any]:
        """The assistant settings that draft as our gamma policy does: a constant
        number of drafts (the fixed gamma or the policy's maximum) and the
        policy's confidence stop (0: none)."""
        settings = self.options.settings
        return {
            "num_assistant_tokens": settings.gamma,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": float(settings.gamma_policy_object().min_confidence),
        }

    @property
    def generate_options(self) -> dict[str, Any]:
        """`generate()` options shared by every HF method: our end tokens, our
        decoding rule, no other processing."""
        eos = list(self.pair.eos_token_ids)
        pad = self.pair.tokenizer.pad_token_id
        options: dict[str, Any] = {
            "eos_token_id": eos,
            "pad_token_id": pad if pad is not None else (eos[0] if eos else None),
            "use_cache": self.options.settings.use_cache,
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

    def run(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        """Time one HF method on one prompt's ids with a budget of new tokens."""
        model = self.pair.target.model
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.pair.device)
        attention_mask = torch.ones_like(input_ids)
        options = {**self.generate_options, "max_new_tokens": budget}
        changes: dict[str, Any] = {}
        if method.name == HF_LOOKUP:
            options["prompt_lookup_num_tokens"] = self.options.settings.gamma
        elif method.name == HF_COMPILED:
            options["cache_implementation"] = "static"
            options["compile_config"] = self._compile_config()
        elif method.name == HF_ASSISTED_MATCHED:
            changes = self.matched_assistant()
        assisted = method.name in (HF_ASSISTED, HF_ASSISTED_MATCHED)
        with self._assistant_config(**changes) if assisted else contextlib.nullcontext() as helper:
            if helper is not None:
                options["assistant_model"] = helper
                if self.pair.drafter_tokenizer is not None:
                    options["tokenizer"] = self.pair.tokenizer
                    options["assistant_tokenizer"] = self.pair.drafter_tokenizer
            torch.manual_seed(seed)
            output, seconds = timed(
                self.pair.device,
                lambda: model.generate(input_ids, attention_mask=attention_mask, **options),
            )
        tokens = [int(token) for token in output[0, len(ids) :].tolist()]
        return peer_run(method, tokens, seconds, self.pair)

    def _compile_config(self) -> CompileConfig:
        """What transformers documents for a fast `generate()`: a static cache
        and its forward compiled, with dynamic shapes so that prompts of other
        lengths reuse the graph. transformers compiles only on a GPU unless its
        `_compile_all_devices` switch is set, which it keeps for a CPU run."""
        config = CompileConfig(dynamic=True, backend=self.options.compile_backend)
        if self.pair.device.type == "cpu":
            config._compile_all_devices = True
        return config

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


class LlamaCppPeer:
    """llama.cpp on the target's GGUF file, plain and with its prompt lookup
    (`llamacpp`), and on a GGUF file of the target's exact weights
    (`llamacpp-exact`: float32 for a quantized file, what specrepl's target
    computes with; flash attention off and on, the faster of the two on each
    prompt being the fastest plain run of the same weights)."""

    NAMES = frozenset({LLAMACPP, LLAMACPP_LOOKUP, LLAMACPP_EXACT, LLAMACPP_EXACT_FLASH})
    PEERS = frozenset({"llamacpp", "llamacpp-exact"})

    def __init__(self, pair: ModelPair, options: BenchOptions) -> None:
        self.pair = pair
        self.options = options
        self.llama: LlamaCpp | None = None
        """The binding's models once `open` has loaded them."""

    @property
    def asked(self) -> set[str]:
        """The llama.cpp peers the options ask for."""
        return set(self.options.peers) & self.PEERS

    def methods(self, peers: set[str]) -> list[Method]:
        gguf = self.pair.target.gguf
        common = {"gguf": None if gguf is None else gguf.name, "threads": torch.get_num_threads()}
        gamma = self.options.settings.gamma
        methods = []
        if "llamacpp-exact" in peers:
            label = "llama.cpp, the target's exact weights"
            methods.append(Method(LLAMACPP_EXACT, label, "llamacpp", settings=common))
            methods.append(
                Method(
                    LLAMACPP_EXACT_FLASH,
                    f"{label}, flash attention",
                    "llamacpp",
                    settings={**common, "flash_attn": True},
                )
            )
        if "llamacpp" in peers:
            methods.append(Method(LLAMACPP, "llama.cpp", "llamacpp", settings=common))
            methods.append(
                Method(
                    LLAMACPP_LOOKUP,
                    f"llama.cpp prompt lookup ({gamma})",
                    "llamacpp",
                    settings={**common, "num_pred_tokens": gamma},
                )
            )
        return methods

    def open(self) -> LlamaCpp:
        """Load the GGUF files the asked peers run; raises LlamaCppUnavailable
        with the reason."""
        gguf = self.pair.target.gguf
        exact = None
        if "llamacpp-exact" in self.asked and gguf is not None:
            try:
                exact = float32_gguf(gguf)
            except (OSError, ValueError, KeyError) as error:
                raise LlamaCppUnavailable(f"no float32 copy of {gguf.name}: {error}") from error
        self.llama = open_llamacpp(
            gguf,
            context_length=self.pair.context_length,
            draft_tokens=self.options.settings.gamma,
            end_tokens=self.pair.eos_token_ids,
            threads=torch.get_num_threads(),
            quantized="llamacpp" in self.asked,
            exact=exact,
        )
        return self.llama

    def not_loaded(self) -> dict[str, str]:
        """The opened peer's methods that did not load, with the reason."""
        llama = self.llama
        if llama is None or llama.exact is None or llama.exact_flash is not None:
            return {}
        return {LLAMACPP_EXACT_FLASH: f"flash attention did not load ({llama.exact_flash_problem})"}

    def run(self, method: Method, ids: list[int], budget: int, seed: int) -> MethodRun:
        """Time one llama.cpp method on one prompt's ids with a budget of new tokens."""
        if self.llama is None:
            raise BenchError("the llama.cpp peer is not loaded (open_llamacpp_peer first)")
        llama = self.llama
        processor = self.options.processor
        tokens, seconds = timed(
            self.pair.device,
            lambda: llama.generate(ids, budget, processor, seed, which=method.name),
        )
        return peer_run(method, tokens, seconds, self.pair)
