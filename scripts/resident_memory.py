"""The REPL's resident memory after start-up and after each answer.

Opens the session as `python infer.py` does (the default config plus the
flags given here: the embedded pair unless told otherwise), prints the
process's resident set (VmRSS from /proc/self/status) once the session is
warmed up, then after each prompt answered, with what runs the drafter model
and whether its torch copy is in memory.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/resident_memory.py Hello "Name three colours"

Linux only (it reads /proc). A measurement, not a test: the CPU is named first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from chat_turns import cpu_name

from specrepl.app.startup import open_session
from specrepl.chat.flags import add_model_options, add_setting_options, app_config


def resident_mib() -> float:
    """This process's resident set size in MiB (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="*", default=["Hello"], help="prompts to answer in turn")
    add_model_options(parser)
    add_setting_options(parser)
    args = parser.parse_args()
    config = app_config(args)
    print(f"CPU: {cpu_name()}", flush=True)
    session = open_session(config, lambda stage: None)
    drafter = session.pair.drafter

    def line(when: str) -> str:
        # `resident` is absent from versions that never release the drafter's torch copy
        held = "-" if drafter is None else getattr(drafter, "resident", True)
        runtime = session.runtime_summary() or "-"
        return f"{when}: {resident_mib():.0f} MiB resident (torch drafter held: {held}; {runtime})"

    print(line("after start-up"), flush=True)
    for number, prompt in enumerate(args.prompts, 1):
        answer = session.answer(prompt)
        if answer.refusal:
            print(f"answer {number} refused: {answer.refusal}")
            return 1
        print(line(f"after answer {number}"), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
