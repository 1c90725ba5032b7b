"""Time `python infer.py` as a person at a terminal meets it.

Each run starts the REPL in a pseudo-terminal, types `/help` and then a
prompt as soon as the prompt is drawn, and records three moments from the
start of the process: the prompt drawn (`› `), the `/help` answer shown, and
the first answer's summary table shown. Prints each run and the medians as
JSON lines. Run it from the repository root, models already cached (a warm
start):

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/startup_time.py --runs 5

Used for README's start-up figures; it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT_MARK = b"\xe2\x80\xba"  # "›", the REPL's prompt
HELP_MARK = b"/quit"
ANSWER_MARK = b"baseline"


def _read_until(fd: int, mark: bytes, seen: bytearray, deadline: float) -> float:
    """Read the terminal until `mark` appears after what was seen; the time it did."""
    start = len(seen)
    while mark not in seen[start:]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(
                f"{mark!r} did not appear; the screen ended with {bytes(seen[-300:])!r}"
            )
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise TimeoutError(f"the process ended before {mark!r}: {bytes(seen[-300:])!r}")
            seen.extend(chunk)
            start = max(start, len(seen) - len(chunk) - len(mark))
    return time.monotonic()


def one_run(command: list[str], cwd: Path, prompt: str, timeout: float) -> dict[str, float]:
    master, slave = pty.openpty()
    env = {
        **os.environ,
        "COLUMNS": "120",
        "LINES": "40",
        "TERM": "xterm",
        "PROMPT_TOOLKIT_NO_CPR": "1",
    }
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True
    )
    os.close(slave)
    seen = bytearray()
    deadline = started + timeout
    try:
        prompt_at = _read_until(master, PROMPT_MARK, seen, deadline)
        os.write(master, b"/help\r")
        help_at = _read_until(master, HELP_MARK, seen, deadline)
        os.write(master, prompt.encode() + b"\r")
        answer_at = _read_until(master, ANSWER_MARK, seen, deadline)
        os.write(master, b"/quit\r")
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return {
        "prompt_s": prompt_at - started,
        "help_s": help_at - started,
        "first_answer_s": answer_at - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="checkout to start")
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    command = [sys.executable, "infer.py", "--max-new-tokens", str(args.max_new_tokens)]
    runs = []
    for index in range(args.runs):
        figures = one_run(command, args.repo, args.prompt, args.timeout)
        runs.append(figures)
        print(json.dumps({"run": index + 1, **{k: round(v, 3) for k, v in figures.items()}}))
    medians = {key: round(statistics.median(r[key] for r in runs), 3) for key in runs[0]}
    print(json.dumps({"median_of": len(runs), **medians}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
