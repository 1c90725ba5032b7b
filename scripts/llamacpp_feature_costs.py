"""What reading a draft head's features from llama.cpp costs a target pass.

Opens the embedded model's float32 GGUF (the default target's file) in
llama.cpp as the target runs it, and times passes of 1 and 9 tokens after
contexts of 64 and 2,800 tokens: in a plain context, and in a context with the
feature tap (`engine/llamacpp_features.py`) reading the shipped head's three
features. Also the prompt pass of those contexts, plain and with features
(every position an output). Medians of `--repeats` after one warm-up each,
alternating plain and tapped. Writes one JSON file.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python scripts/llamacpp_feature_costs.py --out OUT.json

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specrepl.engine.drafters.builder import load_drafter_head
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.widths import cpu_identity
from specrepl.models.gguf_f32 import float32_gguf
from specrepl.models.loading import load_pair


def timed(runtime, sequence: torch.Tensor, keep: int, vocab: int, layers) -> float:
    started = time.perf_counter()
    runtime.score(sequence, keep, vocab, features=layers is not None, feature_layers=layers or ())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--contexts", default="64,2800")
    args = parser.parse_args()
    pair = load_pair("embedded", None, device="cpu")
    head, _ = load_drafter_head("embedded", pair.target.model)
    layers = head.config.fused_layers
    llama = LlamaCppModel(float32_gguf(pair.target.gguf), context_length=4096)
    vocab = pair.vocab_size
    text = (Path("benchmarks") / "chat_pasted.jsonl").read_text()
    ids = pair.tokenizer.encode(text) * 3  # long enough for the longest context asked
    rows = []
    for context in (int(part) for part in args.contexts.split(",")):
        prefix = torch.tensor(ids[:context])
        row: dict[str, object] = {"context": context}
        for name, wanted in (("plain", None), ("features", layers)):
            runtime = llama.open()
            row[f"prompt_seconds_{name}"] = timed(runtime, prefix, 1, vocab, wanted)
        runtimes = {"plain": llama.open(), "features": llama.open()}
        for name, runtime in runtimes.items():
            runtime.score(prefix, 1, vocab, features=name == "features", feature_layers=layers)
        for width in (1, 9):
            sequence = torch.tensor(ids[: context + width])
            times: dict[str, list[float]] = {"plain": [], "features": []}
            for repeat in range(args.repeats + 1):
                for name, runtime in runtimes.items():
                    wanted = layers if name == "features" else None
                    spent = timed(runtime, sequence, width, vocab, wanted)
                    runtime.rollback_to(context)
                    if repeat:  # the first of each is a warm-up
                        times[name].append(spent)
            for name, values in times.items():
                row[f"width_{width}_{name}_ms"] = round(1000 * statistics.median(values), 3)
            row[f"width_{width}_ratio"] = round(
                statistics.median(times["features"]) / statistics.median(times["plain"]), 3
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "cpu": cpu_identity(),
        "threads": torch.get_num_threads(),
        "file": llama.path.name,
        "feature_layers": list(layers),
        "repeats": args.repeats,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
