"""The slash commands: one registry, each command declared once.

A command is declared with `@REGISTRY.command(...)`: its name, aliases, typed
arguments (the bounds of an argument that sets a setting come from
`Settings`, and `/drafter_kind` names its arguments as the settings declare
them), one line of help and its handler. Parsing, argument errors,
`/help` and completion are all generated from these declarations; there is no
dispatch on command names anywhere else.

Handlers change the `ChatSession` and return a result object describing what
happened; they never print, read input or exit. A command that fails returns
`CommandFailed` with the reason and the valid form, and changes nothing.
This module knows nothing about the terminal, rich or prompt_toolkit.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from specrepl.chat.settings import (
    DRAFTER_KINDS,
    DRAFTER_SETTINGS,
    SETTING_NAMES,
    SettingError,
    Settings,
    shown,
)
from specrepl.engine.gamma import POLICIES
from specrepl.engine.processor_specs import PROCESSOR_NAMES, PROCESSOR_PARAMETERS

if TYPE_CHECKING:
    from specrepl.chat.answers import Change
    from specrepl.chat.session import ChatSession
    from specrepl.engine.widths import WidthPlan
    from specrepl.models.pair import ModelPair

__all__ = [
    "PROCESSOR_PARAMETERS",
    "REGISTRY",
    "Argument",
    "ClearScreen",
    "Command",
    "CommandError",
    "CommandFailed",
    "CommandRegistry",
    "CommandResult",
    "HistoryCleared",
    "Quit",
    "SettingsChanged",
    "ShowHelp",
    "ShowModels",
    "ShowSettings",
    "ShowWidths",
]

PREFIX = "/"
SHOWN_NAME_MAX = 40
ARGUMENTS_MAX = 10_000
"""The longest argument text read token by token (`/system` takes any length)."""
SAMPLING_SETTINGS = ("processor", "temperature", "top_k", "top_p")
BOOL_WORDS: dict[str, bool] = {
    "on": True,
    "off": False,
    "true": True,
    "false": False,
    "yes": True,
    "no": False,
    "1": True,
    "0": False,
}

# Numbers are plain ASCII decimals: `int()` and `float()` would also take
# "1_000", other scripts' digits and surrounding spaces.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE
)


class CommandError(ValueError):
    """A command line that cannot be parsed; the message says what was wrong."""


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


# -- results ---------------------------------------------------------------


@dataclass(frozen=True)
class SettingsChanged:
    """Settings a command changed (or set to the value they had)."""

    changes: tuple[Change, ...]
    settings: Settings


@dataclass(frozen=True)
class ShowSettings:
    """Every setting, for `/config` (or a subset, for a bare query like `/system`)."""

    settings: Settings
    names: tuple[str, ...]
    kept: Mapping[str, int] | None = None
    """For `/config`: the tokens each generator's cache kept from the last turn."""


@dataclass(frozen=True)
class ShowModels:
    pair: ModelPair
    head: dict[str, Any] | None = None
    """The draft head in use, if any: its head.json plus "path"."""
    runtime: str | None = None
    """What runs the drafter model and why, once chosen (`ChatSession.runtime_summary`)."""


@dataclass(frozen=True)
class ShowWidths:
    """The forward-width plan of each model (`/widths`), by role."""

    plans: Mapping[str, WidthPlan | None]
    measured: bool
    """True when they were measured just now (`/widths retime`)."""
    device: str


@dataclass(frozen=True)
class ShowHelp:
    commands: tuple[Command, ...]
    topic: Command | None = None


@dataclass(frozen=True)
class HistoryCleared:
    turns: int


@dataclass(frozen=True)
class ClearScreen:
    pass


@dataclass(frozen=True)
class Quit:
    pass


@dataclass(frozen=True)
class CommandFailed:
    """The command changed nothing: `message` says why, `usage` gives the valid form."""

    message: str
    usage: str | None = None


CommandResult = Union[  # noqa: UP007 - a runtime alias
    SettingsChanged, ShowSettings, ShowModels, ShowWidths, ShowHelp, HistoryCleared, ClearScreen,
    Quit, CommandFailed,
]  # fmt: skip
Handler = Callable[["ChatSession", Mapping[str, Any]], CommandResult]


# -- declarations ----------------------------------------------------------


@dataclass(frozen=True)
class Argument:
    """One typed argument of a command.

    `setting` names the `Settings` field whose bounds apply. `when` makes the
    argument apply only when another argument has one of the given values (the
    processor parameters). `rest` takes the rest of the line as text.
    """

    name: str
    kind: type
    help: str
    setting: str | None = None
    choices: tuple[str, ...] = ()
    required: bool = False
    when: tuple[str, tuple[str, ...]] | None = None
    rest: bool = False
    choices_of: Callable[[], Iterable[str]] | None = None
    """Values offered for completion only (not enforced), computed when asked."""
    metavar: str | None = None

    def options(self) -> tuple[str, ...]:
        """The fixed values this argument can take (for completion), if any."""
        if self.choices_of is not None:
            return tuple(self.choices_of())
        if self.choices:
            return self.choices
        if self.kind is bool:
            return ("on", "off")
        return ()

    def form(self) -> str:
        """How the argument is written in a usage line."""
        if self.metavar is not None:
            return self.metavar
        if self.kind is bool:
            return "on|off"
        if self.choices:
            return "|".join(self.choices) if len(self.choices) <= 3 else self.name.upper()
        return self.name.upper() if self.kind is str else self.name

    def valid(self) -> str:
        """A phrase naming the valid values."""
        if self.setting is not None:
            return Settings.bound(self.setting).describe()
        options = self.options()
        if options:
            return "one of " + ", ".join(options)
        return {int: "an integer", float: "a number", bool: "on or off"}.get(self.kind, "text")

    def applies(self, values: Mapping[str, Any]) -> bool:
        if self.when is None:
            return True
        other, allowed = self.when
        return values.get(other) in allowed

    def convert(self, token: str) -> Any:
        """Parse one token to this argument's type and check its bounds."""
        wrong = CommandError(f"{self.name} must be {self.valid()}, got {shown(token)}")
        value: Any
        if self.kind is bool:
            if token.lower() not in BOOL_WORDS:
                raise wrong
            value = BOOL_WORDS[token.lower()]
        elif self.kind is int:
            value = parse_integer(token)
            if value is None:
                raise wrong
        elif self.kind is float:
            value = parse_number(token)
            if value is None:
                raise wrong
        else:
            value = token
            if self.choices:
                value = next((c for c in self.choices if c.lower() == token.lower()), None)
                if value is None:
                    raise wrong
        if self.setting is not None:
            bound = Settings.bound(self.setting)
            if bound.optional and bound.kind is str and value.lower() == "none":
                return None
            try:
                value = bound.check(self.name, value)
            except SettingError as error:
                raise CommandError(str(error)) from None
        return value


@dataclass(frozen=True)
class Command:
    """A slash command: its name, aliases, arguments, one line of help, its handler."""

    name: str
    aliases: tuple[str, ...]
    arguments: tuple[Argument, ...]
    help: str
    handler: Handler
    current: Callable[[ChatSession], dict[str, Any]] | None = None
    """Current values of the arguments, for those the user leaves out."""
    needs_models: bool = False
    """It reads the loaded models; other commands work while they are still loading."""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def usage(self) -> str:
        parts = [PREFIX + self.name]
        for argument in self.arguments:
            text = argument.form() + ("..." if argument.rest else "")
            parts.append(text if argument.required else f"[{text}]")
        return " ".join(parts)

    def argument(self, name: str) -> Argument | None:
        return next((a for a in self.arguments if a.name == name), None)

    def _assign(
        self, tokens: list[str], context: Mapping[str, Any], convert: bool
    ) -> tuple[dict[str, Any], Argument | None]:
        """Match tokens to arguments; returns the values and the next positional argument.

        A token is `name=value` or the value of the next argument that is not
        given yet and applies to the values so far.
        """
        values: dict[str, Any] = {}
        for token in tokens:
            key, equals, raw = token.partition("=")
            argument = self.argument(key) if equals else None
            if argument is not None:
                if key in values:
                    raise CommandError(f"{key} is given twice")
            else:
                argument = self._next(values, context)
                if argument is None:
                    raise CommandError(f"unexpected argument {shown(token)}")
                raw = token
            values[argument.name] = argument.convert(raw) if convert else raw
        return values, self._next(values, context)

    def _next(self, values: Mapping[str, Any], context: Mapping[str, Any]) -> Argument | None:
        merged = {**context, **values}
        return next((a for a in self.arguments if a.name not in values and a.applies(merged)), None)

    def parse(self, text: str, session: ChatSession | None = None) -> dict[str, Any]:
        """The argument values of `text` (everything after the command name).

        Arguments are given in order or as `name=value`; arguments that do
        not apply (a processor parameter the chosen processor does not take)
        are skipped in the positional order and refused by name.
        """
        context = dict(self.current(session)) if self.current and session is not None else {}
        rest = next((a for a in self.arguments if a.rest), None)
        if rest is not None:
            text = text.strip()
            values = {rest.name: rest.convert(text)} if text else {}
        else:
            if len(text) > ARGUMENTS_MAX:  # no valid argument list is this long
                raise CommandError(
                    f"the arguments are {len(text)} characters long; "
                    f"at most {ARGUMENTS_MAX} are read"
                )
            try:
                tokens = shlex.split(text)
            except ValueError as error:
                raise CommandError(f"cannot read the arguments: {error}") from None
            values, _ = self._assign(tokens, context, convert=True)
        merged = {**context, **values}
        for argument in self.arguments:
            if argument.name in values and not argument.applies(merged):
                other = argument.when[0] if argument.when else ""
                raise CommandError(f"{merged.get(other)} takes no {argument.name}")
            if argument.required and argument.name not in values:
                raise CommandError(f"missing {argument.name} ({argument.valid()})")
        return values

    def completions(self, tokens: list[str], word: str) -> list[str]:
        """What `word` may become after the complete argument tokens `tokens`."""
        if any(argument.rest for argument in self.arguments):
            return []
        try:
            values, following = self._assign(tokens, {}, convert=False)
        except CommandError:
            return []
        options = list(following.options()) if following is not None else []
        if word:
            merged = dict(values)
            options += [
                f"{a.name}="
                for a in self.arguments[1:]
                if a.name not in values and a.applies(merged)
            ]
        return [option for option in options if option.startswith(word)]


class CommandRegistry:
    """Every command, looked up by name or alias."""

    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}
        self._by_name: dict[str, Command] = {}

    def command(
        self,
        name: str,
        *,
        help: str,
        aliases: tuple[str, ...] = (),
        arguments: tuple[Argument, ...] = (),
        current: Callable[[ChatSession], dict[str, Any]] | None = None,
        needs_models: bool = False,
    ) -> Callable[[Handler], Handler]:
        """Decorator that declares a command with its handler."""

        def register(handler: Handler) -> Handler:
            self.add(Command(name, aliases, arguments, help, handler, current, needs_models))
            return handler

        return register

    def add(self, command: Command) -> None:
        for name in command.names:
            if name in self._by_name:
                raise ValueError(f"command name {name!r} is declared twice")
        self._commands[command.name] = command
        for name in command.names:
            self._by_name[name] = command

    @property
    def commands(self) -> tuple[Command, ...]:
        return tuple(self._commands.values())

    def names(self) -> list[str]:
        """Every name and alias, with the prefix."""
        return [PREFIX + name for name in self._by_name]

    def lookup(self, name: str) -> Command | None:
        return self._by_name.get(name.removeprefix(PREFIX).lower())

    @staticmethod
    def is_command(line: str) -> bool:
        """Lines starting with one `/` are commands (`//text` is a prompt `/text`)."""
        stripped = line.lstrip()
        return stripped.startswith(PREFIX) and not stripped.startswith(PREFIX * 2)

    def needs_models(self, line: str) -> bool:
        """Whether handling `line` needs the loaded models: a prompt does, and so does
        a command declared with `needs_models` (an unknown one is refused without them)."""
        if not self.is_command(line):
            return True
        command = self.lookup(([*line.split(maxsplit=1), ""])[0])
        return command is not None and command.needs_models

    def dispatch(self, session: ChatSession, line: str) -> CommandResult:
        """Run the command on `line`; errors come back as `CommandFailed`."""
        word, text = ([*line.split(maxsplit=1), "", ""])[:2]  # any whitespace separates
        command = self.lookup(word)
        if command is None:
            return self.unknown(word)
        try:
            values = command.parse(text, session)
            return command.handler(session, values)
        except (CommandError, SettingError) as error:
            return CommandFailed(str(error), command.usage())

    def unknown(self, word: str) -> CommandFailed:
        """The answer to a name that is no command, with the nearest one."""
        name = word.removeprefix(PREFIX)
        if not name:
            return CommandFailed(f"no command name after {PREFIX}", "/help lists the commands")
        word = PREFIX + name
        short = len(word) <= SHOWN_NAME_MAX  # a longer word is no near miss of any name
        nearest = (
            difflib.get_close_matches(word.lower(), self.names(), n=1, cutoff=0.5) if short else []
        )
        hint = f"; did you mean {nearest[0]}?" if nearest else ""
        named = word if short and word.isprintable() else shown(word)
        return CommandFailed(f"unknown command {named}{hint}", "/help lists the commands")

    def completions(self, text: str) -> tuple[str, list[str]]:
        """The word being typed at the end of `text` and what it may become."""
        text = text.lstrip()
        if " " not in text:
            if not text.startswith(PREFIX):
                return text, []
            return text, [name for name in self.names() if name.startswith(text.lower())]
        head, _, tail = text.partition(" ")
        *tokens, word = tail.split(" ")
        command = self.lookup(head)
        if command is None:
            return word, []
        return word, command.completions([token for token in tokens if token], word)


REGISTRY = CommandRegistry()


# -- the commands ----------------------------------------------------------


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
        _drafter_argument("drafter_head", "a draft head directory, or embedded", "head", "hybrid"),
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


@REGISTRY.command("reset", help="clear the chat history")
def _reset(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    return HistoryCleared(session.reset())


@REGISTRY.command("clear", help="clear the screen")
def _clear(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    return ClearScreen()


@REGISTRY.command("config", aliases=("settings",), help="show every setting")
def _config(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    return ShowSettings(session.settings, tuple(Settings.names()), session.kept_caches())


@REGISTRY.command("models", help="show the loaded target and drafter", needs_models=True)
def _models(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    return ShowModels(session.pair, session.head_summary(), session.runtime_summary())


@REGISTRY.command(
    "widths",
    help="show the forward widths each model is padded to; retime: measure them again now",
    arguments=(Argument("retime", str, "measure again", choices=("retime",)),),
    needs_models=True,
)
def _widths(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    device = session.pair.device.type
    if "retime" in values:
        if device != "cpu":
            return CommandFailed(f"widths are timed on a CPU only (the models run on {device})")
        session.tune_widths(retime=True)
    return ShowWidths(session.width_plans(), "retime" in values, device)


def _command_names() -> tuple[str, ...]:
    return tuple(name.removeprefix(PREFIX) for name in REGISTRY.names())


@REGISTRY.command(
    "help",
    aliases=("?",),
    help="list the commands, or explain one",
    arguments=(Argument("command", str, "a command name", choices_of=_command_names),),
)
def _help(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    if "command" not in values:
        return ShowHelp(REGISTRY.commands)
    topic = REGISTRY.lookup(values["command"])
    if topic is None:
        return REGISTRY.unknown(values["command"])
    return ShowHelp(REGISTRY.commands, topic)


@REGISTRY.command("quit", aliases=("exit", "q"), help="leave specrepl (Ctrl-D does too)")
def _quit(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    return Quit()
