"""chat_turns with the copy's held window forced (HELD env: a number, or 'all')."""

import os
import runpy
import sys

from specrepl.engine.drafters import llamacpp_state as S

held = os.environ.get("HELD", "")
orig = S.StateImporter.measure_held_window


def forced(self, target, tokens):
    said = orig(self, target, tokens)
    if held == "all":
        self.held_window = None
    elif held:
        self.held_window = int(held)
    print(f"[held window measured: {said}; forced to {self.held_window}]", flush=True)
    return said


S.StateImporter.measure_held_window = forced
sys.argv = ["scripts/chat_turns.py", *sys.argv[1:]]
runpy.run_path("scripts/chat_turns.py", run_name="__main__")
