"""Speculative decoding over an offloaded target against the same target resident.

Loads the embedded target twice, once whole and once under a memory cap that
puts most of its layers on disk (accelerate streams them in for each pass),
each with the embedded bfloat16 copy as its drafter (a copy of the target:
it takes the target's keys and values) under the auto gamma policy. For each
prompt, greedy, it times the target alone and the speculative run, checks
that the tokens are the same in all four runs, and records the gamma the
policy chose at each step and how busy other processes kept the cores
while the prompt ran (`others_cpu_share`: their CPU seconds per second; a
row where it is well above 0 is not a clean figure). Writes one JSON file.

    python scripts/offload_speedup.py --cap cpu=150MB --prompts 3 \\
        --out benchmarks/results/2026-11-28-amd-epyc-25-1-offload/offload.json

The drafter here is the model copy in torch through the engine, not the
session's hybrid (prompt lookup, llama.cpp): the session's warm-up times
the target many times, which is minutes for a target that reads its layers
from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.models.loading import load_pair
from specrepl.models.pair import ModelPair
from specrepl.models.prompting import prompt_ids
from specrepl.models.specs import ModelSpec
from specrepl.models.width_plans import tune_pair_widths
from specrepl.store.paths import width_plans_file


def _cpu_seconds_of_others() -> float:
    """CPU seconds used so far by every other process on this machine (they
    share its cores: what they use while a prompt runs spoils its timing)."""
    ticks = os.sysconf("SC_CLK_TCK")
    own = {os.getpid(), os.getppid()}
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _prompts(path: Path, count: int) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["turns"][0] for line in lines[:count]]


def _runs(pair: ModelPair, ids: list[int], tokens: int, max_gamma: int) -> dict[str, Any]:
    common = {"max_gen_len": tokens, "eos_tokens_id": pair.eos_token_ids}
    alone = autoregressive_generate(ids, pair.target.model, tuning=pair.target.tuning, **common)
    assert pair.drafter is not None
    drafter = ModelDrafter(
        pair.drafter.model, copy_of_target=pair.drafter_is_copy, tuning=pair.drafter.tuning
    )
    speculative = speculative_generate(
        ids,
        drafter,
        pair.target.model,
        gamma=make_policy("auto", max_gamma),
        tuning=pair.target.tuning,
        **common,
    )
    gammas = [drafts for _, drafts, _, _ in speculative.choices if drafts > 0]
    return {
        "target_tokens": alone.token_ids,
        "speculative_tokens": speculative.token_ids,
        "target_tok_s": alone.tokens_per_second,
        "speculative_tok_s": speculative.tokens_per_second,
        "speedup": speculative.tokens_per_second / alone.tokens_per_second,
        "acceptance": speculative.acceptance_rate,
        "tokens_per_step": speculative.mean_accepted_length,
        "gamma_median": statistics.median(gammas) if gammas else 0,
        "gamma_max": max(gammas, default=0),
        "gammas": gammas,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", default="cpu=150MB", help="the offloaded target's max_memory")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-gamma", type=int, default=16)
    parser.add_argument("--file", type=Path, default=Path("benchmarks/dev_prompts.jsonl"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    drafter = ModelSpec("embedded", dtype="bfloat16")
    folder = tempfile.mkdtemp(prefix="specrepl-offload-")
    pairs = {
        "resident": load_pair("embedded", drafter),
        "offloaded": load_pair(
            ModelSpec("embedded", max_memory=args.cap, offload_folder=folder), drafter
        ),
    }
    print("loaded", file=sys.stderr, flush=True)
    for pair in pairs.values():  # the session's tuning: the resident target's width plan
        tune_pair_widths(pair, args.max_gamma, store=width_plans_file())
    print("tuned", file=sys.stderr, flush=True)
    report: dict[str, Any] = {
        "cap": args.cap,
        "tokens": args.tokens,
        "max_gamma": args.max_gamma,
        "threads": torch.get_num_threads(),
        "placement": pairs["offloaded"].target.describe_placement(),
        "prompts": [],
    }
    for text in _prompts(args.file, args.prompts):
        ids = prompt_ids(pairs["resident"].tokenizer, text, chat=True, system_prompt=None)
        row: dict[str, Any] = {"prompt": text[:80]}
        others, started_all = _cpu_seconds_of_others(), time.perf_counter()
        for name, pair in pairs.items():
            started = time.perf_counter()
            row[name] = _runs(pair, ids, args.tokens, args.max_gamma)
            row[name]["wall_seconds"] = time.perf_counter() - started
            print(name, row[name]["wall_seconds"], file=sys.stderr, flush=True)
        # other processes' CPU seconds per wall second while this prompt ran (2 cores)
        row["others_cpu_share"] = (_cpu_seconds_of_others() - others) / (
            time.perf_counter() - started_all
        )
        tokens = [row[n][k] for n in pairs for k in ("target_tokens", "speculative_tokens")]
        row["identical"] = all(t == tokens[0] for t in tokens)
        for name in pairs:
            del row[name]["target_tokens"], row[name]["speculative_tokens"]
        report["prompts"].append(row)
        print(json.dumps(row), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
