"""Everything specrepl shows on the terminal, drawn with rich.

This is the only module that prints. It draws the loaded models, the result of
each command, the streamed answer of each generator (a panel per generator,
updated as steps arrive; in debug mode the accepted, rejected and corrected
tokens of every speculative step), the summary table with the speedup and,
under it, whether the speculative tokens equal the target-only tokens, the
per-position acceptance histogram, and the progress and result of a soak.
`settings_line` gives the one-line summary
that the REPL puts in its bottom toolbar.

It reads results and events; it never changes settings, never calls a model,
and knows nothing about how lines are read (prompt_toolkit lives in repl.py).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from functools import singledispatchmethod
from typing import IO, TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from specrepl.app.commands import (
    SAMPLING_SETTINGS,
    ClearScreen,
    CommandFailed,
    HistoryCleared,
    Quit,
    SettingsChanged,
    ShowHelp,
    ShowModels,
    ShowSettings,
    ShowWidths,
)
from specrepl.chat.answers import (
    GENERATORS,
    Answer,
    Run,
    RunFinished,
    RunStarted,
    RunStep,
    SessionEvent,
)
from specrepl.chat.settings import Settings
from specrepl.engine.output_match import OutputMatch
from specrepl.measure.replay import MODES as REPLAY_MODES
from specrepl.models.prompting import printable

if TYPE_CHECKING:
    from specrepl.app.startup import LoadingSession, ModelsArrived
    from specrepl.measure.replay import ReplayResult, TurnFigures
    from specrepl.measure.soak import SoakResult
    from specrepl.models.pair import LoadedModel, ModelPair
    from specrepl.train.data import DataProgress
    from specrepl.train.training import TrainProgress

__all__ = [
    "AnswerView",
    "Renderer",
    "format_bytes",
    "format_value",
    "loading_line",
    "settings_line",
]

DASH = "—"
GENERATOR_STYLE = {"speculative": "green", "target": "blue", "drafter": "magenta"}
GENERATOR_TITLE = {
    "speculative": "speculative",
    "target": "target only",
    "drafter": "drafter only",
}
ACCEPTED_STYLE = "green"
REJECTED_STYLE = "red strike"
TARGET_STYLE = "bold blue"
REFRESH_SECONDS = 1 / 15
SUMMARY_COLUMNS = ("tokens", "fed", "secs", "tok/s", "TTFT", "accept", "tok/step", "speedup")
SUMMARY_LEGEND = (
    "In the summary after each answer: tokens are new tokens; fed is the prompt tokens the "
    "model read for this answer out of the prompt's length (the rest it kept from the last "
    "turn); TTFT is the time to the first token; accept is accepted drafts / drafted "
    "tokens; tok/step is tokens per target forward pass; speedup is tokens/s over the "
    "target-only run."
)
BAR_WIDTH = 30
MISMATCHES_SHOWN = 10


VALUE_SHOWN_MAX = 60


def format_value(value: Any) -> str:
    """A setting's value as the user types it; a long text is cut, with its length."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    text = str(value)
    if len(text) > VALUE_SHOWN_MAX:
        return f"{text[:VALUE_SHOWN_MAX]}… ({len(text)} characters)"
    return text


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


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    return DASH if value is None else f"{value:{spec}}{suffix}"


def _count(value: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def format_bytes(value: int) -> str:
    """A size in B, KiB, MiB or GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _signed_bytes(value: int | None) -> str:
    if value is None:
        return DASH
    return ("+" if value >= 0 else "-") + format_bytes(abs(value))


def _maybe_bytes(value: int | None) -> str:
    return DASH if value is None else format_bytes(value)


def _table(title: str | None = None) -> Table:
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )


def _speedup(value: float | None) -> Text:
    if value is None:
        return Text(DASH, style="dim")
    style = "bold green" if value > 1 else "bold red" if value < 1 else ""
    return Text(f"{value:.2f}×", style=style)


def _match_line(match: OutputMatch) -> Text:
    """Under the summary: whether the speculative tokens equal the target-only ones
    (a greedy difference in bold red: it must not happen)."""
    line = f"speculative vs target-only: {match.describe()}"
    if match.alarming:
        return Text(
            f"{line} (greedy speculative decoding must give the target's own tokens:"
            " a near-tie flipped by another kernel order, or a bug)",
            style="bold red",
        )
    return Text(line + (" tokens" if match.identical else ""), style="dim")


class AnswerView:
    """Streams one answer: a live panel per generator, filled step by step.

    Call it with each `SessionEvent`; use it as a context manager so that a
    panel still open when an exception passes is closed.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live: Live | None = None
        self.body = Text()
        self.title = ""
        self.style = ""
        self.debug = False
        self.last_refresh = 0.0

    def __enter__(self) -> AnswerView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    def __call__(self, event: SessionEvent) -> None:
        if isinstance(event, RunStarted):
            self.start(event)
        elif isinstance(event, RunStep):
            self.step(event)
        elif isinstance(event, RunFinished):
            self.finish(event.run)

    def panel(self, subtitle: str | Text | None = None) -> Panel:
        return Panel(
            self.body,
            title=self.title,
            title_align="left",
            subtitle=subtitle,
            subtitle_align="right",
            border_style=self.style,
        )

    def start(self, event: RunStarted) -> None:
        self.close()
        settings = event.settings
        details = [GENERATOR_TITLE[event.generator]]
        if event.generator == "speculative":
            details.append(f"{settings.drafter_kind} drafter")
            details.append(f"γ={settings.describe_gamma()}")
        details.append(settings.describe_processor())
        self.title = f"[bold]{details[0]}[/bold] · " + " · ".join(details[1:])
        self.style = GENERATOR_STYLE[event.generator]
        self.debug = settings.debug and event.generator == "speculative"
        self.body = Text()
        if not self.console.is_terminal:
            return  # a file or a pipe gets each panel once, when its run ends
        self.live = Live(
            self.panel(Text(f"{event.prompt_tokens} prompt tokens", style="dim")),
            console=self.console,
            auto_refresh=False,
            vertical_overflow="visible",
        )
        self.live.start()
        self.last_refresh = time.monotonic()

    def step(self, event: RunStep) -> None:
        pieces = event.pieces
        if self.debug and pieces is not None:
            # the source and gamma the policy chose for this step, before its tokens
            # (L: prompt lookup, M: the drafter model, H: a draft head, N: n-grams)
            source = event.step.source[:1].upper()
            self.body.append(f"‹{source}{event.step.requested_gamma}›", style="dim")
            for piece in pieces.accepted:
                self.body.append(printable(piece), style=ACCEPTED_STYLE)
            if pieces.rejected is not None:
                self.body.append(printable(pieces.rejected), style=REJECTED_STYLE)
            if pieces.target is not None:
                self.body.append(printable(pieces.target), style=TARGET_STYLE)
        else:
            self.body.append(printable(event.text))
        now = time.monotonic()
        if self.live is not None and now - self.last_refresh >= REFRESH_SECONDS:
            self.live.update(self.panel(), refresh=True)
            self.last_refresh = now

    def finish(self, run: Run) -> None:
        result = run.result
        if not self.debug:
            self.body = Text(printable(run.text))
        subtitle = Text(
            f"{result.new_tokens} tokens · {_number(result.tokens_per_second, '.1f')} tok/s",
            style="dim",
        )
        if run.interrupted:
            subtitle = Text.assemble(("interrupted", "bold yellow"), " · ", subtitle)
        if self.live is not None:
            self.live.update(self.panel(subtitle), refresh=True)
            self.close()
        else:
            self.console.print(self.panel(subtitle))


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
        self, pair: ModelPair, head: dict[str, Any] | None = None, runtime: str | None = None
    ) -> None:
        """The loaded models; `runtime`: what runs the drafter model and why, once chosen."""
        self.console.print(self._models_table(pair, head, runtime))

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
        self.loaded(session.pair, session.head_summary(), session.runtime_summary())
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
        table = _table("settings")
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
        self.console.print(self._models_table(result.pair, result.head, result.runtime))

    @show.register
    def _(self, result: ShowWidths) -> None:
        if result.device != "cpu":
            self.console.print(
                f"Forward widths are timed on a CPU only (the models run on {result.device}): "
                "every step feeds exactly its tokens."
            )
            return
        when = "measured just now" if result.measured else "measured at start-up or stored"
        table = _table(f"forward widths ({when}; /widths retime measures again)")
        table.add_column("model", style="bold")
        table.add_column("ms per width 1, 2, …", style="cyan")
        table.add_column("padded to a cheaper width")
        table.add_column("weight-first products at widths")
        for role, plan in result.plans.items():
            if plan is None:
                table.add_row(role, "not timed", "none", "none")
                continue
            times = ", ".join(f"{seconds * 1e3:.1f}" for _, seconds in sorted(plan.seconds.items()))
            padded = [f"{w}→{p}" for w, p in sorted(plan.padded.items()) if p != w]
            weight_first = ", ".join(str(w) for w in sorted(plan.weight_first))
            table.add_row(role, times, ", ".join(padded) or "none", weight_first or "none")
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
        table = _table("commands")
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
            self.console.print(self._summary(answer))
        match = answer.output_match
        if match is not None:
            self.console.print(_match_line(match))
        if answer.interrupted:
            self.console.print(
                "Interrupted: the partial answer is not added to the chat history.",
                style="yellow",
            )
        speculative = answer.runs.get("speculative")
        if answer.settings.debug and speculative is not None and speculative.result.steps:
            self.console.print(self._histograms(speculative))

    def _summary(self, answer: Answer) -> Table:
        table = _table()
        table.add_column("generator", no_wrap=True)
        for heading in SUMMARY_COLUMNS:
            table.add_column(heading, justify="right", no_wrap=True)
        table.add_column("stop", no_wrap=True)
        has_baseline = "target" in answer.runs and len(answer.runs) > 1
        for name, run in answer.runs.items():
            result = run.result
            ttft = result.time_to_first_token
            label = Text(name, style=GENERATOR_STYLE[name])
            if name == "target":
                speedup = Text("baseline" if has_baseline else DASH, style="dim")
            else:
                speedup = _speedup(answer.speedup_of(name))
            table.add_row(
                label,
                str(result.new_tokens),
                f"{result.prompt_tokens - result.reused_prompt_tokens}/{result.prompt_tokens}",
                _number(result.seconds if result.steps else None, ".2f"),
                _number(result.tokens_per_second, ".1f"),
                _number(None if ttft is None else ttft * 1000, ".0f", " ms"),
                _number(result.acceptance_rate, ".0%"),
                _number(result.mean_accepted_length, ".2f"),
                speedup,
                Text(result.stop_reason, style="yellow" if run.interrupted else "dim"),
            )
        return table

    def _histograms(self, run: Run) -> RenderableType:
        positions = _table("acceptance by draft position")
        positions.add_column("position", justify="right")
        positions.add_column("accepted", justify="right")
        positions.add_column("rate", justify="right")
        positions.add_column("", no_wrap=True)
        accepted = run.result.accepted_per_position
        for index, (count, rate) in enumerate(
            zip(accepted, run.result.acceptance_per_position, strict=False), start=1
        ):
            drafted = run.result.drafted_per_position[index - 1]
            bar = "█" * round((rate or 0.0) * BAR_WIDTH)
            positions.add_row(
                str(index), f"{count}/{drafted}", _number(rate, ".0%"), Text(bar, style="green")
            )
        lengths = _table("drafts accepted per step")
        lengths.add_column("accepted", justify="right")
        lengths.add_column("steps", justify="right")
        lengths.add_column("", no_wrap=True)
        histogram = run.result.accepted_length_histogram
        most = max(histogram, default=0) or 1
        for length, steps in enumerate(histogram):
            bar = "█" * round(steps / most * BAR_WIDTH)
            lengths.add_row(str(length), str(steps), Text(bar, style="cyan"))
        result = run.result
        sources = _table("drafts by source")
        sources.add_column("source")
        sources.add_column("accepted", justify="right")
        sources.add_column("rate", justify="right")
        for source, drafted in result.drafted_by_source.items():
            taken = result.accepted_by_source.get(source, 0)
            sources.add_row(source, f"{taken}/{drafted}", _number(taken / drafted, ".0%"))
        taken = (
            f", took the target's keys and values for {result.imported_tokens} positions in "
            f"{result.import_seconds:.2f} s"
            if result.imported_tokens
            else ""
        )
        reads = Text(
            f"the drafter read {result.read_tokens} context tokens in "
            f"{result.read_seconds:.2f} s{taken}; last step's choice: "
            f"{next((why for *_, why in reversed(result.choices) if why), '-')}",
            style="dim",
        )
        legend = Text.assemble(
            "debug: ‹L4› lookup drafted 4, ‹M› the model, ‹H› a head, ‹N› n-grams, ‹0› none; ",
            ("accepted draft", ACCEPTED_STYLE),
            "  ",
            ("rejected draft", REJECTED_STYLE),
            "  ",
            ("target's token (correction or bonus)", TARGET_STYLE),
            style="dim",
        )
        return Group(legend, positions, lengths, sources, reads)

    # -- distill -----------------------------------------------------------

    @contextlib.contextmanager
    def distill_progress(
        self,
    ) -> Iterator[tuple[Callable[[DataProgress], None], Callable[[TrainProgress], None]]]:
        """Bars for the data stages and training (ETA, loss, held-back agreement
        of each draft position); off a terminal, a line every few percent."""
        console = self.status_console
        last_line = {"share": -1.0}

        def agreement_text(agreement: tuple[float, ...] | None) -> str:
            if not agreement:
                return ""
            return "agree " + " ".join(f"{a:.2f}" for a in agreement)

        if not console.is_terminal:

            def data_line(report: DataProgress) -> None:
                console.print(
                    Text(
                        f"  {report.stage}: {report.done}/{report.total}"
                        f" ({report.tokens} answer tokens)",
                        style="dim",
                    )
                )

            def train_line(report: TrainProgress) -> None:
                share = report.seconds / max(report.budget_seconds, 1e-9)
                if report.agreement is None and share - last_line["share"] < 0.05:
                    return
                last_line["share"] = share
                console.print(
                    Text(
                        f"  training: {report.seconds / 60:.1f}"
                        f"/{report.budget_seconds / 60:.0f} min,"
                        f" {report.tokens} tokens, loss {report.loss:.3f}"
                        f" {agreement_text(report.agreement)}",
                        style="dim",
                    )
                )

            yield data_line, train_line
            return
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[detail]}"),
        )
        with Progress(*columns, console=console) as bars:
            tasks: dict[str, Any] = {}
            shown = {"agreement": ""}

            def task(name: str, total: float) -> Any:
                if name not in tasks:
                    tasks[name] = bars.add_task(name, total=total, detail="")
                return tasks[name]

            def on_data(report: DataProgress) -> None:
                detail = f"{report.tokens} tokens" if report.tokens else ""
                bars.update(
                    task(report.stage, report.total),
                    completed=report.done,
                    total=report.total,
                    detail=detail,
                )

            def on_train(report: TrainProgress) -> None:
                if report.agreement is not None:
                    shown["agreement"] = agreement_text(report.agreement)
                loss = "" if report.loss != report.loss else f"loss {report.loss:.3f}  "
                bars.update(
                    task("training (s)", report.budget_seconds),
                    completed=min(report.seconds, report.budget_seconds),
                    detail=f"{loss}{shown['agreement']}",
                )

            yield on_data, on_train

    def distilled(self, description: dict[str, Any], output: str) -> None:
        """What `distill` wrote: the head, its data and its held-back agreement."""
        table = _table("draft head")
        table.add_column("", style="bold")
        table.add_column("")
        training = description["training"]
        data = description["data"]
        agreement = "held_back_agreement"
        rows = (
            ("written to", output),
            ("target", f"{description['target']['name']} ({description['target']['fingerprint']})"),
            ("parameters", f"{description['parameters']:,} trained"),
            ("draft vocabulary", f"{description['draft_vocab']} most frequent tokens"),
            ("data", f"{data['prompt_count']} prompts, {data['answer_tokens']} answer tokens"),
            ("training", f"{training['seconds'] / 60:.1f} min, {training['tokens']} tokens"),
            ("held-back agreement", " ".join(f"{a:.3f}" for a in description[agreement])),
        )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)

    # -- soak --------------------------------------------------------------

    @contextlib.contextmanager
    def progress(self, what: str, total: int) -> Iterator[Callable[[int, int], None]]:
        """A bar on a terminal, else a line every tenth of the way; yields
        `advance(done, total)`. Shown with the start-up messages (stderr)."""
        console = self.status_console
        if not console.is_terminal:
            every = max(1, total // 10)

            def line(done: int, total: int) -> None:
                if done % every == 0 or done == total:
                    console.print(Text(f"  {what}: {done}/{total}", style="dim"))

            yield line
            return
        columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(what, total=total)
            yield lambda done, total: bar.update(task, completed=done, total=total)

    def soak_report(self, result: SoakResult, max_growth: int | None = None) -> None:
        """The soak's counts, memory figures and mismatches, and a verdict
        (`max_growth`: the RSS growth in bytes allowed after the warm-up)."""
        table = _table("soak")
        table.add_column("", style="bold")
        table.add_column("", justify="right")
        rows = (
            ("prompts answered", str(result.prompts)),
            ("compared with a fresh session", str(result.compared)),
            ("not repeatable, not compared", str(result.skipped)),
            ("refused", str(result.refusals)),
            ("history resets", str(result.resets)),
            ("seconds", f"{result.seconds:.1f}"),
            ("RSS at the start", format_bytes(result.rss_start)),
            (
                f"RSS after the warm-up ({result.warmup} prompts)",
                _maybe_bytes(result.rss_after_warmup),
            ),
            ("RSS at the end", _maybe_bytes(result.rss_end)),
            ("growth after the warm-up", _signed_bytes(result.growth)),
            ("highest growth after the warm-up", _signed_bytes(result.max_growth)),
            ("mismatches", str(len(result.mismatches))),
        )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)
        for mismatch in result.mismatches[:MISMATCHES_SHOWN]:
            self.error(
                f"prompt {mismatch.prompt_index + 1} ({mismatch.prompt!r}): {mismatch.what} "
                f"differs from a fresh session",
                f"expected {mismatch.expected}, got {mismatch.got}" if mismatch.expected else None,
            )
        hidden = len(result.mismatches) - MISMATCHES_SHOWN
        if hidden > 0:
            self.console.print(Text(f"… and {hidden} more mismatches", style="red"))
        grew_too_much = (
            max_growth is not None and result.growth is not None and result.growth > max_growth
        )
        if result.interrupted:
            self.console.print(
                "Interrupted: the figures cover the prompts answered.", style="yellow"
            )
        elif result.mismatches or grew_too_much:
            limit = "" if max_growth is None else f" (allowed: {format_bytes(max_growth)})"
            self.console.print(
                f"FAILED: {len(result.mismatches)} mismatches; RSS grew "
                f"{_signed_bytes(result.growth)} after the warm-up{limit}.",
                style="bold red",
            )
        else:
            self.console.print(
                f"OK: no mismatches; RSS grew {_signed_bytes(result.growth)} after the warm-up.",
                style="bold green",
            )

    def replay_report(self, result: ReplayResult) -> None:
        """Per turn: prompt tokens, and per session and generator the tokens fed,
        TTFT and tok/s; then how the first-token time grew from the first turn."""
        generators = list(dict.fromkeys(f.generator for f in result.figures))
        rows: dict[tuple[int, str, str], TurnFigures] = {
            (f.turn, f.mode, f.generator): f for f in result.figures
        }
        table = _table("a scripted chat: caches kept between turns vs dropped")
        columns = [(mode, name) for mode in REPLAY_MODES for name in generators]
        table.add_column("turn", justify="right")
        table.add_column("prompt", justify="right")
        for mode, name in columns:
            table.add_column(f"{mode}: {name} fed · TTFT · tok/s", justify="right")
        for turn in range(result.turns):
            cells, prompt = [], DASH
            for mode, name in columns:
                f = rows.get((turn, mode, name))
                if f is None:
                    cells.append(DASH)
                    continue
                prompt = str(f.prompt_tokens)
                ttft = _number(None if f.time_to_first_token is None
                               else f.time_to_first_token * 1e3, ".0f", " ms")  # fmt: skip
                cells.append(f"{f.fed} · {ttft} · {_number(f.tokens_per_second, '.1f')}")
            table.add_row(str(turn + 1), prompt, *cells)
        self.console.print(table)
        for name in generators:
            kept, dropped = (result.first_token_growth(mode, name) for mode in REPLAY_MODES)
            self.console.print(
                f"{name}: time to first token, last turn over first: caches kept "
                f"{_number(kept, '.2f', '×')}, dropped {_number(dropped, '.2f', '×')}"
            )
        if result.mismatched_turns:
            turns = ", ".join(str(turn + 1) for turn in result.mismatched_turns)
            self.error(f"the two sessions gave different tokens in turns {turns}")
        elif result.turns:
            self.console.print("Both sessions gave the same tokens in every turn.", style="green")
        if result.refusal is not None:
            self.error(f"stopped after {result.turns} turns: {result.refusal}")

    # -- models ------------------------------------------------------------

    def _models_table(
        self, pair: ModelPair, head: dict[str, Any] | None = None, runtime: str | None = None
    ) -> RenderableType:
        table = _table()
        table.add_column("", style="bold")
        table.add_column("model")
        table.add_column("dtype")
        table.add_column("quant.")
        table.add_column("params", justify="right")
        table.add_column("memory", justify="right")
        table.add_column("loaded in", justify="right")
        roles: list[tuple[str, LoadedModel | None]] = [
            ("target", pair.target),
            ("drafter", pair.drafter),
        ]
        for role, model in roles:
            if model is None:
                why = "the draft head drafts" if head else "speculative decoding is off"
                table.add_row(role, Text(f"none ({why})", style="dim"))
                continue
            cached = " (cache)" if model.from_cache else ""
            name = Text(model.name)
            if model.kind != model.name:
                name.append(f" ({model.kind})", style="dim")
            if role == "drafter" and runtime is not None:
                name.append(f" (drafts in {runtime})", style="dim")
            elif role == "drafter" and pair.drafter_is_copy:
                name.append(" (a copy of the target: takes its keys and values)", style="dim")
            table.add_row(
                role,
                name,
                str(model.dtype).removeprefix("torch."),
                model.quantization or DASH,
                _count(model.parameters),
                format_bytes(model.memory_bytes),
                f"{model.load_seconds:.1f} s{cached}",
            )
        if head is not None:
            agreement = " ".join(f"{a:.2f}" for a in head.get("held_back_agreement", []))
            table.add_row(
                "draft head",
                Text(head["path"]).append(
                    f" ({head.get('draft_vocab')} tokens; for {head['target'].get('name')};"
                    f" held-back agreement {agreement or 'not measured'})",
                    style="dim",
                ),
                head.get("dtype", DASH),
                DASH,
                _count(int(head.get("parameters", 0))),
                DASH,
                DASH,
            )
        footer = Text(
            f"device {pair.device} · vocabulary {pair.vocab_size} · "
            f"context {pair.context_length} · end tokens {pair.eos_token_ids}",
            style="dim",
        )
        return Group(table, footer)
