"""Loading a target and a drafter model into a checked, ready-to-decode pair.

A model source (`sources.py`) is "embedded" (`embedded.py`), a path to a
`.gguf` file, a local model directory or a Hugging Face hub id. GGUF files go
through their converted copy (`gguf.py`); every model gets its own dtype
(`devices.py`) and optional bitsandbytes quantization (`quantization.py`),
lands on one device in eval mode (or, given a device map, memory caps or an
offload folder, where transformers and accelerate place it, by a plan
checked before loading: `placement.py`), and the pair is refused before any
generation unless both models read one vocabulary (`pair.py`). Each loaded
model comes with its `Tuning` (`loaded.py`).

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
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from specrepl.models import gguf as gguf_cache
from specrepl.models.devices import dtype_name, resolve_device, resolve_dtype
from specrepl.models.embedded import EMBEDDED
from specrepl.models.errors import ModelLoadError, first_line
from specrepl.models.loaded import LoadedModel
from specrepl.models.pair import ModelPair
from specrepl.models.placement import plan_placement
from specrepl.models.quantization import quantization_options
from specrepl.models.sources import Source, classify, has_tokenizer_files, hub_reachable
from specrepl.models.specs import ModelSpec
from specrepl.store.paths import offload_dir

__all__ = ["Progress", "load_pair"]

Progress = Callable[[str], None]


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
    for GGUF files, the same converted copy. A drafter with a tokenizer of
    its own drafts across the two (`vocabularies.match_vocabularies`, which
    the pair's `vocabulary` describes). Raises ModelLoadError, or
    IncompatibleTokenizersError when a model's logits do not cover its
    tokenizer or the drafter's tokenizer cannot write the target's text.
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
        report("comparing the target's and the drafter's tokenizers…")
    return ModelPair.assemble(target_loaded, drafter_loaded, tokenizer, drafter_tokenizer)


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
        tokenizer_from: tuple[Source, PreTrainedTokenizerBase] | None = None,
    ) -> tuple[LoadedModel, PreTrainedTokenizerBase | None, Source]:
        """Load one model and its own tokenizer (None: a drafter directory without one).

        `tokenizer_from` is the target's source and tokenizer, reused when the
        drafter comes from the same files.
        """
        source = classify(spec.source)
        dtype = resolve_dtype(spec.dtype, self.device)
        start = time.perf_counter()
        with _quiet():
            files, from_cache, offline = self._files(source)
            details = ", ".join(filter(None, (dtype_name(dtype), spec.quantize)))
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
        self, spec: ModelSpec, source: Source, role: str, dtype: torch.dtype
    ) -> PreTrainedModel:
        """The model of `spec` alone, loaded as `load` loads it (a GGUF file from
        its converted copy, converted again if the copy is gone or damaged)."""
        with _quiet():
            files, _, offline = self._files(source)
            return self._model(spec, source, role, files, offline, dtype)

    def _model(
        self,
        spec: ModelSpec,
        source: Source,
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
            **self._model_options(spec, role, files, offline, dtype),
        )

    def _tokenizer_and_model(
        self,
        spec: ModelSpec,
        source: Source,
        role: str,
        files: str,
        offline: bool,
        dtype: torch.dtype,
        tokenizer_from: tuple[Source, PreTrainedTokenizerBase] | None,
    ) -> tuple[PreTrainedTokenizerBase | None, Any]:
        if tokenizer_from is not None and tokenizer_from[0] == source:
            tokenizer: PreTrainedTokenizerBase | None = tokenizer_from[1]
        else:
            tokenizer = self._tokenizer(spec, source, role, files, offline)
        return tokenizer, self._model(spec, source, role, files, offline, dtype)

    def _files(self, source: Source) -> tuple[str, bool, bool]:
        """What to pass to from_pretrained, whether it is a cached GGUF copy, and offline."""
        if source.gguf is not None:
            try:
                copy = gguf_cache.converted_copy(source.gguf, progress=self.progress)
            except Exception as exc:  # anything the GGUF parser raises means the same
                raise ModelLoadError(
                    f"could not convert the GGUF file {source.gguf}: {first_line(exc)}"
                ) from exc
            return str(copy.directory), copy.from_cache, False
        if source.kind == "hub":
            return source.location, False, not self.hub_online()
        return source.location, False, False

    def _tokenizer(
        self, spec: ModelSpec, source: Source, role: str, files: str, offline: bool
    ) -> PreTrainedTokenizerBase | None:
        if source.kind == "directory" and not has_tokenizer_files(Path(files)):
            if role == "target":
                raise ModelLoadError(
                    f"{files} has no tokenizer files (tokenizer.json, tokenizer_config.json, "
                    "tokenizer.model): the target's tokenizer is the one the pair decodes with"
                )
            return None
        return self._call(spec, source, role, AutoTokenizer.from_pretrained, files, offline)

    def _model_options(
        self, spec: ModelSpec, role: str, files: str, offline: bool, dtype: torch.dtype
    ) -> dict[str, Any]:
        """The whole model on the pair's device, or, for a placed spec, the
        device map planned and checked before any weight is read
        (`placement.plan_placement`), which transformers and accelerate follow."""
        if not spec.placed:
            return {
                "dtype": dtype,
                "device_map": {"": str(self.device)},
                **quantization_options(spec.quantize, dtype),
            }
        plan = plan_placement(
            spec,
            role,
            files,
            dtype,
            trust_remote_code=self.trust_remote_code,
            offline=offline,
            default_folder=offload_dir() / role,
        )
        return {
            "dtype": dtype,
            "device_map": plan.device_map,
            "offload_folder": plan.offload_folder,
        }

    def _call(
        self,
        spec: ModelSpec,
        source: Source,
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
            self._hub_online = hub_reachable()
        return self._hub_online


def _explain(exc: BaseException, spec: ModelSpec, source: Source, role: str) -> ModelLoadError:
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
    return ModelLoadError(f"could not load the {role} {name}: {first_line(exc)}")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence transformers', huggingface_hub's and accelerate's progress bars, warnings
    and logs."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    bars_on = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    verbosity = hf_logging.get_verbosity()
    hub_logger = logging.getLogger("huggingface_hub")
    hub_level = hub_logger.level
    # accelerate says which parts it offloaded; the load table says it instead
    accelerate_logger = logging.getLogger("accelerate")
    accelerate_level = accelerate_logger.level
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    hub_logger.setLevel(logging.ERROR)
    accelerate_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        accelerate_logger.setLevel(accelerate_level)
        hub_logger.setLevel(hub_level)
        hf_logging.set_verbosity(verbosity)
        if bars_on:
            hf_logging.enable_progress_bar()
        if hub_bars_off:
            hub_utils.disable_progress_bars()
        elif hub_utils.are_progress_bars_disabled():
            hub_utils.enable_progress_bars()


def _as_spec(spec: ModelSpec | str) -> ModelSpec:
    return spec if isinstance(spec, ModelSpec) else ModelSpec(spec)


def _ignore(message: str) -> None:
    """The progress sink used when the caller gives none."""
