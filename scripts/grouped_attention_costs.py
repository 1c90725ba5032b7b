"""The embedded target's passes of one and of several tokens after long contexts,
attending with transformers' `sdpa` (key and value heads repeated for every
masked pass of several tokens) or with `GROUPED_ATTENTION` (heads kept
grouped), on this machine.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/grouped_attention_costs.py
        [--attention sdpa|grouped] [--contexts 1000,3000,8000] [--width 8]

One attention per process (run it once for each, alternating, so that a slow
spell lands on both); the linear layers stay in the stock form. Prints the
CPU's name, then per context the median milliseconds of a pass of 1 and of
`--width` tokens. A measurement, not a test: see
specrepl/engine/grouped_attention.py.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specrepl.engine.grouped_attention import GROUPED_ATTENTION
from specrepl.engine.kv_cache import new_cache, rollback_to
from specrepl.engine.widths import cpu_identity
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec

CHUNK = 1000
"""Context tokens fed a pass at a time (a long paste fed at once is not the point)."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attention", choices=("sdpa", "grouped"), default="grouped")
    parser.add_argument("--contexts", default="1000,3000,8000")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()

    pair = load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))
    model = pair.target.model
    model.set_attn_implementation("sdpa" if args.attention == "sdpa" else GROUPED_ATTENTION)
    print(f"{cpu_identity()}, {torch.get_num_threads()} threads, attention {args.attention}")
    widths = (1, args.width)
    for context in (int(c) for c in args.contexts.split(",")):
        generator = torch.Generator().manual_seed(0)
        tokens = torch.randint(
            0, model.config.vocab_size, (context + args.width,), generator=generator
        )
        cache = new_cache(model)
        cells = []
        with torch.no_grad():
            for start in range(0, context, CHUNK):
                fed = tokens[None, start : min(context, start + CHUNK)]
                model(input_ids=fed, past_key_values=cache, use_cache=True, logits_to_keep=1)
            for width in widths:
                seconds = []
                for _ in range(args.repeats + 2):  # the first two warm up
                    began = time.perf_counter()
                    model(
                        input_ids=tokens[None, context : context + width],
                        past_key_values=cache,
                        use_cache=True,
                        logits_to_keep=width,
                    )
                    seconds.append(time.perf_counter() - began)
                    rollback_to(cache, context)
                cells.append(f"{width} tokens {1e3 * statistics.median(seconds[2:]):.1f} ms")
        print(f"after {context} tokens: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
