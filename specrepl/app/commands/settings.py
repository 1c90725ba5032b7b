"""The slash commands that change settings: `/gamma`, `/confidence`, `/length`,
`/seed`, the on/off switches (`/speculative`, `/cache`, `/chat`, ...),
`/drafter_kind`, `/ngram`, `/processor` and `/system`.

Each is declared here once, on the registry (registry.py); a command that sets
one setting takes that setting's bounds and help from `Settings`. Handlers
change the session through `ChatSession.update` and return what changed; they
never print.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from specrepl.app.commands.registry import REGISTRY, Argument, Command, CommandError, CommandResult
from specrepl.app.commands.results import SAMPLING_SETTINGS, SettingsChanged, ShowSettings
from specrepl.chat.settings import (
    DRAFTER_KINDS,
    DRAFTER_SETTINGS,
    SETTING_NAMES,
    Settings,
    parse_integer,
    shown,
)
from specrepl.engine.gamma import POLICIES
from specrepl.engine.processor_specs import PROCESSOR_NAMES, PROCESSOR_PARAMETERS

if TYPE_CHECKING:
    from specrepl.chat.session import ChatSession

__all__: list[str] = []  # the commands are reached through REGISTRY


def _set(session: ChatSession, **changes: Any) -> SettingsChanged:
    return SettingsChanged(tuple(session.update(**changes)), session.settings)


def _setting_command(
    name: str, setting: str, metavar: str, help: str, aliases: tuple[str, ...] = ()
) -> None:
    """Declare a command that sets one numeric setting (or shows it, given no value)."""
    kind = Settings.bound(setting).kind

    def handler(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
        if setting not in values:
            return ShowSettings(session.settings, (setting,))
        return _set(session, **values)

    argument = Argument(setting, kind, Settings.help(setting), setting=setting, metavar=metavar)
    REGISTRY.add(Command(name, aliases, (argument,), help, handler))


def _toggle_command(name: str, setting: str, help: str, aliases: tuple[str, ...] = ()) -> None:
    """Declare an on/off command: bare flips, `on`/`off` sets."""

    def handler(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
        value = values.get(setting, not getattr(session.settings, setting))
        return _set(session, **{setting: value})

    argument = Argument(setting, bool, "on or off (default: flip)", setting=setting)
    REGISTRY.add(Command(name, aliases, (argument,), help, handler))


@REGISTRY.command(
    "gamma",
    help="drafts per step: N (fixed), or a policy auto|heuristic|confidence|fixed [at most N]",
    arguments=(
        Argument(
            "value",
            str,
            "a number of drafts, or a gamma policy",
            choices_of=lambda: POLICIES,
            metavar="N|" + "|".join(POLICIES),
        ),
        Argument("max", int, "the largest gamma", setting="gamma", metavar="N"),
    ),
)
def _gamma(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    if "value" not in values:
        if "max" in values:  # `/gamma max=N`: a new maximum for the current policy
            return _set(session, gamma=values["max"])
        return ShowSettings(session.settings, ("gamma_policy", "gamma"))
    value = values["value"].lower()
    if value in POLICIES:
        changes: dict[str, Any] = {"gamma_policy": value}
        if "max" in values:
            changes["gamma"] = values["max"]
        return _set(session, **changes)
    if "max" in values:
        raise CommandError("give one number: /gamma N, or a policy and its maximum")
    gamma = parse_integer(value)
    if gamma is None:
        raise CommandError(
            f"gamma must be {Settings.bound('gamma').describe()} or one of "
            f"{', '.join(POLICIES)}, got {shown(values['value'])}"
        )
    return _set(session, gamma=gamma, gamma_policy="fixed")


_setting_command(
    "confidence", "confidence", "P", "stop threshold of the confidence gamma policy", ("conf",)
)
_setting_command("length", "max_new_tokens", "N", "most new tokens per answer", ("max",))
_setting_command("seed", "seed", "N", "seed of the sampling generator (same for every run)")

_toggle_command("speculative", "speculative", "run speculative decoding", ("spec",))
_toggle_command("target_gen", "target_gen", "run the target alone, for comparison", ("target",))
_toggle_command("drafter_gen", "drafter_gen", "run the drafter alone, for reference", ("drafter",))
_toggle_command("cache", "use_cache", "use the KV cache in both models")
_toggle_command("debug", "debug", "show every speculative step and the acceptance histogram")
_toggle_command("chat", "chat", "chat template with history (off: raw text continuation)")


def _drafter_option(setting: str) -> str:
    """The short name of a drafter option (`filler` for ngram_filler): its argument's name."""
    name = SETTING_NAMES[setting].drafter
    if name is None:
        raise ValueError(f"{setting} is no drafter option")
    return name


_KIND = _drafter_option("drafter_kind")


def _drafter_argument(setting: str, help: str, *kinds: str) -> Argument:
    """An argument of /drafter_kind that sets `setting` for the drafter `kinds`."""
    bound = Settings.bound(setting)
    return Argument(
        _drafter_option(setting), bound.kind, help, setting, choices=bound.choices,
        when=(_KIND, kinds),
    )  # fmt: skip


@REGISTRY.command(
    "drafter_kind",
    aliases=("kind",),
    help="what drafts: model, ngram, lookup, head, or hybrid (lookup, else head or model)",
    arguments=(
        Argument(_KIND, str, "the drafter kind", setting="drafter_kind", choices=DRAFTER_KINDS),
        _drafter_argument("ngram_order", "longest n-gram", "ngram"),
        _drafter_argument("ngram_keep", "keep counts between prompts", "ngram"),
        _drafter_argument("ngram_filler", "also count the target's top k tokens", "ngram"),
        _drafter_argument("lookup_max_ngram", "longest suffix searched", "lookup", "hybrid"),
        _drafter_argument(
            "drafter_window", "prompt tokens the model drafter reads (0: all)", "model", "hybrid"
        ),
        _drafter_argument(
            "drafter_head", "a draft head directory, embedded, or auto (timed)", "head", "hybrid"
        ),
        # last, so that lines written before it existed keep their meaning
        _drafter_argument(
            "drafter_runtime", "what runs the model (auto: the cheaper, timed)", "model", "hybrid"
        ),
    ),
    current=lambda session: {_KIND: session.settings.drafter_kind},
)
def _drafter_kind(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    if not values:
        return ShowSettings(session.settings, tuple(DRAFTER_SETTINGS.values()))
    return _set(session, **{DRAFTER_SETTINGS[name]: value for name, value in values.items()})


@REGISTRY.command(
    "ngram",
    help="the n-gram drafter on or off (off: back to the model drafter)",
    arguments=(Argument("on", bool, "on or off (default: flip)"),),
)
def _ngram(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    on = values.get("on", session.settings.drafter_kind != "ngram")
    return _set(session, drafter_kind="ngram" if on else "model")


def _takes(parameter: str) -> tuple[str, tuple[str, ...]]:
    return ("name", tuple(n for n, ps in PROCESSOR_PARAMETERS.items() if parameter in ps))


@REGISTRY.command(
    "processor",
    aliases=("proc",),
    help="how tokens are chosen; missing parameters keep their current values",
    arguments=(
        Argument("name", str, "the processor", setting="processor", choices=PROCESSOR_NAMES),
        Argument(
            "temperature", float, "sampling temperature", "temperature", when=_takes("temperature")
        ),
        Argument("top_k", int, "tokens kept by top-k", "top_k", when=_takes("top_k")),
        Argument("top_p", float, "probability mass kept", "top_p", when=_takes("top_p")),
    ),
    current=lambda session: {"name": session.settings.processor},
)
def _processor(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    if not values:
        return ShowSettings(session.settings, SAMPLING_SETTINGS)
    changes = {"processor" if key == "name" else key: value for key, value in values.items()}
    return _set(session, **changes)


@REGISTRY.command(
    "system",
    help="the system prompt in chat mode (`none`: the template's own)",
    arguments=(Argument("text", str, "the system prompt", setting="system_prompt", rest=True),),
)
def _system(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    if "text" not in values:
        return ShowSettings(session.settings, ("system_prompt",))
    return _set(session, system_prompt=values["text"])
