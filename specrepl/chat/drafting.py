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

It never prints and knows nothing of prompts, history or the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specrepl.chat.answers import GeneratorName
from specrepl.chat.settings import SettingError, Settings
from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.builder import DrafterSpec, build_drafter, load_drafter_head
from specrepl.engine.drafters.draft_head import DraftHead
from specrepl.engine.drafters.head_store import resolve_head
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.drafters.runtime import RuntimeChoice, choose_drafter_runtime
from specrepl.engine.gamma import GammaPolicy
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.prompt_cache import PromptCache
from specrepl.models.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from specrepl.models.pair import ModelPair

__all__ = ["ChatDrafters", "build_pair_drafter", "drafter_spec", "keeps_drafter_state"]


@dataclass(frozen=True)
class _BuiltFrom:
    """What a kept drafter was built from (the loaded parts by identity): while
    it stays the same, the drafter and its cache are kept."""

    spec: DrafterSpec
    model: int
    head: int
    runtime: int


class ChatDrafters:
    """The drafters of one chat session over `pair`, sharing the session's kept `caches`."""

    def __init__(self, pair: ModelPair, caches: dict[GeneratorName, PromptCache]) -> None:
        self.pair = pair
        self._caches = caches
        self._heads: dict[str, tuple[DraftHead, dict[str, Any]]] = {}
        self._runtimes: dict[str, RuntimeChoice | None] = {}
        self._ngram: NgramDrafter | None = None
        self._kept: tuple[_BuiltFrom, Drafter] | None = None
        self._kept_policy: tuple[tuple[Any, ...], GammaPolicy] | None = None

    # -- the drafter ---------------------------------------------------------

    def spec(self, settings: Settings) -> DrafterSpec:
        """The drafter `settings` ask for in this chat (`drafter_spec`, kept
        between turns as `keeps_drafter_state` says)."""
        return drafter_spec(settings, self.pair, keep_between_prompts=keeps_drafter_state(settings))

    def drafter(self, settings: Settings) -> Drafter:
        """The drafter the settings ask for: the kept one (with its cache) while
        the spec and what it is built over stay the same; another one starts
        empty, and so does the speculative run's target cache."""
        spec = self.spec(settings)
        if spec.options.kind == "ngram":
            return self._ngram_drafter(spec, keep=settings.ngram_keep)
        model = self.model() if self.drafts_in_torch(settings) else None
        loaded = self.head(settings) if spec.options.needs_head else None
        head = None if loaded is None else loaded[0]
        runtime = self.runtime(settings)
        built = _BuiltFrom(spec, id(model), id(head), id(runtime))
        if self._kept is not None and self._kept[0] == built:
            return self._kept[1]
        drafter = build_pair_drafter(spec, self.pair, model=model, head=head, runtime=runtime)
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
        times both runtimes here, ~0.5 s). Raises SettingError when llama.cpp
        is asked for and cannot run."""
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

    def runtime_summary(self, settings: Settings) -> str | None:
        """What runs the drafter model and why, once chosen (None before the
        first speculative run, or when no model drafts)."""
        options = settings.drafter_options()
        choice = self._runtimes.get(_runtime_key(options))
        return None if choice is None or not options.needs_model else choice.describe()

    def check_head(self, settings: Settings) -> None:
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

    def head(self, settings: Settings) -> tuple[DraftHead, dict[str, Any]] | None:
        """The settings' draft head and its description, loaded once per directory
        (`builder.load_drafter_head`)."""
        name = settings.drafter_head
        if name is None:
            return None
        if name not in self._heads:
            self._heads[name] = load_drafter_head(name, self.pair.target.model)
        return self._heads[name]

    def head_summary(self, settings: Settings) -> dict[str, Any] | None:
        """The draft head the settings name (its description and "path"), if one is loaded."""
        name = settings.drafter_head
        if name is None or name not in self._heads:
            return None
        return {**self._heads[name][1], "path": str(resolve_head(name))}

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
            if self.needs_torch_model(settings):
                self.model()
        except ModelLoadError as error:
            raise SettingError(f"the drafter model cannot be loaded again: {error}") from None

    def drafts_in_torch(self, settings: Settings) -> bool:
        """Whether the speculative drafter `settings` ask for runs the drafter's
        torch model: a drafter that needs the model, unless llama.cpp runs it."""
        if not settings.drafter_options().needs_model:
            return False
        runtime = self.runtime(settings)
        return runtime is None or runtime.llama is None

    def needs_torch_model(self, settings: Settings) -> bool:
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
) -> Drafter:
    """`builder.build_drafter` over `pair`'s target and both models' tunings,
    with the drafter `model` (None where torch does not draft with it, so that
    a released model is not loaded again for nothing), the loaded `head` and
    the chosen `runtime`. The REPL's session and `bench` both build here."""
    return build_drafter(
        spec,
        target=pair.target.model,
        model=model,
        head=head,
        runtime=runtime,
        target_tuning=pair.target.tuning,
        model_tuning=None if pair.drafter is None else pair.drafter.tuning,
    )


def keeps_drafter_state(settings: Settings) -> bool:
    """Whether a chat's model or head drafter keeps its cache from turn to turn
    under `settings`: only with the cache on and greedy. When sampling it reads
    the prompt afresh each turn: a bf16 drafter's cache filled token by token
    rounds differently from one filled at once, and a sampled draft, unlike a
    greedy one, follows every change of its q, so a seeded answer would no
    longer repeat a fresh session's token for token (a copy of the target reads
    no prompt at all: it takes the target's keys and values)."""
    return settings.use_cache and settings.logits_processor().is_greedy


def _runtime_key(options: DrafterOptions) -> str:
    """What a drafter-runtime choice depends on: the runtime asked for."""
    return options.runtime
