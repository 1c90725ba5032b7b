"""Measure llama.cpp alone on a float32 GGUF with flash attention off (llama-cpp-python's
default) and on (what llama.cpp's own programs choose on a CPU): the seconds to read
prompts of several lengths and the seconds of a one-token step after each.

It is why bench's `llamacpp-exact` peer runs both and measures speedups over the faster
(docs/runtimes.md, "bench's exact peer"). The prompts are the pasted-documents chat's
text (twice over, for the longest), the file the embedded model's float32 GGUF (or
`--gguf`), as many threads as CPUs; rounds alternate the two settings.

    HF_HUB_OFFLINE=1 python scripts/llamacpp_flash_peer.py [--lengths 60,660,2800] [--rounds 3]

This is a measurement for the docs; specrepl does not import it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from specrepl.engine.llamacpp import import_llamacpp

CHAT = Path(__file__).resolve().parents[1] / "benchmarks" / "chat_pasted.jsonl"
STEPS = 32
"""One-token steps timed after each prompt."""


def target_file(given: Path | None) -> Path:
    """`given`, or the embedded model's float32 GGUF file (written once)."""
    if given is not None:
        return given
    from specrepl.models.embedded import embedded_gguf_path
    from specrepl.models.gguf_f32 import float32_gguf

    return float32_gguf(embedded_gguf_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--lengths", default="60,660,2800")
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    lengths = [int(part) for part in arguments.lengths.split(",")]
    llama_cpp = import_llamacpp()
    path, threads = target_file(arguments.gguf), os.cpu_count() or 1
    models = {
        flash: llama_cpp.Llama(
            model_path=str(path),
            n_ctx=max(lengths) + STEPS + 16,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash,
            verbose=False,
        )
        for flash in (False, True)
    }
    turns = json.loads(CHAT.read_text().splitlines()[0])["turns"]
    tokens = models[False].tokenize(("\n\n".join(turns) * 2).encode())
    if len(tokens) < max(lengths) + STEPS:
        raise SystemExit(f"the chat's text has {len(tokens)} tokens, fewer than asked")
    times: dict[tuple[bool, int], list[tuple[float, float]]] = {}
    for _ in range(arguments.rounds):
        for flash, model in models.items():
            for length in lengths:
                model.reset()
                started = time.perf_counter()
                model.eval(tokens[:length])
                read = time.perf_counter() - started
                started = time.perf_counter()
                for index in range(STEPS):
                    model.eval([tokens[length + index]])
                step = (time.perf_counter() - started) / STEPS
                times.setdefault((flash, length), []).append((read, step))
    print(f"{path.name}, {threads} threads, {arguments.rounds} rounds (median, then each)")
    for (flash, length), runs in times.items():
        reads = [read for read, _ in runs]
        steps = [step for _, step in runs]
        each_read = " ".join(f"{read * 1e3:.0f}" for read in reads)
        each_step = " ".join(f"{step * 1e3:.2f}" for step in steps)
        print(
            f"flash attention {'on ' if flash else 'off'} {length:5d} tokens: read"
            f" {statistics.median(reads) * 1e3:7.1f} ms ({each_read}),"
            f" step {statistics.median(steps) * 1e3:5.2f} ms ({each_step})"
        )


if __name__ == "__main__":
    main()
