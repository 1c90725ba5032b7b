"""What taking the target's keys and values costs llama.cpp on this machine: a
whole write against an append of only the new positions, after long contexts.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/kv_append_costs.py
        [--contexts 300,3000,8000] [--new 20] [--rounds 3]

For each context of N random tokens the target reads them; then, alternated
over the rounds, llama.cpp is given all N positions in one write
(`KvImporter.write`), or the first N - new in one write and the last `new`
appended (`KvImporter.append`, only the append timed). After each, llama.cpp
reads token N + 1 and its next-token logits are compared with those after
reading all N + 1 itself (cosine, same argmax). Last, one decoding step after
100 and 3,000 tokens with a one-sequence and a two-sequence context (the
drafter's), alternated. Prints the CPU's name first; medians in ms.

A measurement, not a test: see specrepl/engine/drafters/llamacpp_kv.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from specrepl.engine.drafters.llamacpp_kv import _target_cache, cosine, last_logits, probe_importer
from specrepl.engine.llamacpp import open_gguf
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.loading import load_pair


def write_costs(llama, importer, target, context: int, new: int, rounds: int) -> str:
    generator = torch.Generator().manual_seed(context)
    tokens = torch.randint(0, int(llama.n_vocab()), (context + 1,), generator=generator).tolist()
    cache = _target_cache(target, tokens[:context])
    llama.n_tokens = 0
    llama.eval(tokens)
    own = last_logits(llama)
    seconds: dict[str, list[float]] = {"whole": [], "append": []}
    agreement: list[float] = []
    for _ in range(rounds):
        for way in seconds:
            llama.n_tokens = 0
            if way == "whole":
                seconds[way].append(importer.write(cache, context, tokens))
            else:
                importer.write(cache, context - new, tokens)
                seconds[way].append(importer.append(cache, context - new, context, tokens))
            llama.eval(tokens[context:])
            taken = last_logits(llama)
            agreement.append(cosine(own, taken) if own.argmax() == taken.argmax() else 0.0)
    whole, append = (1e3 * statistics.median(seconds[way]) for way in ("whole", "append"))
    return (
        f"{context:6d} tokens: whole write {whole:7.1f} ms, append of the last {new} "
        f"{append:5.2f} ms; least cosine with llama.cpp's own reading {min(agreement):.5f}"
    )


def step_costs(one, two, rounds: int) -> None:
    generator = np.random.default_rng(0)
    for context in (100, 3000):
        prompt = generator.integers(0, int(one.n_vocab()), context).tolist()
        for llama in (one, two):
            llama.n_tokens = 0
            llama.eval(prompt)
        seconds: dict[str, list[float]] = {"one sequence": [], "two sequences": []}
        for _ in range(rounds * 4):
            for name, llama in (("one sequence", one), ("two sequences", two)):
                llama.n_tokens = context
                for index in range(8):
                    began = time.perf_counter()
                    llama.eval([1000 + index])
                    seconds[name].append(time.perf_counter() - began)
        print(
            f"a decoding step after {context} tokens: "
            + ", ".join(f"{k} {1e3 * statistics.median(v):.2f} ms" for k, v in seconds.items())
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", default="300,3000,8000")
    parser.add_argument("--new", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(cpu_identity(), f"{threads} threads")
    contexts = [int(c) for c in args.contexts.split(",")]
    target = load_pair("embedded").target.model
    path = embedded_gguf_path()
    length = max(*contexts, 3000) + 64
    two = open_gguf(path, context_length=length, threads=threads, sequences=2)
    importer, reason = probe_importer(two, target)
    print(reason)
    if importer is None or not importer.appends:
        return 1
    for context in contexts:
        print(write_costs(two, importer, target, context, args.new, args.rounds))
    one = open_gguf(path, context_length=length, threads=threads)
    step_costs(one, two, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
