"""The one drafter builder: a drafter spec and the loaded models in, a drafter out.

Every entry point (the REPL's session, `bench`, `soak`, `replay`, scripts,
the library API) builds its drafter here, so the same settings give the same
drafter: the same kind, runtime, dtype and cache policy. A `DrafterSpec` holds
everything that decides the drafter apart from the loaded models (the drafter
options, whether caches are used and kept between prompts, whether the
drafter model is a copy of the target); `build_drafter` puts it together over
the target, the drafter model, the draft head and the chosen runtime.
`load_drafter_head` loads a draft head as every entry point drafts with it
(in the dtype that drafts fastest on a CPU); `runtime.choose_drafter_runtime`
chooses what runs the drafter model.

When a drafter is built again or kept (a chat's turns) is the caller's
business: this module keeps nothing and knows nothing of settings, flags or
chats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.draft_head import DraftHead, fastest_dtype
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import load_head, locate_head
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DRAFTER_KINDS, DrafterOptions, names_auto_head
from specrepl.engine.drafters.runtime import RuntimeChoice
from specrepl.engine.drafters.translated import TranslatedDrafter, Translation
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.tuning import Tuning

__all__ = ["DrafterSpec", "build_drafter", "load_drafter_head"]

HEAD_DTYPES = (torch.float32, torch.bfloat16)
"""The dtypes a float32 draft head on a CPU is timed in (`load_drafter_head`)."""


@dataclass(frozen=True)
class DrafterSpec:
    """Everything but the loaded models that decides which drafter is built.

    `options`: the kind and its options. `use_cache`: the drafter keeps a KV
    cache (as the target does). `keep_between_prompts`: a model or head
    drafter keeps its cache from one generation to the next (a chat; the
    n-gram drafter's counts follow `options.keep` instead). `copy_of_target`:
    the drafter model is a copy of the target (`model.is_copy_of`; a loaded
    pair knows it as `drafter_is_copy`), so with the cache on the model
    drafter takes the target's keys and values instead of reading for itself.
    """

    options: DrafterOptions = field(default_factory=DrafterOptions)
    use_cache: bool = True
    keep_between_prompts: bool = False
    copy_of_target: bool = False


def build_drafter(
    spec: DrafterSpec,
    *,
    target: PreTrainedModel | None = None,
    model: PreTrainedModel | None = None,
    head: DraftHead | None = None,
    runtime: RuntimeChoice | None = None,
    target_tuning: Tuning | None = None,
    model_tuning: Tuning | None = None,
    target_runnable: RunnableModel | None = None,
    translation: Translation | None = None,
) -> Drafter:
    """The drafter `spec` describes. `model` is the drafter model, needed by
    the `model` kind and by `hybrid` without a head, unless `runtime` runs it
    in llama.cpp (a `RuntimeChoice` with `llama` set; one for torch, or None,
    drafts with `model` in torch). `head` is the loaded draft head, needed by
    the `head` kind and by `hybrid` with one. `target` gives the llama.cpp
    drafter, for a copy, the target's keys and values, and `target_tuning`
    (the target's `Tuning`) its read window, from the target's timed step.
    `model_tuning` is the drafter model's, which a torch model drafter runs
    with. `target_runnable` is what verifies, where the caller knows it: its
    own measured one-token step sets the read window; a llama.cpp target
    hands a copy in llama.cpp its keys and values from its own context, and a
    torch copy none (it reads for itself). `translation` (a drafter model
    with another tokenizer: `ModelPair.translation`) puts the model drafter
    behind a `TranslatedDrafter`. Raises ValueError for an unknown kind or a
    missing model or head."""
    step = None if target_tuning is None else target_tuning.one_token_step
    if target_runnable is not None:
        step = target_runnable.one_token_seconds()
    options = spec.options
    if options.kind == "ngram":
        return NgramDrafter(
            options.order, keep_between_prompts=options.keep, top_k_filler=options.filler
        )
    if options.kind == "lookup":
        return LookupDrafter(options.max_ngram)
    if options.kind not in DRAFTER_KINDS:
        raise ValueError(
            f"unknown drafter kind {options.kind!r}; choose one of: {', '.join(DRAFTER_KINDS)}"
        )
    if options.needs_head:
        drafter = _head_drafter(spec, head)
    else:
        drafter = _model_drafter(
            spec, (target, target_runnable), model, runtime, step, model_tuning
        )
        if translation is not None:
            drafter = TranslatedDrafter(drafter, translation)
    if options.kind == "hybrid":
        return HybridDrafter(drafter, LookupDrafter(options.max_ngram), min_match=options.min_match)
    return drafter


def _head_drafter(spec: DrafterSpec, head: DraftHead | None) -> Drafter:
    if head is None:
        raise ValueError(f"the {spec.options.kind} drafter needs a draft head, and none is loaded")
    return HeadDrafter(head, keep_between_prompts=spec.keep_between_prompts)


def _model_drafter(
    spec: DrafterSpec,
    targets: tuple[PreTrainedModel | None, RunnableModel | None],
    model: PreTrainedModel | None,
    runtime: RuntimeChoice | None,
    target_step_seconds: float | None,
    model_tuning: Tuning | None,
) -> Drafter:
    """The drafter model's drafter: in llama.cpp where `runtime` runs it there
    (its read window from the target's measured one-token step), else in
    torch with the drafter model's tuning. `targets`: the target model and
    what verifies with it (None: the model, in torch)."""
    target, target_runnable = targets
    if runtime is not None:
        elsewhere = runtime.model_drafter(
            spec.options,
            target,
            keep_between_prompts=spec.keep_between_prompts,
            copy_of_target=spec.copy_of_target and spec.use_cache,
            target_step_seconds=target_step_seconds,
            target_runnable=target_runnable,
        )
        if elsewhere is not None:
            return elsewhere
    if model is None:
        raise ValueError(
            f"the {spec.options.kind} drafter needs a drafter model, and none is loaded"
        )
    return ModelDrafter(
        model,
        use_cache=spec.use_cache,
        window=spec.options.window or None,
        keep_between_prompts=spec.keep_between_prompts,
        copy_of_target=spec.copy_of_target
        and (target_runnable is None or target_runnable.gives_key_values),
        tuning=model_tuning,
    )


def load_drafter_head(name: str, target: PreTrainedModel) -> tuple[DraftHead, dict[str, Any]]:
    """The draft head `name` names (a directory, "embedded", or "auto": one trained
    for `target`, `head_store.locate_head`), bound to `target`, and its
    description, with the "path" it was loaded from. A float32 head on a CPU
    drafts in the dtype of `HEAD_DTYPES` timed fastest here (the description then
    says which, with the seconds per drafted token of each). Raises HeadLoadError
    (`head_store`) when the head cannot be used with this target."""
    directory = locate_head(name, target)
    # "auto" found the head by the target's fingerprint: computing it again costs a pass
    # over every parameter at start-up
    head, description = load_head(directory, target, check_fingerprint=not names_auto_head(name))
    description = {**description, "path": str(directory)}
    if head.output_rows.device.type == "cpu" and head.output_rows.dtype == torch.float32:
        best, timed = fastest_dtype(head, HEAD_DTYPES)
        head.to(best)
        description = {
            **description,
            "dtype": str(best).removeprefix("torch."),
            "draft_seconds": timed,
        }
    return head, description
