"""Measure what a pass of specrepl's llama.cpp target costs by width and by
context, with whichever llama-cpp-python build comes first on `sys.path`.

A speculative step verifies k drafts in one pass over k + 1 tokens; what it
gains over the target alone depends on that pass's cost against a one-token
pass, at the context the chat has reached. This opens the embedded model's
float32 GGUF (or `--gguf`) in specrepl's llama.cpp runtime (float32 keys and
values, as the target runs), reads `--contexts` tokens of the pasted chat's
text and times passes of each width after them (the least and the median of
`--repeats`), and prints the build's llama.cpp system line, so that two builds
(e.g. the portable AVX2 one `scripts/setup.sh` made before and an AVX-512 one)
can be put side by side:

    HF_HUB_OFFLINE=1 PYTHONPATH=BUILD_DIR:. python scripts/llamacpp_width_costs.py \
        --json OUT.json

This is a measurement for the docs; specrepl does not import it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from llamacpp_cache_types import target_file, text_tokens  # a sibling script

from specrepl.engine import llamacpp_runtime
from specrepl.engine.llamacpp import import_llamacpp
from specrepl.engine.widths import cpu_identity


def pass_costs(
    runtime, ids: list[int], context: int, widths: list[int], repeats: int, width_plan
) -> dict[str, dict[str, float]]:
    """The least and median milliseconds of a pass over each width's tokens
    (the logits of every one, as a verification asks) after `context` tokens
    read, widths alternated so that drift spreads."""
    runtime.rollback_to(0)
    sequence = torch.tensor(ids[: context + max(widths)])
    runtime.score(sequence[:context], 1, width_plan)
    timings: dict[int, list[float]] = {width: [] for width in widths}
    for _ in range(repeats):
        for width in widths:
            started = time.perf_counter()
            runtime.score(sequence[: context + width], width, width_plan)
            timings[width].append((time.perf_counter() - started) * 1000)
            runtime.rollback_to(context)
    return {
        str(width): {"least_ms": min(values), "median_ms": statistics.median(values)}
        for width, values in timings.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--contexts", default="64,1400,2800")
    parser.add_argument("--widths", default="1,3,5,9,13,17")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    llama_cpp = import_llamacpp()
    path = target_file(arguments.gguf)
    contexts = [int(value) for value in arguments.contexts.split(",")]
    widths = [int(value) for value in arguments.widths.split(",")]
    model = llamacpp_runtime.LlamaCppModel(path, context_length=max(contexts) + 128)
    runtime = model.open()
    ids = text_tokens(model, max(contexts) + max(widths))
    runtime.score(torch.tensor(ids[:32]), 1, model.width)
    system = llama_cpp.llama_print_system_info().decode().strip()
    results = {}
    for context in contexts:
        results[str(context)] = pass_costs(
            runtime, ids, context, widths, arguments.repeats, model.width
        )
        line = "  ".join(
            f"{width}: {figures['least_ms']:6.1f}/{figures['median_ms']:6.1f}"
            for width, figures in results[str(context)].items()
        )
        print(f"after {context:5d}  ms by width (least/median)  {line}", flush=True)
    print(f"CPU: {cpu_identity()}; llama.cpp: {system}")
    if arguments.json:
        arguments.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_identity(),
                    "llama_cpp_system": system,
                    "llama_cpp_python": str(getattr(llama_cpp, "__version__", "?")),
                    "file": path.name,
                    "costs_by_context": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
