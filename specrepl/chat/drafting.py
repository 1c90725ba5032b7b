"""What a chat keeps of its drafting from turn to turn, around the one drafter builder.

`ChatDrafters` holds, for one `ChatSession`: the drafter, with its cache,
while the settings that decide it stay the same; the n-gram counts while
`ngram_keep` is on; the gamma policy with what it has learnt; each draft head,
loaded once; and what runs the drafter model, chosen once per runtime asked
for. It decides when a drafter reads its prompt afresh (`spec`), and drops the
drafter's torch model from memory while nothing the settings enable needs it
(`release_unneeded`). Building is `builder.build_drafter`'s, from the
`DrafterSpec` the settings give, so `bench` builds the same drafter from the
same settings.

The session's kept caches are shared with it: the speculative run's target
cache starts afresh with a new drafter, and the drafter-alone run's cache
(which holds the drafter model) goes when the model is released.

A hybrid whose head is "auto" drafts with the head trained for the target or
with the drafter model, whichever `draft_choice` timed faster here: chosen
once per requested runtime (and stored across starts), and every method
below reads the settings with that choice made (`settled`).

It never prints and knows nothing of prompts, history or the terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specrepl.chat.answers import GeneratorName
from specrepl.chat.draft_choice import DraftChoice, choice_key, choose_draft_source
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.builder import DrafterSpec, build_drafter, load_drafter_head
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head_store import HeadLoadError
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.drafters.runtime import RuntimeChoice, choose_drafter_runtime
from specrepl.engine.gamma import GammaPolicy
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.runtime import RunnableModel
from specrepl.engine.static_runtime import StaticRuntimeRefused
from specrepl.models.errors import ModelLoadError
from specrepl.store.paths import draft_choices_file

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specrepl.models.pair import ModelPair

__all__ = [
    "ChatDrafters",
    "build_pair_drafter",
    "choose_hybrid_source",
    "drafter_runtime",
    "drafter_spec",
    "keeps_drafter_state",
]


@dataclass(frozen=True)
class _BuiltFrom:
    """What a kept drafter was built from (the loaded parts by identity): while
    it stays the same, the drafter and its cache are kept."""

    spec: DrafterSpec
    model: int
    head: int
    runtime: int
    target: int


class ChatDrafters:
    """The drafters of one chat session over `pair`, sharing the session's kept `caches`."""

    def __init__(
        self,
        pair: ModelPair,
        caches: dict[GeneratorName, PromptCache],
        target: Callable[[Settings], RunnableModel] | None = None,
    ) -> None:
        self.pair = pair
        self._caches = caches
        self._target = target
        """What verifies under given settings (the session's `ChatTarget.runnable`)."""
        self._heads: dict[str, tuple[DraftHead, dict[str, Any]]] = {}
        self._runtimes: dict[str, RuntimeChoice | None] = {}
        self._choices: dict[str, DraftChoice] = {}
        self._ngram: NgramDrafter | None = None
        self._kept: tuple[_BuiltFrom, Drafter] | None = None
        self._kept_policy: tuple[tuple[Any, ...], GammaPolicy] | None = None

    # -- the drafter ---------------------------------------------------------

    def spec(self, settings: Settings) -> DrafterSpec:
        """The drafter `settings` ask for in this chat (`drafter_spec` on the
        `settled` settings, kept between turns as `keeps_drafter_state` says)."""
        settings = self.settled(settings)
        return drafter_spec(settings, self.pair, keep_between_prompts=keeps_drafter_state(settings))

    def drafter(self, settings: Settings, target: RunnableModel | None = None) -> Drafter:
        """The drafter the settings ask for, for verification by `target` (the
        session's `ChatTarget.runnable`): the kept one (with its cache) while
        the spec and what it is built over stay the same; another one starts
        empty, and so does the speculative run's target cache."""
        settings = self.settled(settings)
        spec = self.spec(settings)
        if spec.options.kind == "ngram":
            return self._ngram_drafter(spec, keep=settings.ngram_keep)
        model = self.model() if self.drafts_in_torch(settings) else None
        loaded = self.head(settings) if spec.options.needs_head else None
        head = None if loaded is None else loaded[0]
        runtime = self.runtime(settings)
        built = _BuiltFrom(spec, id(model), id(head), id(runtime), id(target))
        if self._kept is not None and self._kept[0] == built:
            return self._kept[1]
        drafter = build_pair_drafter(
            spec, self.pair, model=model, head=head, runtime=runtime, target=target
        )
        self._caches["speculative"].drop()
        self._kept = (built, drafter)
        return drafter

    def _ngram_drafter(self, spec: DrafterSpec, *, keep: bool) -> Drafter:
        """The n-gram drafter, whose counts persist while `keep` is on and its orders stay."""
        kept = self._ngram
        orders = (spec.options.order, spec.options.filler)
        if kept is None or not keep or (kept.max_order, kept.top_k_filler) != orders:
            built = build_drafter(spec)
            assert isinstance(built, NgramDrafter)
            kept = self._ngram = built
        return kept

    def policy(self, settings: Settings, drafter: Drafter) -> GammaPolicy:
        """The gamma policy the settings ask for, kept with what it has learnt of
        the drafter's sources and of the target's costs from turn to turn while
        the drafter and the policy's settings stay the same."""
        key = (id(drafter), settings.gamma_policy, settings.gamma, settings.confidence)
        if self._kept_policy is None or self._kept_policy[0] != key:
            self._kept_policy = (key, settings.gamma_policy_object())
        return self._kept_policy[1]

    def forget_drafter(self) -> None:
        """Build the drafter afresh for the next turn (its cache went with the chat's)."""
        self._kept = None

    def forget_counts(self) -> None:
        """Drop the n-gram counts kept between prompts (they belong to the history)."""
        self._ngram = None

    # -- what it is built over -----------------------------------------------

    def runtime(self, settings: Settings) -> RuntimeChoice | None:
        """What runs the drafter model under `settings` (None: no model drafts),
        chosen once per requested runtime (`runtime.choose_runtime`: "auto"
        times the runtimes here, ~0.5 s on a CPU). Raises SettingError when
        llama.cpp or the static runtime is asked for and cannot run it."""
        options = settings.drafter_options()
        drafter = self.pair.drafter
        if not options.needs_model or drafter is None:
            return None
        key = _runtime_key(options)
        if key not in self._runtimes:
            self._runtimes[key] = drafter_runtime(options, self.pair)
        return self._runtimes[key]

    # -- a hybrid's head "auto": the head or the model, by timing ----------------

    def settled(self, settings: Settings, *, choose: bool = True) -> Settings:
        """`settings` with a hybrid's head "auto" replaced by what drafts: the
        directory of the head found for the target, or no head (the model).
        `choose`: time the two now if that was not done for these settings'
        runtime (`choice`); without it an unchosen "auto" is returned as it is
        (it counts as needing the model)."""
        options = settings.drafter_options()
        if not options.chooses_head:
            return settings
        choice = self.choice(settings) if choose else self._choices.get(_choice_key(settings))
        return settings if choice is None else choice.settle(settings)

    def choice(self, settings: Settings, *, retime: bool = False) -> DraftChoice:
        """Whether a hybrid with head "auto" drafts with the head found for the
        target or with the drafter model under `settings`: timed once per
        requested runtime (`draft_choice.choose_draft_source`, stored across
        starts; `retime`: timed again now). The model when no head was trained
        for this target, the head when no drafter model is loaded."""
        key = _choice_key(settings)
        if key in self._choices and not retime:
            return self._choices[key]
        choice, _ = choose_hybrid_source(
            settings,
            self.pair,
            self.runtime(settings),
            load_head=lambda: self.head(settings),
            retime=retime,
            target=None if self._target is None else self._target(settings),
        )
        self._choices[key] = choice
        self.forget_drafter()  # the timing drafted with llama.cpp's one state
        return choice

    def choice_summary(self, settings: Settings) -> str | None:
        """What a hybrid with head "auto" drafts with and why, once chosen (None
        before, or for other drafters)."""
        options = settings.drafter_options()
        choice = self._choices.get(_choice_key(settings))
        return None if choice is None or not options.chooses_head else choice.describe()

    def runtime_summary(self, settings: Settings) -> str | None:
        """What runs the drafter model and why, once chosen (None before the
        first speculative run, or when no model drafts)."""
        chosen = self.choice_summary(settings)
        settings = self.settled(settings, choose=False)
        options = settings.drafter_options()
        choice = self._runtimes.get(_runtime_key(options))
        if choice is None or not options.needs_model:
            return None
        return choice.describe() + ("" if chosen is None else f"; {chosen}")

    def check_head(self, settings: Settings) -> None:
        """Load the draft head the settings ask for, if any (HeadLoadError if it
        cannot be used with this target; SettingError if none is named)."""
        options = settings.drafter_options()
        if options.chooses_head:
            return  # without a head for this target, the hybrid drafts with the model
        if options.kind == "head" and options.head is None:
            raise SettingError(
                "the head drafter needs a draft head: /drafter_kind head PATH (or embedded, the "
                "head shipped for the embedded model); `python infer.py distill` trains one"
            )
        if options.needs_head:
            self.head(settings)

    def head(self, settings: Settings) -> tuple[DraftHead, dict[str, Any]] | None:
        """The settings' draft head and its description, loaded once per directory
        (`builder.load_drafter_head`)."""
        name = settings.drafter_head
        if name is None:
            return None
        if name not in self._heads:
            loaded = load_drafter_head(name, self.pair.target.model)
            self._heads[name] = loaded
            self._heads.setdefault(str(loaded[1]["path"]), loaded)  # as `settled` names it
        return self._heads[name]

    def head_summary(self, settings: Settings) -> dict[str, Any] | None:
        """The draft head that drafts under the settings (its description and
        "path", and "chosen": why, for a hybrid's head "auto"), if one is loaded."""
        chosen = self.choice_summary(settings)
        settings = self.settled(settings, choose=False)
        if not settings.drafter_options().needs_head:
            return None
        name = settings.drafter_head
        if name is None or name not in self._heads:
            return None
        description = self._heads[name][1]
        return description if chosen is None else {**description, "chosen": chosen}

    # -- the drafter's torch model --------------------------------------------

    def model(self) -> Any:
        """The drafter's torch model, loaded again first if it was released."""
        if self.pair.drafter is None:
            raise SettingError("no drafter model is loaded")
        return self.pair.drafter.model

    def ready(self, settings: Settings) -> None:
        """Choose the drafter's runtime under `settings` and load the drafter's
        torch model again now (not in the next answer) if they need it and it
        was released. Raises SettingError when llama.cpp is asked for and
        cannot run, or the model cannot be loaded again."""
        try:
            self.runtime(settings)
            if settings.speculative and settings.drafter_options().chooses_head:
                self.choice(settings)
            if self.needs_torch_model(settings):
                self.model()
        except ModelLoadError as error:
            raise SettingError(f"the drafter model cannot be loaded again: {error}") from None

    def drafts_in_torch(self, settings: Settings) -> bool:
        """Whether the speculative drafter `settings` ask for runs the drafter's
        torch model: a drafter that needs the model, unless llama.cpp runs it."""
        settings = self.settled(settings, choose=False)
        if not settings.drafter_options().needs_model:
            return False
        runtime = self.runtime(settings)
        return runtime is None or runtime.llama is None

    def runs_torch_model(self, settings: Settings) -> bool:
        """Whether anything `settings` enable runs the drafter's torch model, the
        drafter's runtime chosen first where that decides it (`runtime`; raises
        SettingError when llama.cpp is asked for and cannot run)."""
        if self.pair.drafter is None:
            return False
        return settings.drafter_gen or (settings.speculative and self.drafts_in_torch(settings))

    def needs_torch_model(self, settings: Settings) -> bool:
        """Whether anything `settings` enable runs the drafter's torch model: the
        drafter-alone run, or a speculative drafter that needs the model and
        drafts in torch or has no runtime chosen yet ("auto" times a torch step).
        Chooses nothing."""
        if self.pair.drafter is None:
            return False
        if settings.drafter_gen:
            return True
        options = self.settled(settings, choose=False).drafter_options()
        if not (settings.speculative and options.needs_model):
            return False
        choice = self._runtimes.get(_runtime_key(options))
        return choice is None or choice.llama is None

    def release_unneeded(self, settings: Settings) -> None:
        """Drop the drafter's torch model from memory while nothing `settings`
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
            or self.needs_torch_model(settings)
        ):
            return
        self._caches["drafter"].drop()
        if self._kept is not None and self._kept[0].model == id(model):
            self._kept = None
        del model
        drafter.release()


def drafter_spec(
    settings: Settings, pair: ModelPair, *, keep_between_prompts: bool = False
) -> DrafterSpec:
    """The drafter `settings` ask for on `pair`: what the REPL's session and
    `bench` both hand to `builder.build_drafter`, so the same settings give the
    same drafter. `keep_between_prompts`: the drafter serves a chat's turns
    and keeps its cache from one to the next (`keeps_drafter_state`)."""
    return DrafterSpec(
        settings.drafter_options(),
        use_cache=settings.use_cache,
        keep_between_prompts=keep_between_prompts,
        copy_of_target=pair.drafter_is_copy,
    )


def build_pair_drafter(
    spec: DrafterSpec,
    pair: ModelPair,
    *,
    model: PreTrainedModel | None,
    head: DraftHead | None = None,
    runtime: RuntimeChoice | None = None,
    target: RunnableModel | None = None,
) -> Drafter:
    """`builder.build_drafter` over `pair`'s target and both models' tunings,
    with the drafter `model` (None where torch does not draft with it, so that
    a released model is not loaded again for nothing), the loaded `head`, the
    chosen `runtime` and the `target` that verifies (`ChatTarget.runnable`; a
    llama.cpp target hands a copy no keys and values). The REPL's session and
    `bench` both build here."""
    return build_drafter(
        spec,
        target=pair.target.model,
        model=model,
        head=head,
        runtime=runtime,
        target_tuning=pair.target.tuning,
        model_tuning=None if pair.drafter is None else pair.drafter.tuning,
        target_runnable=target,
        translation=pair.translation,
    )


def choose_hybrid_source(
    settings: Settings,
    pair: ModelPair,
    runtime: RuntimeChoice | None,
    *,
    load_head: Callable[[], tuple[DraftHead, dict[str, Any]] | None] | None = None,
    retime: bool = False,
    target: RunnableModel | None = None,
) -> tuple[DraftChoice, DraftHead | None]:
    """Whether the hybrid `settings` ask for, with head "auto", drafts faster on
    `pair` with the head trained for the target (`load_head` gives it; default:
    `load_drafter_head("auto", ...)`) or with the drafter model (in llama.cpp
    where `runtime` runs it there), and that head. Both hybrids are built here
    as every entry point builds them and timed by
    `draft_choice.choose_draft_source`, which keeps the verdict in the store
    (`retime`: timed again now). Without a head for this target the model
    drafts; without a drafter model the head does. Where the target that
    verifies (`target`) gives no features, the head cannot draft and the
    model does, untimed. Both are timed over `target` (default: the target in
    torch), and the verdict is kept per runtime of the target."""
    if target is not None and not target.gives_features and pair.drafter is not None:
        why = target.features_problem
        note = "the target's runtime gives the head no features" + (f": {why}" if why else "")
        return DraftChoice(False, note=note), None
    if load_head is None:
        load_head = lambda: load_drafter_head("auto", pair.target.model)  # noqa: E731
    model = pair.drafter.model if pair.drafter is not None and _in_torch(runtime) else None
    try:
        loaded = load_head()
    except HeadLoadError as error:
        return DraftChoice(False, note=str(error)), None
    if loaded is None:
        return DraftChoice(False, note="no draft head is named"), None
    head, description = loaded
    path = str(description["path"])
    if pair.drafter is None:
        return DraftChoice(True, head_path=path, note="no drafter model is loaded"), head

    def build(with_head: bool) -> Drafter:
        chosen = settings.updated(drafter_head=path if with_head else None)
        return build_pair_drafter(
            drafter_spec(chosen, pair),
            pair,
            model=None if with_head else model,
            head=head,
            runtime=runtime,
            target=target,
        )

    runtime_name = "torch" if runtime is None else runtime.runtime
    if target is not None and target.runtime_name != "torch":
        runtime_name += f", target in {target.runtime_name}"
    key = choice_key(pair, settings, Path(path), runtime_name)
    choice = choose_draft_source(
        pair, settings, build, key, store=draft_choices_file(), retime=retime, target=target
    )
    return replace(choice, head_path=path), head


def drafter_runtime(options: DrafterOptions, pair: ModelPair) -> RuntimeChoice | None:
    """What runs `pair`'s drafter model for the drafter `options` describe
    (`runtime.choose_drafter_runtime`, a static cache as long as the pair's
    context); SettingError saying why where a forced runtime cannot run it."""
    drafter = pair.drafter
    if not options.needs_model or drafter is None:
        return None  # nothing loaded for nothing
    try:
        return choose_drafter_runtime(
            options, drafter.model, drafter.gguf, context_length=pair.context_length
        )
    except LlamaCppUnavailable as error:
        raise SettingError(f"the drafter cannot run in llama.cpp: {error}") from None
    except StaticRuntimeRefused as error:
        raise SettingError(f"the static runtime cannot run the drafter: {error}") from None


def _in_torch(runtime: RuntimeChoice | None) -> bool:
    """Whether the drafter model drafts in torch under `runtime` (eagerly or over
    a static cache; not llama.cpp)."""
    return runtime is None or runtime.llama is None


def keeps_drafter_state(settings: Settings) -> bool:
    """Whether a chat's model or head drafter keeps its cache from turn to turn
    under `settings`: only with the cache on and greedy. When sampling it reads
    the prompt afresh each turn: a bf16 drafter's cache filled token by token
    rounds differently from one filled at once, and a sampled draft, unlike a
    greedy one, follows every change of its q, so a seeded answer would no
    longer repeat a fresh session's token for token (a copy of the target reads
    no prompt at all: it takes the target's keys and values)."""
    return settings.use_cache and settings.logits_processor().is_greedy


def _choice_key(settings: Settings) -> tuple[str, str]:
    """What a hybrid's head-or-model choice depends on: the runtimes asked for."""
    return settings.drafter_options().runtime, settings.target_runtime


def _runtime_key(options: DrafterOptions) -> str:
    """What a drafter-runtime choice depends on: the runtime asked for."""
    return options.runtime
