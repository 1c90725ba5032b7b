"""Share of the copy's drafts accepted per turn of a chat, by held window.

For each window given (0: the copy holds everything), loads the pair as
`python infer.py` does, sets the model drafter alone with gamma fixed at 8
and the target-alone run off, sets the copy's `held_window`, and answers
every turn of the chat file in one session. Greedy acceptance does not
depend on timing, so the windows compare on the same text; the milliseconds
a draft are timings and vary with the machine. Prints, per turn, the share
of drafts accepted, ms a draft and the positions the copy held at the end.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/window_acceptance.py \
        benchmarks/chat_pasted.jsonl 0 1024 512
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specrepl.app.startup import open_session
from specrepl.chat.answers import RunStep
from specrepl.chat.flags import add_model_options, add_setting_options, app_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chat_file", type=Path, help="a chat file: one JSON line with `turns`")
    parser.add_argument("windows", type=int, nargs="+", help="held windows (0: everything)")
    add_model_options(parser)
    add_setting_options(parser)
    args = parser.parse_args()
    turns = json.loads(args.chat_file.read_text().splitlines()[0])["turns"]
    for window in args.windows:
        session = open_session(app_config(args), lambda stage: None)
        session.update(drafter_kind="model", gamma=8, gamma_policy="fixed", target_gen=False)
        drafter = session._drafter(session.settings)
        drafter.held_window = window or None
        figures = []
        for number, turn in enumerate(turns, 1):
            steps = []

            def on_event(event, steps=steps) -> None:
                if isinstance(event, RunStep) and event.generator == "speculative":
                    steps.append(event.step)

            session.answer(turn, on_event)
            drafted = sum(step.gamma for step in steps)
            accepted = sum(step.accepted for step in steps)
            seconds = sum(step.draft_seconds for step in steps if step.gamma)
            figures.append(
                f"t{number}:{accepted / max(drafted, 1):.2f}"
                f"/{1e3 * seconds / max(drafted, 1):.0f}ms/h{len(drafter.held())}"
            )
        print("window", window, " ".join(figures), flush=True)


if __name__ == "__main__":
    main()
