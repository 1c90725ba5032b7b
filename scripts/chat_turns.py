"""Per-turn speed of a scripted chat, answered by the REPL's own session.

Loads the pair as `python infer.py` does (the default config plus the flags
given here), then answers every user turn of a chat file (one JSON line with
`turns`, e.g. `benchmarks/chat_pasted.jsonl`) in one `ChatSession` with its
caches kept, exactly as the REPL answers typed prompts: the speculative run,
then the target alone. Per turn it prints the prompt's length, the speedup
(speculative tokens/s over target-only tokens/s as the REPL's summary gives
it), the first-token time ratio (speculative over target), tokens per target
step, the drafts proposed and accepted per source, the longest pause between
two streamed steps of each run, and whether the two texts are identical; then
the medians. `--json OUT` keeps every figure with each step's choice.

Beside them, llama.cpp alone (the plain runtime a CPU user would run, bench's
`llamacpp-exact` peer) answers every turn on the float32 GGUF file of the
target's exact weights, twice: flash attention off (llama-cpp-python's
default) and on (what llama.cpp's own programs choose on a CPU); the same
prompt ids, budget and end tokens, greedy, one model of each kept across the
turns, so that it reuses the prefix it holds as llama.cpp itself does in a
chat. Each turn's speculative tokens per second over the faster of the two
is the speedup over the fastest plain run of the same weights (`--no-peer`:
without it); the first-token times are kept beside the target's, to tell
prompt reading from decoding.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/chat_turns.py benchmarks/chat_pasted.jsonl

A benchmark of one chat, not a timed test: run it on a quiet machine; the CPU
is named first (`lscpu`'s model name, family and model).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from specrepl.app.startup import open_session
from specrepl.chat.answers import RunStep
from specrepl.chat.flags import add_model_options, add_setting_options, app_config
from specrepl.engine.llamacpp import LlamaCppUnavailable, open_gguf
from specrepl.engine.processors import make_processor
from specrepl.measure.bench.llamacpp import sampling_options
from specrepl.models.gguf_f32 import float32_gguf


def cpu_name() -> str:
    """lscpu's model name, family and model (Linux), else the platform's name."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    return (
        f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
        f"model {fields.get('model', '?')})"
    )


def turn_figures(answer, pauses: dict[str, float], events: list) -> dict[str, object]:
    spec, target = answer.runs["speculative"].result, answer.runs["target"].result
    by_source: dict[str, list[int]] = {}
    for event in events:
        if event.source:
            counts = by_source.setdefault(event.source, [0, 0])
            counts[0] += event.gamma
            counts[1] += event.accepted
    first = (
        spec.time_to_first_token / target.time_to_first_token
        if spec.time_to_first_token and target.time_to_first_token
        else None
    )
    return {
        "prompt_tokens": answer.prompt_tokens,
        "fed": spec.prompt_tokens - spec.reused_prompt_tokens,
        "speedup": answer.speedup_of("speculative"),
        "tokens_per_second": {
            "speculative": spec.tokens_per_second,
            "target": target.tokens_per_second,
        },
        "first_token_ratio": first,
        "tokens_per_step": spec.new_tokens / spec.steps if spec.steps else None,
        "new_tokens": spec.new_tokens,
        "identical": spec.token_ids == target.token_ids,
        "drafts_by_source": by_source,
        "read_tokens": sum(event.read_tokens for event in events),
        "read_seconds": sum(event.read_seconds for event in events),
        "imported_tokens": sum(event.imported_tokens for event in events),
        "import_seconds": sum(event.import_seconds for event in events),
        "longest_pause": dict(pauses),
        "target_first_token": target.time_to_first_token,
        "choices": [[event.source, event.gamma, event.accepted, event.choice] for event in events],
        "events": [
            {
                "gamma": event.gamma,
                "accepted": event.accepted,
                "appended": len(event.appended),
                "source": event.source,
                "draft_seconds": round(event.draft_seconds, 5),
                "target_seconds": round(event.target_seconds, 5),
                "read_seconds": round(event.read_seconds, 5),
                "read_tokens": event.read_tokens,
                "import_seconds": round(event.import_seconds, 5),
                "imported_tokens": event.imported_tokens,
            }
            for event in events
        ],
    }


PEERS = {"llamacpp_exact": {}, "llamacpp_exact_flash": {"flash_attn": True}}
"""llama.cpp alone, by name: the options each is opened with."""


def open_peers(session) -> dict:
    """llama.cpp alone on the float32 GGUF file of the session's target, by
    name (`PEERS`); those that cannot run left out (why printed)."""
    gguf = session.pair.target.gguf
    peers = {}
    for name, options in PEERS.items():
        try:
            if gguf is None:
                raise LlamaCppUnavailable("the target was not loaded from a GGUF file")
            peers[name] = open_gguf(
                float32_gguf(gguf),
                context_length=session.pair.context_length,
                threads=torch.get_num_threads(),
                **options,
            )
        except (LlamaCppUnavailable, OSError, ValueError) as error:
            print(f"no llama.cpp peer {name}: {error}", flush=True)
    return peers


def peer_turn(
    llama, ids: list[int], budget: int, end_tokens: set[int]
) -> tuple[list[int], float, float]:
    """The peer's greedy tokens after `ids`, the seconds they took (prompt
    reading included, as the session's figures include it) and the seconds
    to its first token."""
    started = time.perf_counter()
    tokens: list[int] = []
    first = 0.0
    for token in llama.generate(ids, **sampling_options(make_processor("greedy"))):
        if not tokens:
            first = time.perf_counter() - started
        tokens.append(int(token))
        if int(token) in end_tokens or len(tokens) >= budget:
            break
    return tokens, time.perf_counter() - started, first


def peer_figures(row: dict, peers: dict, session, ids: list[int], target: list[int]) -> None:
    """Every llama.cpp-alone run of one turn into `row`, and the speculative
    speedup over the faster (`over_llamacpp`, `fastest_llamacpp`); printed."""
    budget, ends = session.settings.max_new_tokens, set(session.pair.eos_token_ids)
    for name, llama in peers.items():
        tokens, seconds, first = peer_turn(llama, ids, budget, ends)
        row["tokens_per_second"][name] = len(tokens) / seconds
        row.setdefault("llamacpp_first_tokens", {})[name] = first
        row.setdefault("peers_identical", {})[name] = tokens == target
    fastest = max(peers, key=lambda name: row["tokens_per_second"][name])
    row["fastest_llamacpp"] = fastest
    row["llamacpp_first_token"] = row["llamacpp_first_tokens"][fastest]
    row["peer_identical"] = row["peers_identical"][fastest]
    row["over_llamacpp"] = (
        row["tokens_per_second"]["speculative"] / row["tokens_per_second"][fastest]
    )
    runs = ", ".join(
        f"{'flash attention' if 'flash' in name else 'plain'} {row['tokens_per_second'][name]:.1f}"
        f" tok/s (first token {row['llamacpp_first_tokens'][name]:.2f}s,"
        f" same text {row['peers_identical'][name]})"
        for name in peers
    )
    print(
        f"         llama.cpp alone {runs}; the target's first token"
        f" {row['target_first_token'] or 0:.2f}s; speculative {row['over_llamacpp']:.2f}x"
        " the faster",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chat_file", type=Path, help="a chat file: one JSON line with `turns`")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--no-peer", action="store_true", help="without llama.cpp alone")
    add_model_options(parser)
    add_setting_options(parser)
    args = parser.parse_args()
    record = json.loads(args.chat_file.read_text().splitlines()[0])
    config = app_config(args)
    print(f"CPU: {cpu_name()}", flush=True)
    session = open_session(config, lambda stage: None)
    print(f"settings: {session.settings.drafter_options()}", flush=True)
    print(f"target: {session.target.summary(session.settings)}", flush=True)
    peers = {} if args.no_peer else open_peers(session)
    rows = []
    for number, turn in enumerate(record["turns"], 1):
        pauses: dict[str, float] = {}
        last: dict[str, float] = {}
        events: list = []

        def on_event(event, pauses=pauses, last=last, events=events) -> None:
            if isinstance(event, RunStep):
                if event.generator == "speculative":
                    events.append(event.step)
                at = event.step.seconds_since_start
                name = event.generator
                pauses[name] = max(pauses.get(name, 0.0), at - last.get(name, 0.0))
                last[name] = at

        ids = session.prompt_ids(turn)
        answer = session.answer(turn, on_event)
        if answer.refusal:
            print(f"turn {number}: refused: {answer.refusal}")
            return 1
        if answer.prompt_tokens != len(ids):  # the session cut the chat to fit: the peer too
            ids = session.prompt_ids(turn, session.history[:-2])
        row = turn_figures(answer, pauses, events)
        rows.append(row)
        sources = " ".join(f"{s}:{a}/{d}" for s, (d, a) in row["drafts_by_source"].items())
        print(
            f"turn {number:2d}: prompt {row['prompt_tokens']:5d} fed {row['fed']:4d} "
            f"speedup {row['speedup']:.2f}x first-token {row['first_token_ratio']:.2f} "
            f"tok/step {row['tokens_per_step']:.2f} read {row['read_tokens']} tok "
            f"{row['read_seconds']:.2f}s took {row['imported_tokens']} "
            f"{row['import_seconds']:.2f}s pause spec {pauses.get('speculative', 0):.2f}s "
            f"target {pauses.get('target', 0):.2f}s identical {row['identical']} [{sources}]",
            flush=True,
        )
        if peers:
            peer_figures(row, peers, session, ids, answer.runs["target"].result.token_ids)
    speedups = [row["speedup"] for row in rows]
    ratios = [row["first_token_ratio"] for row in rows]
    print(
        f"median speedup {statistics.median(speedups):.2f}x, lowest {min(speedups):.2f}x; "
        f"median first-token ratio {statistics.median(ratios):.2f}; "
        f"identical {sum(row['identical'] for row in rows)}/{len(rows)}"
    )
    over = [row["over_llamacpp"] for row in rows if "over_llamacpp" in row]
    if over:
        same = sum(bool(row["peer_identical"]) for row in rows)
        print(
            f"over llama.cpp alone: median {statistics.median(over):.2f}x, lowest"
            f" {min(over):.2f}x; llama.cpp alone gave the target's text {same}/{len(rows)}"
        )
    if args.json:
        summary = {"cpu": cpu_name(), "target": session.target.summary(session.settings)}
        args.json.write_text(json.dumps({**summary, "turns": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
