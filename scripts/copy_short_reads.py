"""What the llama.cpp copy pays to read a few tokens, and to take them from the target instead.

The default's copy (the embedded 4-bit GGUF file) drafts for the float32
target in llama.cpp and takes the target's keys and values
(`engine/drafters/llamacpp_state.py`). After a step that kept every draft,
the copy lacks its last draft (it never fed it) besides the target's new
token: it can read both in one pass, or take the draft's position from the
target and read one token. This times, after `--after` positions taken from
the target, the copy's passes of 1 to `--widest` tokens and handovers of 1 to
3 positions (the least of `--repeats` after one to warm up), and the
shortest stretch the probe would hand over at each length
(`fewest_worth_handing_over`). The tokens are random: what a pass costs does
not depend on them. Writes one JSON file.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python scripts/copy_short_reads.py --out OUT.json

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specrepl.engine.drafters.llamacpp_state import (
    StateImporter,
    fewest_worth_handing_over,
    probe_state_importer,
)
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.gguf_f32 import float32_gguf


def least_ms(run: Any, repeats: int) -> float:
    """The least of `repeats` calls of `run` after one to warm up, in ms."""
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        run()
        times.append(1000 * (time.perf_counter() - started))
    return min(times[1:])


def costs_after(
    importer: StateImporter, target: Any, ids: list[int], after: int, widest: int, repeats: int
) -> dict[str, Any]:
    """Passes of 1..`widest` tokens and handovers of 1..3 positions after `after` held."""
    llama = importer.llama
    importer.write(target, after, ids)

    def read(width: int) -> None:
        llama.n_tokens = after
        llama.eval(ids[after : after + width])

    reads = {width: least_ms(lambda w=width: read(w), repeats) for width in range(1, widest + 1)}
    handovers = {
        count: least_ms(lambda c=count: importer.append(target, after, after + c, ids), repeats)
        for count in (1, 2, 3)
    }
    llama.n_tokens = after
    widths = [reads[width] for width in range(1, 5)]
    return {
        "after": after,
        "read_ms": reads,
        "handover_ms": handovers,
        "fewest_worth_handing_over": fewest_worth_handing_over(widths, list(handovers.values())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--after", default="64,1400,2800", help="positions held, comma-separated")
    parser.add_argument("--widest", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    afters = [int(part) for part in args.after.split(",")]
    copy_file = embedded_gguf_path()
    target = LlamaCppModel(float32_gguf(copy_file), context_length=8192, threads=args.threads)
    importer, reason = probe_state_importer(
        copy_file, target, context_length=8192, threads=args.threads
    )
    if importer is None:
        raise SystemExit(f"no importer: {reason}")
    ids = np.random.default_rng(0).integers(100, 40000, max(afters) + args.widest + 1).tolist()
    held = target.open()
    held.score(torch.tensor(ids[: max(afters) + 3]), 1, target.width)
    rows = [costs_after(importer, held, ids, after, args.widest, args.repeats) for after in afters]
    result = {"cpu": cpu_identity(), "threads": args.threads, "probe": reason, "rows": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        reads = " ".join(f"{width}:{ms:.1f}" for width, ms in row["read_ms"].items())
        handed = " ".join(f"{count}:{ms:.2f}" for count, ms in row["handover_ms"].items())
        print(f"after {row['after']}: read ms by width {reads}; handover ms {handed}")


if __name__ == "__main__":
    main()
