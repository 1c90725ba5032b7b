"""The llama.cpp peer: the target's own GGUF file run by llama-cpp-python.

Most people who run a small model on a CPU run it with llama.cpp, so `bench
--peers llamacpp` times it on the same prompt ids, token budget, end tokens
and decoding rule as specrepl: plain decoding, and the binding's own
prompt-lookup speculative decoding (`LlamaPromptLookupDecoding`, drafting
gamma tokens), each with as many threads as torch uses.

llama-cpp-python is optional and has no wheel on PyPI: `bash scripts/setup.sh`
builds it (see `engine/llamacpp.py`). `open_llamacpp` raises `LlamaCppUnavailable` with the
reason (not installed, no GGUF file, does not load) and the benchmark reports
the peer as unavailable instead of failing.

llama.cpp computes with the file's quantized weights (8-bit activations for
its 4-bit dot products), whereas specrepl runs the de-quantized weights in
float32, so greedy texts may part after a while: the benchmark reports how
many prompts match token for token, as for every peer.

The file of the target's exact weights is opened twice: with llama-cpp-python's
own default (flash attention off) and with flash attention on (what
llama.cpp's own programs choose on a CPU when left to decide). Which is faster
depends on the machine and the prompt (a long prompt reads faster with it;
one-token steps after a long context may not), so the benchmark runs both and
measures speedups over the faster of the two on each prompt.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specrepl.engine.llamacpp import INSTALL_HINT, LlamaCppUnavailable, import_llamacpp, open_gguf
from specrepl.engine.processors import LogitsProcessor

__all__ = [
    "INSTALL_HINT",
    "LlamaCpp",
    "LlamaCppUnavailable",
    "open_flash",
    "open_llamacpp",
    "sampling_options",
]


def sampling_options(processor: LogitsProcessor) -> dict[str, Any]:
    """llama-cpp-python's sampler options for specrepl's decoding rule: greedy is
    temperature 0; otherwise temperature, top-k (0: off) and top-p, with the
    binding's other default filters (min-p 0.05, repeat penalty) switched off."""
    options: dict[str, Any] = {"min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}
    if processor.is_greedy:
        return {**options, "temp": 0.0, "top_k": 1, "top_p": 1.0}
    parameters = processor.parameters()
    return {
        **options,
        "temp": float(parameters.get("temperature", 1.0)),
        "top_k": int(parameters.get("top_k", 0)),
        "top_p": float(parameters.get("top_p", 1.0)),
    }


@dataclass
class LlamaCpp:
    """The loaded GGUF files: `plain` decodes the target's file one token per
    step, `lookup` (built with the binding's prompt-lookup draft model)
    verifies drafts in batches, `exact` decodes the file of the target's exact
    weights one token per step and `exact_flash` does so with flash attention;
    each None where not asked for (`exact_flash` also where it did not load:
    `exact_flash_problem` says why)."""

    plain: Any
    lookup: Any
    version: str
    end_tokens: frozenset[int] = field(default_factory=frozenset)
    exact: Any = None
    exact_flash: Any = None
    exact_flash_problem: str | None = None

    def generate(
        self,
        ids: Sequence[int],
        budget: int,
        processor: LogitsProcessor,
        seed: int,
        *,
        which: str = "llamacpp",
    ) -> list[int]:
        """Up to `budget` new tokens after `ids` from the model `which` names
        ("llamacpp", "llamacpp_lookup", "llamacpp_exact", "llamacpp_exact_flash"),
        ending after an end token.

        The model state is reset first, so that no run reuses the previous
        run's cached prompt (llama-cpp-python would otherwise match prefixes).
        """
        model = {
            "llamacpp_lookup": self.lookup,
            "llamacpp_exact": self.exact,
            "llamacpp_exact_flash": self.exact_flash,
        }.get(which, self.plain)
        if model is None:
            raise LlamaCppUnavailable(f"{which} was not loaded")
        model.reset()
        model.set_seed(seed)
        tokens: list[int] = []
        for token in model.generate(list(ids), **sampling_options(processor)):
            tokens.append(int(token))
            if int(token) in self.end_tokens or len(tokens) >= budget:
                break
        return tokens


def open_llamacpp(
    path: Path | None,
    *,
    context_length: int,
    draft_tokens: int,
    end_tokens: Iterable[int],
    threads: int | None = None,
    quantized: bool = True,
    exact: Path | None = None,
) -> LlamaCpp:
    """Load the GGUF file twice (plain and with prompt lookup; unless not
    `quantized`), and the file of the target's exact weights `exact` twice
    (flash attention off and on) where given, or raise `LlamaCppUnavailable`
    saying why it cannot run here."""
    plain = lookup = None
    if quantized:
        plain, lookup = _open_with_lookup(path, context_length, draft_tokens, threads)
    elif exact is None:
        raise LlamaCppUnavailable(
            "it runs a GGUF file and the model was not loaded from one "
            "(use the embedded model or a .gguf file)"
        )
    llama_cpp = import_llamacpp()
    opened = LlamaCpp(
        plain=plain,
        lookup=lookup,
        version=str(getattr(llama_cpp, "__version__", "unknown")),
        end_tokens=frozenset(int(token) for token in end_tokens),
    )
    if exact is not None:
        opened.exact = open_gguf(exact, context_length=context_length, threads=threads)
        opened.exact_flash, opened.exact_flash_problem = open_flash(
            exact, context_length=context_length, threads=threads
        )
    return opened


def open_flash(
    path: Path, *, context_length: int, threads: int | None = None
) -> tuple[Any, str | None]:
    """The GGUF file at `path` with flash attention on, and None; or None and
    why it did not load (a build without it: the plain run is still measured)."""
    try:
        return open_gguf(
            path, context_length=context_length, threads=threads, flash_attn=True
        ), None
    except LlamaCppUnavailable as error:
        return None, str(error)


def _open_with_lookup(
    path: Path | None, context_length: int, draft_tokens: int, threads: int | None
) -> tuple[Any, Any]:
    plain = open_gguf(path, context_length=context_length, threads=threads)
    try:
        speculative = importlib.import_module("llama_cpp.llama_speculative")
    except Exception as error:  # a broken build fails in many ways, all of them here
        raise LlamaCppUnavailable(f"llama-cpp-python does not import: {error}") from error
    # A draft model makes the binding keep every position's logits, but it sizes
    # its logits array by the argument: without logits_all=True, a prompt
    # longer than one batch (512 tokens) overflows it (0.3.36).
    lookup = open_gguf(
        path,
        context_length=context_length,
        threads=threads,
        draft_model=speculative.LlamaPromptLookupDecoding(num_pred_tokens=draft_tokens),
        logits_all=True,
    )
    return plain, lookup
