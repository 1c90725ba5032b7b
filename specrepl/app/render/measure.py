"""What the measuring commands show: `soak` and `replay` (`MeasureRenderer`).

A progress bar (off a terminal, a line every tenth of the way), the models
table (the REPL's), the soak's counts, memory figures, mismatches and verdict,
and the replay's per-turn figures of the two sessions. `bench` draws its own
tables (measure/bench/tables.py).

It reads the results measure/ returns; it never runs a command or a model.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from specrepl.app.render.formatting import (
    DASH,
    format_bytes,
    maybe_bytes,
    number,
    plain_table,
    signed_bytes,
)
from specrepl.app.render.repl import Renderer

if TYPE_CHECKING:
    from specrepl.measure.replay import ReplayResult, TurnFigures
    from specrepl.measure.soak.result import SoakResult

__all__ = ["MeasureRenderer"]

MISMATCHES_SHOWN = 10
UNSEEN_WIDTH = 100


class MeasureRenderer(Renderer):
    """The REPL's renderer, and the views of `soak` and `replay`."""

    @contextlib.contextmanager
    def unseen(self) -> Iterator[Renderer]:
        """A renderer that draws into nowhere (os.devnull): the soak draws every
        answer as the REPL does, for the memory that takes, without showing it."""
        with open(os.devnull, "w", encoding="utf-8") as sink:
            yield Renderer(Console(file=sink, width=UNSEEN_WIDTH))

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

    def soak_report(self, result: SoakResult) -> None:
        """The soak's counts, memory figures and mismatches, and its verdict (against
        `result.growth_limit`, the RSS growth allowed after the warm-up)."""
        table = plain_table("soak")
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
                maybe_bytes(result.rss_after_warmup),
            ),
            ("RSS at the end", maybe_bytes(result.rss_end)),
            ("growth after the warm-up", signed_bytes(result.growth)),
            ("highest growth after the warm-up", signed_bytes(result.max_growth)),
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
        limit = result.growth_limit
        if result.interrupted:
            self.console.print(
                "Interrupted: the figures cover the prompts answered.", style="yellow"
            )
        elif not result.passed:
            allowed = "" if limit is None else f" (allowed: {format_bytes(limit)})"
            self.console.print(
                f"FAILED: {len(result.mismatches)} mismatches; RSS grew "
                f"{signed_bytes(result.growth)} after the warm-up{allowed}.",
                style="bold red",
            )
        else:
            self.console.print(
                f"OK: no mismatches; RSS grew {signed_bytes(result.growth)} after the warm-up.",
                style="bold green",
            )

    def replay_report(self, result: ReplayResult) -> None:
        """Per turn: prompt tokens, and per session and generator the tokens fed,
        TTFT and tok/s; then how the first-token time grew from the first turn."""
        generators = list(dict.fromkeys(f.generator for f in result.figures))
        rows: dict[tuple[int, str, str], TurnFigures] = {
            (f.turn, f.mode, f.generator): f for f in result.figures
        }
        table = plain_table("a scripted chat: caches kept between turns vs dropped")
        columns = [(mode, name) for mode in result.MODES for name in generators]
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
                ttft = number(None if f.time_to_first_token is None
                               else f.time_to_first_token * 1e3, ".0f", " ms")  # fmt: skip
                cells.append(f"{f.fed} · {ttft} · {number(f.tokens_per_second, '.1f')}")
            table.add_row(str(turn + 1), prompt, *cells)
        self.console.print(table)
        for name in generators:
            kept, dropped = (result.first_token_growth(mode, name) for mode in result.MODES)
            self.console.print(
                f"{name}: time to first token, last turn over first: caches kept "
                f"{number(kept, '.2f', '×')}, dropped {number(dropped, '.2f', '×')}"
            )
        if result.mismatched_turns:
            turns = ", ".join(str(turn + 1) for turn in result.mismatched_turns)
            self.error(f"the two sessions gave different tokens in turns {turns}")
        elif result.turns:
            self.console.print("Both sessions gave the same tokens in every turn.", style="green")
        if result.refusal is not None:
            self.error(f"stopped after {result.turns} turns: {result.refusal}")
