"""The gamma policy against step events recorded in a real chat.

`tests/data/chat_pasted_events.json` holds the step events of turns 3 to 6 of
`benchmarks/chat_pasted.jsonl` answered by the REPL's session (embedded pair,
the default hybrid drafter in llama.cpp, greedy, 128 new tokens; the CPU is
named in the file): a short turn, the pasted article to summarise, and two
follow-ups. Fed those events, the policy must keep drafting wherever the
recorded costs and acceptances say drafting pays: after the long pasted read
too, which the drafter timed apart from its drafting.
"""

from __future__ import annotations

import json
from pathlib import Path

from specrepl.engine.gamma import AutoGamma
from specrepl.engine.results import Offer, StepEvent

RECORDED = Path(__file__).parent / "data" / "chat_pasted_events.json"


def _events(turn: dict) -> list[StepEvent]:
    return [
        StepEvent(
            drafts=tuple(range(step["gamma"])),
            accepted=step["accepted"],
            appended=tuple(range(step["appended"])),
            draft_seconds=step["draft_seconds"],
            target_seconds=step["target_seconds"],
            seconds_since_start=0.0,
            requested_gamma=step["gamma"],
            source=step["source"],
            read_seconds=step["read_seconds"],
            read_tokens=step["read_tokens"],
        )
        for step in turn["events"]
    ]


def _model_pays(events: list[StepEvent]) -> bool:
    """Whether the turn's model steps gave more tokens per second than its
    steps without drafts (or, lacking those, than its cheapest verification)."""
    model = [event for event in events[1:] if event.source == "model"]
    if len(model) < 3:
        return False
    rate = sum(len(e.appended) for e in model) / sum(
        e.draft_seconds + e.target_seconds for e in model
    )
    plain = [event.target_seconds for event in events[1:] if event.gamma == 0]
    baseline = min(plain) if plain else min(event.target_seconds for event in events[1:])
    return rate > 1 / baseline


def test_the_recorded_chat_has_a_long_read_and_turns_where_the_model_pays() -> None:
    turns = json.loads(RECORDED.read_text())["turns"]
    assert max(step["read_tokens"] for turn in turns for step in turn["events"]) >= 30
    assert sum(_model_pays(_events(turn)) for turn in turns) >= 2


def test_auto_keeps_drafting_where_the_recorded_costs_say_drafting_pays() -> None:
    turns = json.loads(RECORDED.read_text())["turns"]
    policy = AutoGamma(8)
    for turn in turns:
        policy.start()  # the session keeps one policy from turn to turn
        events = _events(turn)
        for event in events:
            policy.choose([Offer("model", 8, unread=2)], budget=100)
            policy.observe(event)
        if _model_pays(events):
            # the next step, and the next turn's first drafting step after a read
            # of a window's worth of unseen tokens (45 on the recording's machine)
            assert policy.choose([Offer("model", 8, unread=2)], budget=100).gamma > 0
            assert policy.choose([Offer("model", 8, unread=45)], budget=127).gamma > 0
