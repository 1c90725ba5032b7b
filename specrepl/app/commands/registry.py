"""How a slash command is declared, parsed, completed and dispatched.

`REGISTRY` holds every command. A command is declared once, with
`@REGISTRY.command(...)` on its handler: its name, aliases, typed arguments
(`Argument`: the bounds of an argument that sets a setting come from
`Settings`), one line of help and the handler. Parsing, argument errors,
`/help` and completion are all generated from these declarations; there is no
dispatch on command names anywhere else. The commands themselves live in the
modules of this package named after what they act on (see `__init__.py`).

A handler changes the `ChatSession` and returns a result (results.py); a
command that fails returns `CommandFailed` with the reason and the valid form,
and changes nothing. This module knows nothing about the terminal, rich or
prompt_toolkit.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

from specrepl.app.commands.results import (
    ClearScreen,
    CommandFailed,
    HistoryCleared,
    Quit,
    SettingsChanged,
    ShowDraftSource,
    ShowModels,
    ShowSettings,
    ShowWidths,
)
from specrepl.chat.settings import SettingError, Settings, parse_integer, parse_number, shown

if TYPE_CHECKING:
    from specrepl.chat.session import ChatSession

__all__ = [
    "BOOL_WORDS",
    "PREFIX",
    "REGISTRY",
    "Argument",
    "Command",
    "CommandError",
    "CommandRegistry",
    "CommandResult",
    "Handler",
    "ShowHelp",
]

PREFIX = "/"
SHOWN_NAME_MAX = 40
ARGUMENTS_MAX = 10_000
"""The longest argument text read token by token (`/system` takes any length)."""
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


class CommandError(ValueError):
    """A command line that cannot be parsed; the message says what was wrong."""


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


@dataclass(frozen=True)
class ShowHelp:
    """`/help`: every command, or one of them (`topic`) explained."""

    commands: tuple[Command, ...]
    topic: Command | None = None


CommandResult = Union[  # noqa: UP007 - a runtime alias
    SettingsChanged, ShowSettings, ShowModels, ShowWidths, ShowDraftSource, ShowHelp,
    HistoryCleared, ClearScreen, Quit, CommandFailed,
]  # fmt: skip
Handler = Callable[["ChatSession", Mapping[str, Any]], CommandResult]


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
