"""`python infer.py soak` on the command line: its flags and `run(args, front)`.

The counts are checked before any model loads; the models come from the
application's front door and everything shown goes through its renderer
(measure/front.py), so this module never prints. The `--json` file holds the
settings, the soak's own fields and every figure.
"""

from __future__ import annotations

import argparse
import json
from contextlib import AbstractContextManager
from typing import Any, Protocol

from specrepl.chat.flags import add_model_options, add_setting_options
from specrepl.engine.signals import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from specrepl.measure.front import MeasureFront, MeasureView, config_block, write_report
from specrepl.measure.soak.loop import VARIANTS, AnswerDrawer, SoakOptions, soak
from specrepl.measure.soak.result import MIB, SoakResult

__all__ = ["SoakView", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `python infer.py soak`: its own, and the model and setting flags
    every entry point takes (flags.py), which mean the same before or after `soak`."""
    parser.add_argument(
        "--prompts",
        dest="soak_prompts",
        type=int,
        metavar="N",
        default=SoakOptions.prompts,
        help=f"prompts to answer in the one session ({SoakOptions.prompts})",
    )
    parser.add_argument(
        "--reset-every",
        type=int,
        metavar="K",
        default=SoakOptions.reset_every,
        help=f"clear the chat history every K prompts; 0: never ({SoakOptions.reset_every})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        metavar="N",
        help="prompts before the memory reference (default: two rounds of the "
        f"{len(VARIANTS)} setting variants, at most half the prompts)",
    )
    parser.add_argument(
        "--max-growth-mib",
        type=float,
        metavar="X",
        help="fail (exit 1) when RSS grows by more than X MiB after the warm-up",
    )
    parser.add_argument(
        "--no-check",
        dest="soak_check",
        action="store_false",
        default=SoakOptions.check,
        help="do not compare each answer with a fresh session's (half the time)",
    )
    parser.add_argument("--json", dest="json_out", metavar="OUT", help="write every figure here")
    add_model_options(parser, after_subcommand=True)
    add_setting_options(parser, after_subcommand=True)


def options_from_args(args: argparse.Namespace) -> SoakOptions:
    """The options of `soak`'s flags; ValueError for a count out of range."""
    mib = args.max_growth_mib
    return SoakOptions(
        prompts=args.soak_prompts,
        reset_every=args.reset_every,
        warmup=args.warmup,
        check=args.soak_check,
        max_growth=None if mib is None else int(mib * MIB),
    )


def config_fields(options: SoakOptions) -> dict[str, Any]:
    """The soak's own fields as the "config" of its `--json` file names them."""
    return {
        "prompts": options.prompts,
        "reset_every": options.reset_every,
        "checked": options.check,
        "max_growth": options.max_growth,
    }


class SoakView(MeasureView, Protocol):
    """What `run` draws (app/render/measure.py's `MeasureRenderer` has it)."""

    def unseen(self) -> AbstractContextManager[AnswerDrawer]:
        """A drawer of answers, as the REPL draws them, that shows nothing."""
        ...

    def soak_report(self, result: SoakResult) -> None:
        """The counts, memory figures, mismatches and verdict."""
        ...


def run(args: argparse.Namespace, front: MeasureFront[SoakView]) -> int:
    """`python infer.py soak`: the counts checked before any model loads, the soak
    under a progress bar, its report, and the `--json` file.

    Exit status: 0; 1 (a mismatch, too much memory growth, models that cannot
    load, a `--json` file that cannot be written); 2 (bad counts, flags or
    config); 130 (Ctrl-C, what was measured is still shown and written).
    """
    view = front.view
    try:
        options = options_from_args(args)
    except ValueError:
        view.fatal("soak: need --prompts >= 1, --reset-every >= 0, 0 <= --warmup <= --prompts")
        return EXIT_USAGE
    started = front.start()
    if isinstance(started, int):
        return started
    config, session = started
    try:
        view.loaded(session.pair, session.head_summary(), session.runtime_summary())
        with view.unseen() as drawer, view.progress("soak", options.prompts) as advance:
            result = soak(session, options, renderer=drawer, on_prompt=advance)
        view.soak_report(result)
    except KeyboardInterrupt:
        return front.stopped("Interrupted.")
    if args.json_out:
        payload = {
            "config": config_block(
                config, session.pair, session.settings, **config_fields(options)
            ),
            "passed": result.passed,
            "result": result.to_dict(),
        }
        failed = write_report(view, args.json_out, json.dumps(payload, indent=2))
        if failed is not None:
            return failed
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.passed else EXIT_FAILED
