"""What one verification costs on this CPU: 8 drafts over the embedded model's vocabulary.

Times the loop's verification of one step (the target's logits for 9
positions over 49,152 tokens, float32, random): greedy (`greedy_verdict`,
or `verify_greedy` in a tree that predates it) and sampling at temperature 1
(the processor's probabilities and the rejection test). Run it with
PYTHONPATH set to each tree to compare two commits. Prints one JSON line:
the median microseconds of `--reps` calls after a warm-up.

    PYTHONPATH=. python scripts/verification_costs.py

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from specrepl.engine import verification
from specrepl.engine.processors import MultinomialProcessor
from specrepl.engine.widths import cpu_identity

VOCAB = 49152


def median_us(run: Callable[[], Any], reps: int) -> float:
    for _ in range(reps // 10):
        run()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=500)
    args = parser.parse_args()
    torch.manual_seed(0)
    logits = torch.randn(9, VOCAB) * 3
    drafts = torch.argmax(logits[:8], dim=-1)
    drafts[5] = (drafts[5] + 1) % VOCAB  # the sixth draft is rejected
    q = torch.softmax(torch.randn(8, VOCAB) * 3, dim=-1)
    sampled = torch.multinomial(q, 1).squeeze(-1)
    processor = MultinomialProcessor(1.0)
    generator = torch.Generator().manual_seed(0)
    if hasattr(verification, "greedy_verdict"):

        def greedy() -> Any:
            return verification.greedy_verdict(drafts, logits)

        def sampling() -> Any:
            probs, usable = processor.unread_probabilities(logits)
            return verification.sampling_verdict(sampled, q, probs, generator, usable)

    else:

        def greedy() -> Any:
            return verification.verify_greedy(drafts, logits)

        def sampling() -> Any:
            return verification.verify_sampling(
                sampled, q, processor.probabilities(logits), generator
            )

    print(
        json.dumps(
            {
                "cpu": cpu_identity(),
                "threads": torch.get_num_threads(),
                "greedy_us": median_us(greedy, args.reps),
                "sampling_us": median_us(sampling, args.reps),
                "greedy_result": list(verification.verify_greedy(drafts, logits)),
            }
        )
    )


if __name__ == "__main__":
    main()
