"""Measure how llama.cpp's key/value cache type and flash attention change a
target's speed at long contexts and whether a wide pass gives the logits of
one-token passes (what an exact verification needs).

For each setting (cache type float32 or float16, flash attention off or on;
with `--mixed` also keys and values of different types, and bfloat16) it
opens the embedded model's float32 GGUF (or `--gguf`) in specrepl's llama.cpp
runtime and reports: the seconds to read `--context` tokens of real text, the
median seconds of a 1-token and a 12-token pass after them, and the largest
|logit difference| between one pass over 17 tokens and 17 one-token passes
over the same tokens (after 300 tokens of the text).

    HF_HUB_OFFLINE=1 python scripts/llamacpp_cache_types.py [--context 2800] [--mixed]

This is a measurement for the docs; specrepl does not import it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from specrepl.engine import llamacpp_runtime
from specrepl.engine.llamacpp import import_llamacpp


def cpu_name() -> str:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(
        (line.split(":", 1)[0].strip(), line.split(":", 1)[1].strip())
        for line in text.splitlines()
        if ":" in line
    )
    return (
        f"{fields.get('Model name', platform.processor())} "
        f"(family {fields.get('CPU family')}, model {fields.get('Model')})"
    )


def open_model(path: Path, key_type: int, value_type: int, flash: bool, context: int):
    real_open = llamacpp_runtime.open_gguf

    def with_setting(*args, **options):
        options["type_k"] = key_type
        options["type_v"] = value_type
        options["flash_attn"] = flash
        return real_open(*args, **options)

    llamacpp_runtime.open_gguf = with_setting
    try:
        return llamacpp_runtime.LlamaCppModel(path, context_length=context)
    finally:
        llamacpp_runtime.open_gguf = real_open


def target_file(given: Path | None) -> Path:
    """`given`, or the embedded model's float32 GGUF file (written once)."""
    if given is not None:
        return given
    from specrepl.models.embedded import embedded_gguf_path
    from specrepl.models.gguf_f32 import float32_gguf

    return float32_gguf(embedded_gguf_path())


def text_tokens(model, count: int) -> list[int]:
    """At least `count` + 64 tokens of the pasted chat's text (repeated as needed)."""
    lines = Path("benchmarks/chat_pasted.jsonl").read_text().splitlines()
    text = "\n\n".join(turn for line in lines for turn in json.loads(line)["turns"])
    ids = model.llama.tokenize(text.encode(), add_bos=False, special=False)
    while len(ids) < count + 64:
        ids = ids + ids
    return ids


def measure(model, ids: list[int], context: int, repeats: int) -> dict[str, float]:
    width = model.width
    runtime = model.open()
    sequence = torch.tensor(ids[: context + 12])
    runtime.score(sequence[:32], 1, width)
    runtime.rollback_to(0)
    started = time.perf_counter()
    runtime.score(sequence[:context], 1, width)
    read = time.perf_counter() - started
    passes: dict[int, float] = {}
    for step in (1, 12):
        timings = []
        for _ in range(repeats):
            started = time.perf_counter()
            runtime.score(sequence[: context + step], step, width)
            timings.append(time.perf_counter() - started)
            runtime.rollback_to(context)
        passes[step] = statistics.median(timings)
    runtime.rollback_to(0)
    sequence = torch.tensor(ids[:317])
    runtime.score(sequence[:300], 1, width)
    wide, _ = runtime.score(sequence, 17, width)
    runtime.rollback_to(300)
    rows = []
    for end in range(301, 318):
        row, _ = runtime.score(sequence[:end], 1, width)
        rows.append(row)
    narrow = torch.cat(rows)
    return {
        "read_seconds": read,
        "one_token_ms": passes[1] * 1000,
        "twelve_tokens_ms": passes[12] * 1000,
        "wide_vs_narrow_max_logit_diff": float((wide - narrow).abs().max()),
        "same_argmax_rows": int((wide.argmax(-1) == narrow.argmax(-1)).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--context", type=int, default=2800)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--mixed", action="store_true", help="also keys and values of different types, bfloat16"
    )
    arguments = parser.parse_args()
    llama_cpp = import_llamacpp()
    path = target_file(arguments.gguf)
    f32, f16 = llama_cpp.GGML_TYPE_F32, llama_cpp.GGML_TYPE_F16
    bf16 = getattr(llama_cpp, "GGML_TYPE_BF16", 30)  # ggml's id; the binding names no constant
    settings = [
        ("f32 cache", f32, f32, False),
        ("f32 cache, flash", f32, f32, True),
        ("f16 cache", f16, f16, False),
        ("f16 cache, flash", f16, f16, True),
    ]
    if arguments.mixed:  # keys and values of different types, and bfloat16
        settings += [
            ("f16 keys, f32 values", f16, f32, False),
            ("f32 keys, f16 values", f32, f16, False),
            ("bf16 cache", bf16, bf16, False),
            ("bf16 keys, f32 values", bf16, f32, False),
        ]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in settings}
    for _ in range(arguments.rounds):
        for name, key_type, value_type, flash in settings:
            model = open_model(path, key_type, value_type, flash, arguments.context + 64)
            ids = text_tokens(model, arguments.context)
            figures = measure(model, ids, arguments.context, arguments.repeats)
            results[name].append(figures)
            print(name, {k: round(v, 5) for k, v in figures.items()}, flush=True)
            del model
    print(f"CPU: {cpu_name()}; context {arguments.context}")
    for name, runs in results.items():
        print(
            f"{name:22s} read {min(r['read_seconds'] for r in runs):6.2f} s  "
            f"1 token {min(r['one_token_ms'] for r in runs):6.1f} ms  "
            f"12 tokens {min(r['twelve_tokens_ms'] for r in runs):6.1f} ms  "
            f"wide-narrow {max(r['wide_vs_narrow_max_logit_diff'] for r in runs):.2e}"
        )
    if arguments.json:
        arguments.json.write_text(
            json.dumps({"cpu": cpu_name(), "context": arguments.context, "runs": results}, indent=1)
        )


if __name__ == "__main__":
    main()
