"""Benchmark prompts: Spec-Bench questions read from JSONL and checked line by line.

A prompts file holds one JSON object a line with `question_id`, `category` and
`turns`: the user's messages of one conversation, in order (Spec-Bench's 80
MT-bench questions have two; the others one). `load_prompts` keeps the
asked-for categories and at most `limit` questions per category, every turn of
each, and names the file and line of anything malformed;
`default_prompts_path` finds the copy that ships with the repository.

`conversations` says which turns are asked in one conversation: each
question's own turns (turn 2 follows turn 1 and its answer, as Spec-Bench
runs them), or with `bench --chat` every turn of the file, one chat.
`BenchTurn` is one user turn; its `key` names it (`writing/81#2`), and a
`Conversation` holds what one conversation has asked and answered so far.

Plain data: no torch, no rich, no model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specrepl.chat.answers import Message
from specrepl.store.paths import PACKAGE_DIR

__all__ = [
    "PROMPTS_FILE",
    "BenchError",
    "BenchPrompt",
    "BenchTurn",
    "Conversation",
    "conversations",
    "default_prompts_path",
    "load_prompts",
]

PROMPTS_FILE = Path("benchmarks") / "spec_bench.jsonl"


class BenchError(ValueError):
    """A benchmark input (prompts file, flag value, model pair) that cannot be used."""


@dataclass(frozen=True)
class BenchPrompt:
    """One Spec-Bench question: its id, its category and its turns (the user's
    messages of one conversation, in order)."""

    question_id: int | str
    category: str
    turns: tuple[str, ...]

    def __post_init__(self) -> None:
        if (
            not isinstance(self.turns, tuple)
            or not self.turns
            or not all(isinstance(turn, str) for turn in self.turns)
        ):
            raise TypeError(f"turns must be a non-empty tuple of strings, got {self.turns!r}")

    @property
    def text(self) -> str:
        """The first turn."""
        return self.turns[0]

    @property
    def key(self) -> str:
        return f"{self.category}/{self.question_id}"

    def each_turn(self) -> list[BenchTurn]:
        return [BenchTurn(self, number) for number in range(1, len(self.turns) + 1)]


@dataclass(frozen=True)
class BenchTurn:
    """One user turn of a question: `number` counts its turns from 1."""

    prompt: BenchPrompt
    number: int = 1

    @property
    def text(self) -> str:
        return self.prompt.turns[self.number - 1]

    @property
    def category(self) -> str:
        return self.prompt.category

    @property
    def question_id(self) -> int | str:
        return self.prompt.question_id

    @property
    def key(self) -> str:
        """`writing/81#2` for a turn of a question with several; `qa/5` for the only one."""
        if len(self.prompt.turns) == 1:
            return self.prompt.key
        return f"{self.prompt.key}#{self.number}"


def conversations(prompts: Sequence[BenchPrompt], *, one_chat: bool) -> list[list[BenchTurn]]:
    """The turns asked in each conversation, in order: every question's own
    turns, or with `one_chat` every turn of every question in one chat."""
    if one_chat:
        return [[turn for prompt in prompts for turn in prompt.each_turn()]] if prompts else []
    return [prompt.each_turn() for prompt in prompts]


def default_prompts_path(
    repo_root: Path | None = None, cwd: Path | None = None
) -> tuple[Path | None, list[Path]]:
    """The Spec-Bench questions, and every place that was looked at.

    The repository ships them (`benchmarks/spec_bench.jsonl`, see
    `benchmarks/README.md`); for an installed package without the checkout,
    the same path under the working directory is looked at next.
    """
    root = repo_root or PACKAGE_DIR.parent
    here = cwd or Path.cwd()
    candidates: list[Path] = [(root / PROMPTS_FILE).resolve()]
    if (here / PROMPTS_FILE).resolve() not in candidates:
        candidates.append((here / PROMPTS_FILE).resolve())
    found = next((path for path in candidates if path.is_file()), None)
    return found, candidates


def _question_id(value: Any, where: str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise BenchError(f"{where}: question_id must be an integer or a string, got {value!r}")
    return value


def _record(line: str, where: str) -> BenchPrompt:
    """One line of a prompts file as a question; BenchError naming `where` if malformed."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise BenchError(f"{where}: expected a JSON object with question_id, category, turns")
    missing = [key for key in ("question_id", "category", "turns") if key not in item]
    if missing:
        raise BenchError(f"{where}: missing {', '.join(missing)}")
    category, turns = item["category"], item["turns"]
    if not isinstance(category, str) or not category.strip():
        raise BenchError(f"{where}: category must be a non-empty string, got {category!r}")
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(turn, str) and turn.strip() for turn in turns)
    ):
        raise BenchError(
            f"{where}: turns must be a list of one or more prompt texts (the user's turns)"
        )
    return BenchPrompt(_question_id(item["question_id"], where), category.strip(), tuple(turns))


def load_prompts(
    path: str | Path,
    *,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[BenchPrompt]:
    """Read a Spec-Bench JSONL file; keep `categories` (all by default) and at
    most `limit` questions per category (each with all its turns), in file order.

    Raises BenchError naming the file and line of anything malformed, or an
    asked-for category that the file lacks.
    """
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BenchError(f"{path}: no such prompts file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchError(f"{path}: cannot read the prompts file ({exc})") from None
    if limit is not None and limit < 1:
        raise BenchError(f"--limit must be >= 1, got {limit}")
    prompts = [
        _record(line, f"{path}:{number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not prompts:
        raise BenchError(f"{path}: the file holds no prompts")
    available = list(dict.fromkeys(prompt.category for prompt in prompts))
    wanted = list(dict.fromkeys(categories)) if categories else available
    unknown = [name for name in wanted if name not in available]
    if unknown:
        raise BenchError(
            f"{path}: no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(unknown)}; the file has: {', '.join(available)}"
        )
    kept: list[BenchPrompt] = []
    counts = dict.fromkeys(wanted, 0)
    for prompt in prompts:
        if prompt.category in counts and (limit is None or counts[prompt.category] < limit):
            counts[prompt.category] += 1
            kept.append(prompt)
    return kept


@dataclass
class Conversation:
    """One benchmark chat as the REPL's session holds it: how many turns were
    asked, and the history the next turn is encoded with (each user turn and
    the target-only answer to it)."""

    history: list[Message] = field(default_factory=list)
    asked: int = 0

    def answered(self, question: str, answer: str | None) -> None:
        """One more turn asked; with an `answer` (chat mode), both join the history."""
        self.asked += 1
        if answer is not None:
            self.history += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer},
            ]
