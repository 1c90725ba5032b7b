"""What a bfloat16 copy of the embedded model costs against the float32 target
on this machine: prompt processing (prefill) at a few lengths, and one cached
decoding step. bf16 is cheaper than fp32 on some CPUs and several times dearer
on others (no native bf16 instructions), which decides whether the default
drafter copy can pay. Prints one JSON line per length, then the CPU's name.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/dtype_costs.py

A measurement, not a test: medians of 3 runs after one warm-up each.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specrepl.engine.kv_cache import rollback_to
from specrepl.engine.widths import cpu_model
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec

LENGTHS = (64, 256, 769)


def _median_seconds(call, repeats: int = 3) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.inference_mode()
def main() -> int:
    pair = load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))
    models = {"float32": pair.target.model, "bfloat16": pair.drafter.model}
    generator = torch.Generator().manual_seed(0)
    for length in LENGTHS:
        ids = torch.randint(100, 20_000, (1, length), generator=generator)
        row: dict[str, object] = {"prompt_tokens": length}
        for name, model in models.items():

            def prefill(model=model, ids=ids) -> None:
                model(ids, use_cache=True)

            cache = model(ids, use_cache=True).past_key_values

            def decode(model=model, cache=cache, ids=ids, length=length) -> None:
                model(ids[:, -1:], past_key_values=cache, use_cache=True)
                rollback_to(cache, length)  # back to the prompt: every step is the same

            row[f"{name}_prefill_s"] = round(_median_seconds(prefill), 3)
            row[f"{name}_step_s"] = round(_median_seconds(decode), 4)
        row["prefill_bf16_over_fp32"] = round(
            row["bfloat16_prefill_s"] / row["float32_prefill_s"], 2
        )
        row["step_bf16_over_fp32"] = round(row["bfloat16_step_s"] / row["float32_step_s"], 2)
        print(json.dumps(row))
    print(json.dumps({"cpu": cpu_model(), "torch_threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
