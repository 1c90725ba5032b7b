"""Formatting that every view shares: values, sizes, counts, optional numbers,
speedups, and the plain table style of every table specrepl draws.

It formats; it never prints and knows nothing of settings, sessions or models.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

__all__ = [
    "BAR_WIDTH",
    "DASH",
    "format_bytes",
    "format_value",
    "maybe_bytes",
    "number",
    "plain_table",
    "short_count",
    "signed_bytes",
    "speedup_text",
]

DASH = "—"
"""What a figure that does not exist is shown as."""
BAR_WIDTH = 30
"""Characters of a full bar in a histogram."""
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


def number(value: float | None, spec: str, suffix: str = "") -> str:
    """`value` in the format `spec`, or a dash for none."""
    return DASH if value is None else f"{value:{spec}}{suffix}"


def short_count(value: int) -> str:
    """A large count in k, M or B (parameters)."""
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


def signed_bytes(value: int | None) -> str:
    """A growth in bytes, with its sign; a dash for none."""
    if value is None:
        return DASH
    return ("+" if value >= 0 else "-") + format_bytes(abs(value))


def maybe_bytes(value: int | None) -> str:
    """A size, or a dash for none."""
    return DASH if value is None else format_bytes(value)


def plain_table(title: str | None = None) -> Table:
    """An empty table in specrepl's style: a rule under the heads, no frame."""
    return Table(
        title=title,
        title_justify="left",
        title_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )


def speedup_text(value: float | None) -> Text:
    """A speedup as `1.23×`: green above 1, red below."""
    if value is None:
        return Text(DASH, style="dim")
    style = "bold green" if value > 1 else "bold red" if value < 1 else ""
    return Text(f"{value:.2f}×", style=style)
