"""What a draft of the llama.cpp copy costs while it holds a window of a long chat.

The default's copy (the embedded 4-bit GGUF file) takes the float32 target's
keys and values (`engine/drafters/llamacpp_state.py`). Over a long chat it
holds the chat's start and a window of its last positions. This times the
copy's one-token step (the least of `--repeats` after a warm-up):

- holding the whole chat, and the start and the window one after another (the
  copy reading them itself: what holding the window costs at best);
- after a move of its positions (`llama_memory_seq_add`, as a window moved to
  follow the start did before 2026-11-29): llama.cpp rotates every cell of the
  context at the next pass;
- while the window slides on as the drafter now does (`StateImporter.drop`,
  then `append` of the target's new positions where the target holds them),
  `--slides` times `--step` positions.

The text is random tokens: attention costs the same whatever the keys hold.
Writes one JSON file.

    HF_HUB_OFFLINE=1 PYTHONPATH=. python scripts/copy_window_costs.py --out OUT.json

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

from specrepl.engine.drafters.draft_view import SINK_TOKENS
from specrepl.engine.drafters.llamacpp import LlamaCppDraftRuntime
from specrepl.engine.drafters.llamacpp_state import probe_state_importer
from specrepl.engine.llamacpp import import_llamacpp
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.gguf_f32 import float32_gguf


def step_ms(runtime: LlamaCppDraftRuntime, token: int, repeats: int) -> tuple[float, float]:
    """The least and the first of `repeats` + 1 one-token steps, in ms."""
    held = runtime.llama.n_tokens
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        runtime.feed([token])
        times.append(1000 * (time.perf_counter() - started))
        runtime.cut(held)
    return min(times[1:]), times[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--context", type=int, default=2000, help="positions before sliding")
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--slides", type=int, default=200)
    parser.add_argument("--step", type=int, default=5, help="positions a slide adds")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    copy_file = embedded_gguf_path()
    target = LlamaCppModel(float32_gguf(copy_file), context_length=8192, threads=args.threads)
    importer, reason = probe_state_importer(
        copy_file, target, context_length=8192, threads=args.threads or 2
    )
    if importer is None:
        raise SystemExit(f"no importer: {reason}")
    library: Any = import_llamacpp()
    memory = library.llama_get_memory(importer.llama.ctx)
    ids = np.random.default_rng(0).integers(100, 40000, args.context + args.slides * args.step + 1)
    ids = ids.tolist()
    held = target.open()
    count = args.context
    held.score(torch.tensor(ids[:count]), 1, target.width)
    copy = LlamaCppDraftRuntime(importer.llama)
    result: dict[str, Any] = {
        "cpu": cpu_identity(),
        "probe": reason,
        "args": vars(args) | {"out": str(args.out)},
    }

    def clear() -> None:
        importer.llama.n_tokens = 0
        importer.positions.cut(0)
        library.llama_memory_seq_rm(memory, -1, -1, -1)

    clear()
    importer.llama.eval(ids[:count])
    result["whole_ms"] = step_ms(copy, ids[count], args.repeats)[0]
    clear()
    importer.llama.eval(ids[:SINK_TOKENS] + ids[count - args.window : count])
    result["window_read_ms"] = step_ms(copy, ids[count], args.repeats)[0]
    library.llama_memory_seq_rm(memory, 0, SINK_TOKENS, SINK_TOKENS + 1)
    library.llama_memory_seq_add(memory, 0, SINK_TOKENS + 1, -1, -1)  # the rest moved by one
    importer.llama.n_tokens -= 1
    first = step_ms(copy, ids[count], args.repeats)
    result["after_a_move_first_ms"], result["after_a_move_then_ms"] = first[1], first[0]
    clear()
    importer.write(held, SINK_TOKENS, ids)
    importer.append(held, count - args.window, count, ids, held=SINK_TOKENS)
    result["window_taken_ms"] = step_ms(copy, ids[count], args.repeats)[0]
    sliding = []
    for slide in range(1, args.slides + 1):
        held.score(torch.tensor(ids[: count + args.step]), 1, target.width)
        importer.drop(SINK_TOKENS, args.step)
        importer.append(held, count, count + args.step, ids, held=importer.llama.n_tokens)
        count += args.step
        if slide % max(1, args.slides // 4) == 0:
            ms = step_ms(copy, ids[count], args.repeats)[0]
            sliding.append({"slides": slide, "position": count, "step_ms": ms})
            print(json.dumps(sliding[-1]), flush=True)
    result["sliding"] = sliding
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_ms")}))


if __name__ == "__main__":
    main()
