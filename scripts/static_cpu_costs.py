"""What the embedded target's one-token step costs on this CPU in each torch runtime.

The static runtime (`engine/static_runtime.py`) is the target's runtime on a
GPU where it measures faster. This times, on the CPU, the embedded float32
target's cached one-token step (the median of `--steps` after a prompt of
`--context` tokens, the first two left out):

- eager, with its width plan (what `target_runtime torch` runs);
- over a static cache, uncompiled, holding `--lengths` positions;
- over a static cache of `--compiled-length` positions compiled with
  `torch.compile` (one width, 1), with the seconds its warm-up took.

Writes one JSON file.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python scripts/static_cpu_costs.py --out OUT.json

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from specrepl.engine.runtime import RunnableModel, TorchModel
from specrepl.engine.static_runtime import StaticTorchModel
from specrepl.engine.widths import cpu_identity
from specrepl.models.loading import load_pair
from specrepl.models.width_plans import tune_pair_widths


def step_ms(runnable: RunnableModel, context: int, steps: int) -> float:
    """Median milliseconds of a cached one-token step after `context` tokens."""
    runtime = runnable.open()
    ids = torch.arange(1, context + steps + 2) % 1000 + 5
    times = []
    with torch.no_grad():
        runtime.score(ids[:context], 1, runnable.width)
        for index in range(steps):
            started = time.perf_counter()
            runtime.score(ids[: context + index + 1], 1, runnable.width)
            times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--compiled-length", type=int, default=2048)
    args = parser.parse_args()
    pair = load_pair("embedded")
    tune_pair_widths(pair, 8)
    model = pair.target.model
    out: dict[str, Any] = {
        "cpu": cpu_identity(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "context": args.context,
        "eager_ms": step_ms(TorchModel(model, pair.target.tuning), args.context, args.steps),
        "static_uncompiled_ms": {},
    }
    for length in args.lengths:
        static = StaticTorchModel(model, max_length=length, compile=False)
        out["static_uncompiled_ms"][str(length)] = step_ms(static, args.context, args.steps)
        del static
    started = time.perf_counter()
    compiled = StaticTorchModel(model, max_length=args.compiled_length, compile=True, buckets=(1,))
    compiled.warm_up(repeats=2)
    out["static_compiled"] = {
        "length": args.compiled_length,
        "warm_up_seconds": time.perf_counter() - started,
        "ms": step_ms(compiled, args.context, args.steps),
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
