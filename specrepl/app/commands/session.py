"""The slash commands about the session and the REPL itself: `/reset`, `/clear`,
`/config`, `/models`, `/widths`, `/help` and `/quit`.

Each is declared here once, on the registry (registry.py). Handlers return what
happened; they never print, read input or exit (`/quit` returns `Quit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from specrepl.app.commands.registry import PREFIX, REGISTRY, Argument, CommandResult, ShowHelp
from specrepl.app.commands.results import (
    ClearScreen,
    CommandFailed,
    HistoryCleared,
    Quit,
    ShowDraftSource,
    ShowModels,
    ShowSettings,
    ShowWidths,
)
from specrepl.chat.settings import Settings

if TYPE_CHECKING:
    from specrepl.chat.session import ChatSession

__all__: list[str] = []  # the commands are reached through REGISTRY


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
    target = session.target.summary(session.settings)
    return ShowModels(session.pair, session.head_summary(), session.runtime_summary(), target)


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


@REGISTRY.command(
    "draft_source",
    help="head auto: whether the head or the model drafts, and why; retime: time again",
    arguments=(Argument("retime", str, "time again", choices=("retime",)),),
    needs_models=True,
)
def _draft_source(session: ChatSession, values: Mapping[str, Any]) -> CommandResult:
    settings = session.settings
    drafter = f"{settings.drafter_kind}, head {settings.drafter_head or 'none'}"
    hint = f"/drafter_kind hybrid {settings.lookup_max_ngram} {settings.drafter_window} auto"
    verdict = None
    if settings.drafter_options().chooses_head:
        verdict = session.choose_draft_source(retime="retime" in values)
    return ShowDraftSource(verdict, drafter, hint)


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
