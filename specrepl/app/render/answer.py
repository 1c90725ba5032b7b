"""How an answer is drawn: streamed as it is generated, then summed up.

`AnswerView` draws a live panel per generator, filled step by step (in debug
mode the accepted, rejected and corrected tokens of every speculative step);
`summary` is the table after each answer with the speedup, `match_line` says
under it whether the speculative tokens equal the target-only tokens, and
`histograms` is the debug mode's acceptance by draft position.

It reads answers and their events; it never changes the session and never
calls a model.
"""

from __future__ import annotations

import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specrepl.app.render.formatting import (
    BAR_WIDTH,
    DASH,
    number,
    plain_table,
    speedup_text,
)
from specrepl.chat.answers import Answer, Run, RunFinished, RunStarted, RunStep, SessionEvent
from specrepl.engine.output_match import OutputMatch
from specrepl.models.prompting import printable

__all__ = [
    "GENERATOR_STYLE",
    "SUMMARY_LEGEND",
    "AnswerView",
    "histograms",
    "match_line",
    "summary",
]

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


def match_line(match: OutputMatch) -> Text:
    """Under the summary: whether the speculative tokens equal the target-only ones
    (a greedy difference in bold red: it must not happen)."""
    line = f"speculative vs target-only: {match.describe()}"
    if match.near_tie:
        return Text(
            f"{line}: the target's top two logits there are within the pass's rounding,"
            " so either token is its greedy choice",
            style="yellow",
        )
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
            f"{result.new_tokens} tokens · {number(result.tokens_per_second, '.1f')} tok/s",
            style="dim",
        )
        if run.interrupted:
            subtitle = Text.assemble(("interrupted", "bold yellow"), " · ", subtitle)
        if self.live is not None:
            self.live.update(self.panel(subtitle), refresh=True)
            self.close()
        else:
            self.console.print(self.panel(subtitle))


def summary(answer: Answer) -> Table:
    """The table after each answer: one row per run, with its figures and speedup."""
    table = plain_table()
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
            ratio = Text("baseline" if has_baseline else DASH, style="dim")
        else:
            ratio = speedup_text(answer.speedup_of(name))
        table.add_row(
            label,
            str(result.new_tokens),
            f"{result.prompt_tokens - result.reused_prompt_tokens}/{result.prompt_tokens}",
            number(result.seconds if result.steps else None, ".2f"),
            number(result.tokens_per_second, ".1f"),
            number(None if ttft is None else ttft * 1000, ".0f", " ms"),
            number(result.acceptance_rate, ".0%"),
            number(result.mean_accepted_length, ".2f"),
            ratio,
            Text(result.stop_reason, style="yellow" if run.interrupted else "dim"),
        )
    return table


def histograms(run: Run) -> RenderableType:
    """In debug mode, under the summary: acceptance by draft position, drafts accepted
    per step, drafts by source, what the drafter read, and the legend of the steps."""
    positions = plain_table("acceptance by draft position")
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
            str(index), f"{count}/{drafted}", number(rate, ".0%"), Text(bar, style="green")
        )
    lengths = plain_table("drafts accepted per step")
    lengths.add_column("accepted", justify="right")
    lengths.add_column("steps", justify="right")
    lengths.add_column("", no_wrap=True)
    histogram = run.result.accepted_length_histogram
    most = max(histogram, default=0) or 1
    for length, steps in enumerate(histogram):
        bar = "█" * round(steps / most * BAR_WIDTH)
        lengths.add_row(str(length), str(steps), Text(bar, style="cyan"))
    result = run.result
    sources = plain_table("drafts by source")
    sources.add_column("source")
    sources.add_column("accepted", justify="right")
    sources.add_column("rate", justify="right")
    for source, drafted in result.drafted_by_source.items():
        taken = result.accepted_by_source.get(source, 0)
        sources.add_row(source, f"{taken}/{drafted}", number(taken / drafted, ".0%"))
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
