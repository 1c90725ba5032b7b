"""`python infer.py replay`: a scripted chat, played with caches kept and with them dropped.

Two sessions on the same loaded models answer the same user turns in lockstep:
one keeps its caches from turn to turn (as the REPL does), the other drops
them before every turn and reads the whole history again. Per turn and
generator it records the prompt's length, the prompt tokens fed, the time to
the first token and tokens/s, and whether both sessions gave the same tokens.
The order of the two sessions alternates from turn to turn, so a slow moment
of the machine does not always land on the same side.

`run` is the subcommand: its own few fields are the chat file and `--json`
(the settings are the sessions', from the config and flags as everywhere); the
models come from the application's front door and everything shown goes
through its renderer (see front.py), so this module never prints.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from specrepl.chat.flags import add_model_options, add_setting_options
from specrepl.chat.session import ChatSession
from specrepl.engine.signals import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from specrepl.measure.front import MeasureFront, MeasureView, config_block, write_report
from specrepl.store.paths import default_chat_path

__all__ = [
    "ReplayResult",
    "ReplayView",
    "TurnFigures",
    "add_arguments",
    "load_turns",
    "replay",
    "run",
]

DEFAULT_CHAT = default_chat_path()
MODES = ("kept", "dropped")


@dataclass(frozen=True)
class TurnFigures:
    """One generator's run in one turn of one session."""

    turn: int
    mode: str
    """"kept" (caches kept between turns) or "dropped" (read the history again)."""
    generator: str
    prompt_tokens: int
    fed: int
    time_to_first_token: float | None
    tokens_per_second: float | None
    new_tokens: int


@dataclass
class ReplayResult:
    """Every turn's figures, per session and generator; turns whose tokens differed."""

    MODES: ClassVar[tuple[str, ...]] = MODES
    """The two sessions, in the order they are shown."""
    turns: int = 0
    figures: list[TurnFigures] = field(default_factory=list)
    mismatched_turns: list[int] = field(default_factory=list)
    """Turns where the two sessions' tokens differed (none expected)."""
    refusal: str | None = None

    def first_token_growth(self, mode: str, generator: str) -> float | None:
        """Time to the first token of the last turn over that of the first turn."""
        times = {
            f.turn: f.time_to_first_token
            for f in self.figures
            if f.mode == mode and f.generator == generator
        }
        first, last = times.get(0), times.get(self.turns - 1)
        if not first or last is None:
            return None
        return last / first

    def to_dict(self) -> dict[str, object]:
        generators = sorted({f.generator for f in self.figures})
        return {
            "turns": self.turns,
            "mismatched_turns": self.mismatched_turns,
            "refusal": self.refusal,
            "first_token_growth": {
                mode: {name: self.first_token_growth(mode, name) for name in generators}
                for mode in MODES
            },
            "figures": [asdict(f) for f in self.figures],
        }


def load_turns(path: Path) -> list[str]:
    """The user turns of a chat file: JSON lines with a "turns" list (all of them,
    in order), or plain text with one turn per non-empty line."""
    text = path.read_text(encoding="utf-8")
    turns: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
                turns += [str(turn) for turn in record["turns"]]
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path}:{number}: not a chat record ({error})") from None
        else:
            turns.append(line.strip())
    if not turns:
        raise ValueError(f"{path}: no turns")
    return turns


def replay(
    kept: ChatSession,
    dropped: ChatSession,
    turns: list[str],
    on_turn: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Answer `turns` in both sessions (both start from an empty history)."""
    result = ReplayResult()
    kept.reset()
    dropped.reset()
    sessions = {"kept": kept, "dropped": dropped}
    for index, text in enumerate(turns):
        order = list(MODES) if index % 2 == 0 else list(reversed(MODES))
        answers = {}
        for mode in order:
            session = sessions[mode]
            if mode == "dropped":
                session.drop_caches()
            answer = session.answer(text)
            if answer.refusal is not None or answer.interrupted:
                result.refusal = answer.refusal or "interrupted"
                return result
            answers[mode] = answer
            for name, run in answer.runs.items():
                figures = run.result
                result.figures.append(
                    TurnFigures(
                        turn=index,
                        mode=mode,
                        generator=name,
                        prompt_tokens=figures.prompt_tokens,
                        fed=figures.prompt_tokens - figures.reused_prompt_tokens,
                        time_to_first_token=figures.time_to_first_token,
                        tokens_per_second=figures.tokens_per_second,
                        new_tokens=figures.new_tokens,
                    )
                )
        same = all(
            answers["kept"].runs[name].result.token_ids == run.result.token_ids
            for name, run in answers["dropped"].runs.items()
        )
        if not same:
            result.mismatched_turns.append(index)
        result.turns = index + 1
        if on_turn is not None:
            on_turn(index + 1, len(turns))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py replay`, and the model and setting flags every entry
    point takes (flags.py), which mean the same before or after `replay`."""
    parser.description = (
        "Play a scripted chat turn by turn in two sessions on the same models, one "
        "keeping its caches between turns and one reading the whole history again, "
        "and report per turn the prompt tokens fed, time to first token and tok/s."
    )
    parser.add_argument(
        "chat_file",
        nargs="?",
        type=Path,
        default=DEFAULT_CHAT,
        metavar="FILE",
        help='user turns: JSON lines with a "turns" list, or one turn per line '
        "(default: the chat shipped with specrepl)",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure here")
    add_model_options(parser, after_subcommand=True)
    add_setting_options(parser, after_subcommand=True)


class ReplayView(MeasureView, Protocol):
    """What `run` draws (app/render/measure.py's `MeasureRenderer` has it)."""

    def replay_report(self, result: ReplayResult) -> None:
        """Per turn, each session's figures; how the first-token time grew."""
        ...


def run(args: argparse.Namespace, front: MeasureFront[ReplayView]) -> int:
    """`python infer.py replay`: the chat file read before any model loads, both
    sessions on the loaded models, the report, and the `--json` file.

    Exit status: 0; 1 (the sessions' tokens differ, a refusal, models that
    cannot load, a `--json` file that cannot be written); 2 (a chat file that
    cannot be read, a bad flag or config); 130 (Ctrl-C).
    """
    view = front.view
    try:
        turns = load_turns(args.chat_file)
    except (OSError, ValueError) as error:
        view.fatal(f"replay: {error}")
        return EXIT_USAGE
    started = front.start()
    if isinstance(started, int):
        return started
    config, kept = started
    dropped = ChatSession(kept.pair, kept.settings)
    try:
        view.loaded(kept.pair, kept.head_summary(), kept.runtime_summary())
        with view.progress("replay", len(turns)) as advance:
            result = replay(kept, dropped, turns, on_turn=advance)
        view.replay_report(result)
    except KeyboardInterrupt:
        return front.stopped("Interrupted.")
    if args.json_out:
        payload = {
            "config": config_block(config, kept.pair, kept.settings, chat_file=str(args.chat_file)),
            "result": result.to_dict(),
        }
        failed = write_report(view, args.json_out, json.dumps(payload, indent=1) + "\n")
        if failed is not None:
            return failed
    return EXIT_FAILED if result.mismatched_turns or result.refusal else EXIT_OK
