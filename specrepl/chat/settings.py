"""The session's settings: one typed, validated, immutable dataclass.

Config files, command-line flags and REPL commands all change settings through
`Settings.updated(...)`, which validates every value and either returns a new
`Settings` or raises `SettingError` naming the valid range; the old value is
never touched.

Each field declares, once, everything the other surfaces need: its bounds, its
help and its names (`SettingNames`: the flag, and for a drafter option the short
name that `/drafter_kind`, the config's `[drafter]` table and `DrafterOptions`
share). `SETTING_NAMES` and `DRAFTER_SETTINGS` are generated from those
declarations; flags.py, config.py and the app's slash commands (`app/commands/`)
read them instead of keeping tables of their own.

This module knows nothing about models or the terminal, and imports no model
library (not even torch): the REPL's prompt and toolbar are drawn from it while
the models load.
"""

from __future__ import annotations

import math
import re
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from specrepl.engine.drafters.options import DRAFTER_KINDS, DRAFTER_RUNTIMES, DrafterOptions
from specrepl.engine.gamma import POLICIES, GammaPolicy, make_policy
from specrepl.engine.processor_specs import (
    PROCESSOR_NAMES,
    PROCESSOR_PARAMETERS,
    describe_processor,
)
from specrepl.engine.runtime_options import TARGET_RUNTIMES

if TYPE_CHECKING:
    from specrepl.engine.processors import LogitsProcessor

GAMMA_MAX = 64
NGRAM_ORDER_MAX = 8
FILLER_MAX = 64
MAX_NEW_TOKENS_MAX = 1_000_000
SEED_MAX = 2**63 - 1
TEMPERATURE_MAX = 100.0
TOP_K_MAX = 1_000_000


SHOWN_MAX = 40
"""The most characters of a refused value an error message repeats."""


# Numbers are plain ASCII decimals: `int()` and `float()` would also take
# "1_000", other scripts' digits and surrounding spaces.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE
)


class SettingError(ValueError):
    """A setting was given a value outside its valid range."""


def parse_integer(token: str) -> int | None:
    """The integer an ASCII decimal token spells, or None."""
    if not _INTEGER.fullmatch(token):
        return None
    try:
        return int(token)
    except ValueError:  # more digits than Python converts
        return None


def parse_number(token: str) -> float | None:
    """The number an ASCII decimal token spells (inf and nan included, for the bounds
    to refuse by name), or None."""
    return float(token) if _NUMBER.fullmatch(token) else None


def shown(value: Any, limit: int = SHOWN_MAX) -> str:
    """`repr(value)` for an error message, cut short when it is long.

    Integers too long to print (Python refuses `str` beyond 4300 digits) are
    described by their size instead, so that building the message never fails.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * limit:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, str):
        text = repr(value[: limit + 1])  # escapes make a repr up to ten times longer
        if len(value) <= limit and len(text) <= 2 * limit:
            return text
        return f"{text[:limit]}… ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Bound:
    """The valid values of one setting, with a phrase that says what they are."""

    kind: type
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    choices: tuple[str, ...] = ()
    optional: bool = False

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is bool:
            return "on or off"
        if self.kind is str:
            return "text" + (" (or none)" if self.optional else "")
        kind = "an integer" if self.kind is int else "a number"
        low = "" if self.low is None else f"{'>=' if self.low_inclusive else '>'} {self.low}"
        high = "" if self.high is None else f"<= {self.high}"
        return f"{kind} {' and '.join(part for part in (low, high) if part)}".strip()

    def check(self, name: str, value: Any) -> Any:
        """Return the value in canonical form, or raise SettingError."""
        if value is None and self.optional:
            return None
        wrong = SettingError(f"{name} must be {self.describe()}, got {shown(value)}")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise wrong
            return value
        if self.kind is str:
            if not isinstance(value, str):
                raise wrong
            if self.choices and value not in self.choices:
                raise wrong
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong
        if self.kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise wrong
            value = int(value)
        else:
            try:
                value = float(value) + 0.0  # + 0.0 turns -0.0 into 0.0
            except OverflowError:  # an integer beyond the largest float
                raise wrong from None
            if not math.isfinite(value):
                raise wrong
        if self.low is not None and (
            value < self.low or (value == self.low and not self.low_inclusive)
        ):
            raise wrong
        if self.high is not None and value > self.high:
            raise wrong
        return value


@dataclass(frozen=True)
class SettingNames:
    """Every name one setting goes by outside the code, from its declaration.

    `setting` is the field's name, which is also its key in a config file's
    `[generation]` table and, with dashes, its flag (`ngram_filler`:
    `--ngram-filler`). An on/off setting's flag is a switch that sets `switch`,
    the opposite of the default (`--debug`; `--no-chat` for one that is on);
    `switch` is None for a flag that takes a value.

    A drafter option also has a short `drafter` name, the end of its setting's
    name (`filler`): its argument of `/drafter_kind`, its key in a config
    file's `[drafter]` table and its field of `DrafterOptions`.
    `old_drafter_keys` are earlier spellings of that key which config files may
    still use (`top_k_filler`).
    """

    setting: str
    flag: str
    switch: bool | None = None
    drafter: str | None = None
    old_drafter_keys: tuple[str, ...] = ()


def _setting(
    default: Any,
    bound: Bound,
    help: str,
    *,
    flag: str | None = None,
    drafter: str | None = None,
    old_drafter_keys: tuple[str, ...] = (),
) -> Any:
    """A field of Settings: its default, bounds and help, and those of its names
    (see SettingNames) that do not follow from the field's name: `flag` where it
    is not the name with dashes, and `drafter` for a drafter option."""
    names = {"flag": flag, "drafter": drafter, "old_drafter_keys": old_drafter_keys}
    return field(default=default, metadata={"bound": bound, "help": help, "names": names})


@dataclass(frozen=True)
class Settings:
    """Everything a user can change while the session runs."""

    gamma: int = _setting(
        4, Bound(int, 1, GAMMA_MAX), "draft tokens per step (the most, for an adaptive policy)"
    )
    gamma_policy: str = _setting(
        "auto", Bound(str, choices=POLICIES), "fixed gamma, or how it adapts while decoding"
    )
    confidence: float = _setting(
        0.4, Bound(float, 0, 0.99), "the confidence policy's stop threshold for the model drafter"
    )
    drafter_kind: str = _setting(
        DrafterOptions.kind,
        Bound(str, choices=DRAFTER_KINDS),
        "what drafts: a model, n-grams, prompt lookup, a trained draft head, or hybrid"
        " (lookup, else the head or model)",
        drafter="kind",
    )
    ngram_order: int = _setting(
        DrafterOptions.order,
        Bound(int, 2, NGRAM_ORDER_MAX),
        "longest n-gram the n-gram drafter counts",
        drafter="order",
    )
    ngram_keep: bool = _setting(
        DrafterOptions.keep,
        Bound(bool),
        "keep the n-gram counts from one prompt to the next",
        drafter="keep",
        old_drafter_keys=("keep_between_prompts",),
    )
    ngram_filler: int = _setting(
        DrafterOptions.filler,
        Bound(int, 1, FILLER_MAX),
        "n-gram drafter also counts the target's top k (1: off)",
        drafter="filler",
        old_drafter_keys=("top_k_filler",),
    )
    lookup_max_ngram: int = _setting(
        DrafterOptions.max_ngram,
        Bound(int, 1, NGRAM_ORDER_MAX),
        "longest suffix prompt lookup searches for",
        drafter="max_ngram",
    )
    drafter_window: int = _setting(
        DrafterOptions.window,
        Bound(int, 0, MAX_NEW_TOKENS_MAX),
        "model drafter reads the last N prompt tokens (0: all)",
        drafter="window",
    )
    drafter_head: str | None = _setting(
        DrafterOptions.head,
        Bound(str, optional=True),
        "draft head for the head and hybrid drafters: a directory, embedded, or auto (the one"
        " trained for the target; a hybrid drafts with it where timed faster than the model)",
        drafter="head",
    )
    drafter_runtime: str = _setting(
        DrafterOptions.runtime,
        Bound(str, choices=DRAFTER_RUNTIMES),
        "what runs the drafter model: torch, llamacpp (its GGUF file), static (torch over a"
        " static cache, compiled on a GPU), or auto (the cheapest measured)",
        drafter="runtime",
    )
    target_runtime: str = _setting(
        "auto",
        Bound(str, choices=TARGET_RUNTIMES),
        "what runs the target (and so the baseline): torch, llamacpp (a GGUF file of its exact"
        " weights), static (torch over a static cache, compiled on a GPU), or auto (the faster"
        " of torch and llamacpp, where its greedy text is torch's)",
    )
    processor: str = _setting(
        "greedy", Bound(str, choices=PROCESSOR_NAMES), "how tokens are chosen from the logits"
    )
    temperature: float = _setting(
        1.0, Bound(float, 0, TEMPERATURE_MAX, low_inclusive=False), "sampling temperature"
    )
    top_k: int = _setting(50, Bound(int, 1, TOP_K_MAX), "tokens kept by top-k")
    top_p: float = _setting(0.9, Bound(float, 0, 1, low_inclusive=False), "mass kept by nucleus")
    max_new_tokens: int = _setting(
        128, Bound(int, 1, MAX_NEW_TOKENS_MAX), "most tokens generated per answer"
    )
    seed: int = _setting(0, Bound(int, 0, SEED_MAX), "seed of the sampling generator")
    use_cache: bool = _setting(True, Bound(bool), "KV cache for both models", flag="--no-cache")
    chat: bool = _setting(True, Bound(bool), "apply the chat template and keep the history")
    system_prompt: str | None = _setting(
        None, Bound(str, optional=True), "system prompt in chat mode (none: the template's)"
    )
    speculative: bool = _setting(True, Bound(bool), "run the speculative generator")
    target_gen: bool = _setting(True, Bound(bool), "run the target alone, for comparison")
    drafter_gen: bool = _setting(False, Bound(bool), "run the drafter alone, for reference")
    debug: bool = _setting(False, Bound(bool), "show every speculative step")

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(
                self, f.name, f.metadata["bound"].check(f.name, getattr(self, f.name))
            )

    def updated(self, **changes: Any) -> Settings:
        """A validated copy with `changes` applied; raises SettingError, leaving self as is."""
        unknown = sorted(set(changes) - {f.name for f in fields(self)})
        if unknown:
            raise SettingError(
                f"unknown setting {unknown[0]!r}; known settings: {', '.join(self.names())}"
            )
        return replace(self, **changes)

    def without_drafter_model(self) -> Settings:
        """These settings for a pair with no drafter model: the drafter-alone run
        off, and speculative decoding too when the drafter kind needs the model."""
        off: dict[str, Any] = {"drafter_gen": False}
        if self.drafter_options().needs_model:
            off["speculative"] = False
        return self.updated(**off)

    def check_drafter_model(self, loaded: bool) -> None:
        """Raise SettingError when these settings need a drafter model and none is `loaded`."""
        if loaded:
            return
        if self.drafter_gen:
            raise SettingError("drafter_gen needs a drafter model, and none is loaded")
        if self.speculative and self.drafter_options().needs_model:
            raise SettingError(
                f"speculative decoding with the {self.drafter_kind} drafter needs a drafter"
                " model, and none is loaded: choose /drafter_kind ngram, lookup or head, or"
                " start with --drafter"
            )

    def logits_processor(self) -> LogitsProcessor:
        # imported here: processors.py needs torch, and settings are read before torch is
        from specrepl.engine.processors import make_processor

        return make_processor(
            self.processor, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p
        )

    def describe_processor(self) -> str:
        """`topk(temperature=0.7, top_k=40)`: the processor and its parameters."""
        parameters = {name: getattr(self, name) for name in PROCESSOR_PARAMETERS[self.processor]}
        return describe_processor(self.processor, parameters)

    def drafter_options(self) -> DrafterOptions:
        """The drafter these settings ask for: each drafter option under its short name."""
        return DrafterOptions(
            **{name: getattr(self, setting) for name, setting in DRAFTER_SETTINGS.items()}
        )

    def gamma_policy_object(self) -> GammaPolicy:
        return make_policy(self.gamma_policy, self.gamma, confidence=self.confidence)

    def describe_gamma(self) -> str:
        """`4` for a fixed gamma, `auto≤4` for an adaptive one."""
        if self.gamma_policy == "fixed":
            return str(self.gamma)
        return f"{self.gamma_policy}≤{self.gamma}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def bound(cls, name: str) -> Bound:
        return next(f.metadata["bound"] for f in fields(cls) if f.name == name)

    @classmethod
    def help(cls, name: str) -> str:
        return next(f.metadata["help"] for f in fields(cls) if f.name == name)


def _names(setting: Field[Any]) -> SettingNames:
    """The names of one field: those it declares, the others made from its name."""
    declared = setting.metadata["names"]
    switch = (not setting.default) if setting.metadata["bound"].kind is bool else None
    prefix = "--no-" if switch is False else "--"
    flag = declared["flag"] or prefix + setting.name.replace("_", "-")
    return SettingNames(
        setting.name, flag, switch, declared["drafter"], declared["old_drafter_keys"]
    )


SETTING_NAMES: dict[str, SettingNames] = {f.name: _names(f) for f in fields(Settings)}
"""Every setting's names, by setting, in the order the fields are declared."""

DRAFTER_SETTINGS: dict[str, str] = {
    names.drafter: names.setting for names in SETTING_NAMES.values() if names.drafter is not None
}
"""The drafter options' settings by their short names: {"kind": "drafter_kind", ...,
"filler": "ngram_filler", ...}, in the order `/drafter_kind` takes them."""
