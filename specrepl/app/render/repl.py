"""What the REPL and `--prompt` show, drawn with rich: `Renderer`.

It draws the start-up (a spinner while the models load, then the models
table), the result of each slash command, each answer (streamed by
answer.py's `AnswerView`, then its summary) and the one-line messages: notes,
errors, Ctrl-C and SIGTERM. A command's result is drawn by its type
(`Renderer.show`, one view per result class of commands/results.py).
`settings_line` and `loading_line` make the REPL's bottom toolbar.

The measuring commands and `distill` draw through subclasses (measure.py,
distill.py). It reads results and events; it never changes settings, never
calls a model, and knows nothing about how lines are read (prompt_toolkit
lives in app/repl.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from functools import singledispatchmethod
from typing import IO, TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from specrepl.app.commands.registry import ShowHelp
from specrepl.app.commands.results import (
    SAMPLING_SETTINGS,
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
from specrepl.app.render.answer import (
    SUMMARY_LEGEND,
    AnswerView,
    histograms,
    match_line,
    summary,
)
from specrepl.app.render.formatting import format_value, plain_table
from specrepl.app.render.models import models_table
from specrepl.chat.answers import GENERATORS, Answer
from specrepl.chat.settings import Settings
from specrepl.models.prompting import printable

if TYPE_CHECKING:
    from specrepl.app.startup import LoadingSession, ModelsArrived
    from specrepl.models.pair import ModelPair

__all__ = ["Renderer", "loading_line", "settings_line"]


def loading_line(stage: str) -> str:
    """The toolbar's start while the models load in the background."""
    return f" loading models: {printable(stage)} │"


def settings_line(settings: Settings) -> str:
    """The live settings in one line (the REPL's bottom toolbar)."""
    runs = " ".join(
        f"{name}{'✓' if getattr(settings, setting) else '✗'}"
        for name, setting in GENERATORS.items()
    )
    return (
        f" γ={settings.describe_gamma()} {settings.drafter_kind} │ "
        f"{settings.describe_processor()} │ {runs} │ "
        f"cache {format_value(settings.use_cache)} │ chat {format_value(settings.chat)} │ "
        f"debug {format_value(settings.debug)} │ max {settings.max_new_tokens} │ "
        f"seed {settings.seed}"
    )


class Renderer:
    """Draws everything on `console`; start-up progress goes to `status_console`."""

    def __init__(
        self,
        console: Console | None = None,
        *,
        status_console: Console | None = None,
        json_stream: IO[str] | None = None,
    ) -> None:
        self.console = console or Console(highlight=False)
        self.status_console = status_console or self.console
        self.json_stream = json_stream

    # -- start-up ----------------------------------------------------------

    @contextlib.contextmanager
    def loading(self, what: str) -> Iterator[Callable[[str], None]]:
        """A spinner (or, off a terminal, one line per message) while models load."""
        console = self.status_console
        if console.is_terminal:
            with console.status(what) as status:
                yield lambda message: status.update(Text(f"{what}: {message}"))
        else:
            console.print(what, style="dim")
            yield lambda message: console.print(Text(f"  {message}", style="dim"))

    def loaded(
        self,
        pair: ModelPair,
        head: dict[str, Any] | None = None,
        runtime: str | None = None,
        target_runtime: str | None = None,
    ) -> None:
        """The loaded models; `runtime` and `target_runtime`: what runs the drafter
        model and the target and why, once chosen."""
        self.console.print(models_table(pair, head, runtime, target_runtime))

    def welcome(self, interactive: bool) -> None:
        keys = " Ctrl-C stops a generation, Ctrl-D quits." if interactive else ""
        self.console.print(
            f"Type a prompt to compare the generators, [bold]/help[/bold] for commands.{keys}",
            style="dim",
        )

    def models_loading(self) -> None:
        self.console.print(
            "The models are loading (see the toolbar); commands work meanwhile, and a"
            " prompt waits for them.",
            style="dim",
        )

    def wait_for_models(self, session: LoadingSession) -> None:
        """A spinner with the loading stage until the models are loaded (or have
        failed); Ctrl-C ends the wait with KeyboardInterrupt."""
        with self.status_console.status("waiting for the models") as status:
            while not session.wait(0.1):
                status.update(Text(f"waiting for the models: {printable(session.stage)}"))

    def stopped_waiting(self) -> None:
        self.console.print(
            "Stopped waiting: that line was not run; the models go on loading.", style="yellow"
        )

    def models_arrived(self, arrived: ModelsArrived) -> None:
        """The models loaded in the background: the same table as a foreground start."""
        session = arrived.session
        target = session.target.summary(session.settings)
        self.loaded(session.pair, session.head_summary(), session.runtime_summary(), target)
        self.console.print(f"Models ready after {arrived.seconds:.1f} s.", style="dim")
        for notice in arrived.notices:
            self.error(notice)

    def echo(self, prompt: str, line: str) -> None:
        """Show a line read from a pipe, as if it had been typed."""
        self.console.print(Text(prompt, style="bold") + Text(line))

    def goodbye(self) -> None:
        self.console.print("Goodbye.", style="dim")

    def error(self, message: str, hint: str | None = None) -> None:
        self.console.print(Text("✗ ", style="bold red") + Text(message), soft_wrap=True)
        if hint:
            self.console.print(Text(f"  {hint}", style="dim"))

    def note(self, message: str) -> None:
        """A one-line status message, shown with the start-up messages (stderr)."""
        self.status_console.print(Text(message, style="dim"), soft_wrap=True)

    def fatal(self, message: str) -> None:
        """An error that ends the program (shown with the start-up messages, on stderr)."""
        self.status_console.print(Text("✗ ", style="bold red") + Text(message), soft_wrap=True)

    def interrupted(self, changed: bool = False) -> None:
        """Ctrl-C ended a command or an answer; `changed`: it had already changed
        the session (a setting, or an answer added to the history) when it came."""
        if changed:
            message = "Interrupted while drawing; the change to the session is kept."
        else:
            message = "Interrupted; the session is unchanged."
        self.console.print(message, style="yellow")

    def terminated(self) -> None:
        """SIGTERM ended the REPL (shown with the start-up messages, on stderr)."""
        self.status_console.print("Terminated.", style="yellow")

    def json(self, payload: object) -> None:
        """One JSON document on its own line, for scripts (no markup, no wrapping)."""
        stream = self.json_stream or sys.stdout
        stream.write(json.dumps(payload) + "\n")
        stream.flush()

    # -- command results ---------------------------------------------------

    @singledispatchmethod
    def show(self, result: object) -> None:
        raise TypeError(f"no view for {type(result).__name__}")

    @show.register
    def _(self, result: SettingsChanged) -> None:
        for change in result.changes:
            line = Text(f"{change.name}: ", style="bold")
            if change.old == change.new:
                line.append(f"{format_value(change.new)} (unchanged)")
            else:
                line.append(format_value(change.old), style="dim")
                line.append(" → ")
                line.append(format_value(change.new), style="cyan")
            self.console.print(line)
        if any(change.name in SAMPLING_SETTINGS for change in result.changes):
            described = result.settings.describe_processor()
            self.console.print(Text("sampling: ", style="bold") + Text(described, style="cyan"))

    @show.register
    def _(self, result: ShowSettings) -> None:
        settings = result.settings
        if len(result.names) == 1:
            name = result.names[0]
            self.console.print(
                Text(f"{name}: ", style="bold")
                + Text(format_value(getattr(settings, name)), style="cyan")
                + Text(f"  ({Settings.bound(name).describe()})", style="dim")
            )
            return
        table = plain_table("settings")
        table.add_column("setting", style="bold")
        table.add_column("value", style="cyan")
        table.add_column("valid values", style="dim")
        table.add_column("what it does")
        for name in result.names:
            table.add_row(
                name,
                Text(format_value(getattr(settings, name))),
                Text(Settings.bound(name).describe()),
                Text(Settings.help(name)),
            )
        self.console.print(table)
        if result.kept is not None:
            kept = ", ".join(f"{name} {tokens}" for name, tokens in result.kept.items() if tokens)
            self.console.print(
                f"Caches kept from the last turn (tokens): {kept}" if kept
                else "No cache is kept from the last turn: the next prompt is read whole.",
                style="dim",
            )  # fmt: skip

    @show.register
    def _(self, result: ShowModels) -> None:
        table = models_table(result.pair, result.head, result.runtime, result.target_runtime)
        self.console.print(table)

    @show.register
    def _(self, result: ShowDraftSource) -> None:
        if result.verdict is None:
            self.console.print(
                f"Nothing is timed: the drafter is {result.drafter}. A hybrid with head auto"
                f" drafts with the head or the model, whichever times faster here: {result.hint}"
            )
        else:
            self.console.print(f"Behind prompt lookup drafts {result.verdict}.")

    @show.register
    def _(self, result: ShowWidths) -> None:
        if result.device != "cpu":
            self.console.print(
                f"Forward widths are timed on a CPU only (the models run on {result.device}): "
                "every step feeds exactly its tokens."
            )
            return
        when = "measured just now" if result.measured else "measured at start-up or stored"
        table = plain_table(f"forward widths ({when}; /widths retime measures again)")
        table.add_column("model", style="bold")
        table.add_column("ms per width 1, 2, …", style="cyan")
        table.add_column("padded to a cheaper width")
        table.add_column("weight-first products at widths")
        table.add_column("packed products at widths")
        for role, plan in result.plans.items():
            if plan is None:
                table.add_row(role, "not timed (its torch model does not run)", "—", "—", "—")
                continue
            times = ", ".join(f"{seconds * 1e3:.1f}" for _, seconds in sorted(plan.seconds.items()))
            padded = [f"{w}→{p}" for w, p in sorted(plan.padded.items()) if p != w]
            weight_first = ", ".join(str(w) for w in sorted(plan.weight_first))
            packed = ", ".join(str(w) for w in sorted(plan.packed))
            if plan.packed_from is not None:
                packed = ", ".join(filter(None, (packed, f"{plan.packed_from} and up (prompts)")))
            table.add_row(
                role, times, ", ".join(padded) or "none", weight_first or "none", packed or "none"
            )
        self.console.print(table)

    @show.register
    def _(self, result: ShowHelp) -> None:
        if result.topic is not None:
            command = result.topic
            self.console.print(Text(command.usage(), style="bold") + Text(f"  {command.help}"))
            if command.aliases:
                aliases = ", ".join("/" + alias for alias in command.aliases)
                self.console.print(Text(f"  aliases: {aliases}", style="dim"))
            for argument in command.arguments:
                self.console.print(Text(f"  {argument.name}: {argument.help}; {argument.valid()}"))
            return
        table = plain_table("commands")
        table.add_column("command", style="bold", no_wrap=True)
        table.add_column("aliases", style="dim")
        table.add_column("what it does")
        for command in result.commands:
            bounds = [
                f"{argument.form()}: {argument.valid()}"
                for argument in command.arguments
                if argument.kind in (int, float)
            ]
            what = command.help + (f" ({'; '.join(bounds)})" if len(bounds) == 1 else "")
            table.add_row(
                Text(command.usage()),
                " ".join("/" + alias for alias in command.aliases),
                Text(what),
            )
        self.console.print(table)
        self.console.print(
            "Anything else is a prompt (start it with // to send a leading /). "
            "/help NAME explains one command.",
            style="dim",
        )
        self.console.print(SUMMARY_LEGEND, style="dim")

    @show.register
    def _(self, result: HistoryCleared) -> None:
        self.console.print(f"Chat history cleared ({result.turns} messages).")

    @show.register
    def _(self, result: ClearScreen) -> None:
        self.console.clear()

    @show.register
    def _(self, result: Quit) -> None:
        pass

    @show.register
    def _(self, result: CommandFailed) -> None:
        self.error(result.message, f"usage: {result.usage}" if result.usage else None)

    # -- answers -----------------------------------------------------------

    def stream(self) -> AnswerView:
        """The event callback that draws an answer while it is generated."""
        return AnswerView(self.console)

    def answer(self, answer: Answer) -> None:
        """After the runs: refusal or notices, the summary table, the debug histogram."""
        for notice in answer.notices:
            self.console.print(Text(f"note: {notice}", style="yellow"))
        if answer.refusal is not None:
            self.console.print(Text(answer.refusal, style="yellow"))
            return
        if answer.runs:
            self.console.print(summary(answer))
        match = answer.output_match
        if match is not None:
            self.console.print(match_line(match))
        if answer.interrupted:
            self.console.print(
                "Interrupted: the partial answer is not added to the chat history.",
                style="yellow",
            )
        speculative = answer.runs.get("speculative")
        if answer.settings.debug and speculative is not None and speculative.result.steps:
            self.console.print(histograms(speculative))
