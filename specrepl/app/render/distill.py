"""What `distill` shows: its progress and the head it wrote (`DistillRenderer`).

On a terminal, a bar per data stage (prompts, answers, or the answer tokens
of a data directory with their rate) and one for training, with the time
left, the loss and the held-back agreement of each draft position; off a
terminal (a run in the background, its output in a log), a line per data
report and a training line every twentieth of the time budget. At the end,
the head's description, or what a data directory holds and the CPU time it
took.

It reads the progress reports and the description train/ gives; it never
trains or loads anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from specrepl.app.render.formatting import plain_table
from specrepl.app.render.repl import Renderer

if TYPE_CHECKING:
    from specrepl.train.data import DataProgress
    from specrepl.train.shards import DataSummary
    from specrepl.train.training import TrainProgress

__all__ = ["DistillRenderer"]

LINE_EVERY = 0.05
"""Off a terminal, a training line every this share of the time budget."""


def duration(seconds: float) -> str:
    """`1 h 05 min`, `12 min`, `40 s`."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
    return f"{int(seconds // 60)} min" if seconds >= 60 else f"{seconds:.0f} s"


def rate_text(report: DataProgress) -> str:
    """This run's answer tokens per second and the time left at that rate, or nothing."""
    if report.tokens_per_second is None:
        return ""
    left = "" if report.seconds_left is None else f", {duration(report.seconds_left)} left"
    return f"{report.tokens_per_second:.0f} tokens/s{left}"


def agreement_text(agreement: tuple[float, ...] | None) -> str:
    """The held-back agreement of each draft position, or nothing before it is measured."""
    if not agreement:
        return ""
    return "agree " + " ".join(f"{a:.2f}" for a in agreement)


def pace_text(report: TrainProgress) -> str:
    """Tokens a second of training, and the share of its time that went to the
    target's features (where a step's time goes)."""
    if report.seconds <= 0:
        return "starting"
    rate = report.tokens / report.seconds
    share = report.feature_seconds / report.seconds
    return f"{rate:,.0f} tokens/s, {share:.0%} on features"


class DistillLines:
    """Off a terminal: a line per data report, and a training line every twentieth
    of the time budget and whenever the agreement was measured."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.last_share = -1.0

    def data(self, report: DataProgress) -> None:
        if report.stage == "answer tokens":
            rate = rate_text(report)
            line = f"  answer tokens: {report.done}/{report.total}" + (f", {rate}" if rate else "")
        else:
            line = f"  {report.stage}: {report.done}/{report.total} ({report.tokens} answer tokens)"
        self.console.print(Text(line, style="dim"))

    def train(self, report: TrainProgress) -> None:
        share = report.seconds / max(report.budget_seconds, 1e-9)
        if report.agreement is None and share - self.last_share < LINE_EVERY:
            return
        self.last_share = share
        loss = "" if report.loss != report.loss else f", loss {report.loss:.3f}"  # NaN: none yet
        self.console.print(
            Text(
                f"  training: {report.seconds / 60:.1f}/{report.budget_seconds / 60:.3g} min,"
                f" {report.tokens} tokens ({pace_text(report)}){loss}"
                f" {agreement_text(report.agreement)}",
                style="dim",
            )
        )


class DistillBars:
    """On a terminal: a bar per data stage and one for training, the time left, the
    loss, and the last agreement measured."""

    COLUMNS = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[detail]}"),
    )

    def __init__(self, bars: Progress) -> None:
        self.bars = bars
        self.tasks: dict[str, TaskID] = {}
        self.agreement = ""

    def task(self, name: str, total: float) -> TaskID:
        if name not in self.tasks:
            self.tasks[name] = self.bars.add_task(name, total=total, detail="")
        return self.tasks[name]

    def data(self, report: DataProgress) -> None:
        if report.stage == "answer tokens":
            detail = rate_text(report)
        else:
            detail = f"{report.tokens} tokens" if report.tokens else ""
        self.bars.update(
            self.task(report.stage, report.total),
            completed=report.done,
            total=report.total,
            detail=detail,
        )

    def train(self, report: TrainProgress) -> None:
        if report.agreement is not None:
            self.agreement = agreement_text(report.agreement)
        loss = "" if report.loss != report.loss else f"loss {report.loss:.3f}  "  # NaN: none yet
        self.bars.update(
            self.task("training (s)", report.budget_seconds),
            completed=min(report.seconds, report.budget_seconds),
            detail=f"{pace_text(report)}  {loss}{self.agreement}",
        )


class DistillRenderer(Renderer):
    """The REPL's renderer, and the views of `distill`."""

    @contextlib.contextmanager
    def distill_progress(
        self,
    ) -> Iterator[tuple[Callable[[DataProgress], None], Callable[[TrainProgress], None]]]:
        """`(on_data, on_train)`: bars for the data stages and training on a terminal,
        lines off one (shown with the start-up messages, on stderr)."""
        console = self.status_console
        if not console.is_terminal:
            lines = DistillLines(console)
            yield lines.data, lines.train
            return
        with Progress(*DistillBars.COLUMNS, console=console) as bars:
            shown = DistillBars(bars)
            yield shown.data, shown.train

    def distilled(self, description: dict[str, Any], output: str) -> None:
        """What `distill` wrote: the head, its data and its held-back agreement."""
        table = plain_table("draft head")
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
            *(
                [("data CPU time", f"{duration(data['cpu_seconds'])} ({data['directory']})")]
                if "cpu_seconds" in data
                else []
            ),
            ("training", f"{training['seconds'] / 60:.1f} min, {training['tokens']} tokens"),
            ("held-back agreement", " ".join(f"{a:.3f}" for a in description[agreement])),
        )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)

    def data_written(self, summary: DataSummary, run_cpu_seconds: float) -> None:
        """What a data directory holds, its size and the CPU time it took in all."""
        table = plain_table("distill data")
        table.add_column("", style="bold")
        table.add_column("")
        tokens = summary.prompt_tokens + summary.answer_tokens
        per_token = summary.bytes / tokens if tokens else 0.0
        rows = (
            ("directory", str(summary.directory)),
            (
                "shards",
                f"{summary.shards} ({summary.bytes / 1e6:.2f} MB, {per_token:.2f} bytes a token)",
            ),
            ("answers", f"{summary.records} ({summary.prompt_tokens} prompt tokens)"),
            ("answer tokens", str(summary.answer_tokens)),
            (
                "CPU time",
                f"{duration(summary.cpu_seconds)} in all, {duration(run_cpu_seconds)} this run",
            ),
        )
        for name, value in rows:
            table.add_row(name, value)
        self.console.print(table)
