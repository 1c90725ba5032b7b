"""Would a hybrid that picks, step by step, the draft head or the copy in
llama.cpp (by the head's confidence) draft faster than prompt lookup and the
copy alone? Measured on the target's own greedy answers, then simulated.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/head_or_copy.py
        [--prompts benchmarks/dev_prompts.jsonl] [--limit 8] [--depth 8]
        [--max-new-tokens 128] [--min-confidence 0.4] [--json OUT]

For each prompt the float32 target writes its greedy answer. At every
position of the answer, each drafter drafts a chain of `--depth` tokens from
the target's own text before it (teacher-forced, as it would at the start of
a step there): the shipped head from the target's features (the layers it
fuses), the embedded copy in llama.cpp from its own cache, and prompt lookup.
Each chain stops where its top probability falls below `--min-confidence` (the
gamma policy's stop). Since a greedy step's outcome depends only on where it
starts, the steps any policy would take over the answer follow exactly: a
step drafts from the chosen source, keeps the chain's run of right tokens
and adds the target's own. Its cost is the target's pass over the drafts
plus the drafts: the target's passes of 1 and of depth + 1 tokens as the
engine runs them (its width plan), one copy step and one head step timed here.

Prints the CPU's name, the costs, how often the head is right by its
confidence (and the copy's run at the same positions), and each policy's
speedup over the target alone: prompt lookup then the copy (the default),
the head alone, lookup then the head where its first draft's probability is
at least a threshold and the copy elsewhere, and the best source at every
step chosen knowing the outcome (a bound no rule can pass).

A measurement, not a test: the choice it informs is in
specrepl/chat/draft_choice.py and specrepl/engine/drafters/hybrid.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from specrepl.engine.drafters.draft_head import HeadCache
from specrepl.engine.drafters.head_store import load_head
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.llamacpp import open_gguf
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.loading import load_pair
from specrepl.models.width_plans import tune_pair_widths
from specrepl.store.paths import width_plans_file
from specrepl.train.data import target_features

HEAD = Path(__file__).resolve().parents[1] / "specrepl" / "heads" / "smollm2-135m-instruct"
BUCKETS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.01)


def median_ms(call: Callable[[], object], rounds: int = 7) -> float:
    call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def cut(chain: list[int], probs: list[float], floor: float) -> list[int]:
    """The chain up to its first draft below the confidence floor (at least one)."""
    for index, prob in enumerate(probs):
        if prob < floor:
            return chain[: max(index, 1)]
    return chain


def right(chain: list[int], answer: list[int], start: int) -> int:
    """How many of the chain's tokens the target's text has from `start` on."""
    count = 0
    for offset, token in enumerate(chain):
        if start + offset >= len(answer) or answer[start + offset] != token:
            break
        count += 1
    return count


class Chains:
    """Each drafter's chain at every answer position of one sequence."""

    def __init__(self, pair, head, llama, depth: int) -> None:
        self.model, self.head, self.llama, self.depth = pair.target.model, head, llama, depth
        self.width = int(llama.n_vocab())

    def head_chains(self, sequence: torch.Tensor, prompt: int) -> list[tuple[list[int], list]]:
        head = self.head
        features = target_features(
            self.model, [sequence], pad_id=0, feature_layers=head.config.fused_layers
        )[0]
        cache, real, found = HeadCache(), 0, []
        for start in range(prompt, sequence.shape[0]):
            fused = head.fused(features[real : start - 1].to(head.output_rows.dtype))
            positions = torch.arange(real, start - 1)[None]
            hidden = head.step(fused[None], sequence[real + 1 : start][None], positions, cache)
            hidden, real = hidden[:, -1:], start - 1
            chain, probs, position = [], [], real
            for index in range(self.depth):
                law = torch.softmax(head.logits(hidden[0, 0]).float(), -1)
                best = int(law.argmax())
                chain.append(int(head.token_ids[best]))
                probs.append(float(law[best]))
                if index + 1 < self.depth:
                    token = head.token_ids[best].reshape(1, 1)
                    hidden = head.step(hidden, token, torch.tensor([[position]]), cache)
                    position += 1
            cache.rollback_to(real)
            found.append((chain, probs))
        return found

    def _copy_law(self) -> np.ndarray:
        import llama_cpp

        pointer = llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self.width,)).astype(np.float64)
        law = np.exp(logits - logits.max())
        return law / law.sum()

    def copy_chains(self, sequence: list[int], prompt: int) -> list[tuple[list[int], list]]:
        llama, found = self.llama, []
        llama.n_tokens = 0
        llama.eval(sequence[: prompt - 1])
        for start in range(prompt, len(sequence)):
            llama.n_tokens = start - 1
            llama.eval([sequence[start - 1]])
            chain, probs = [], []
            for index in range(self.depth):
                law = self._copy_law()
                best = int(law.argmax())
                chain.append(best)
                probs.append(float(law[best]))
                if index + 1 < self.depth:
                    llama.eval([best])
            found.append((chain, probs))
        llama.n_tokens = len(sequence)
        return found


def costs(pair, head, llama, prompt: list[int], depth: int) -> dict[str, float]:
    """Median ms of the target's pass over 1 and over depth + 1 tokens as the
    engine runs them (its width plan, timed at start-up and stored, or timed
    now), of one copy step after the prompt and one head step after 300
    positions (each with its logits)."""
    plan = tune_pair_widths(pair, depth, store=width_plans_file())["target"]
    llama.n_tokens = 0
    llama.eval(prompt)

    def copy_step() -> None:
        llama.eval([prompt[-1]])
        llama.n_tokens = len(prompt)

    cache, read = HeadCache(), 300
    features = torch.zeros(1, read, head.config.hidden_size, dtype=head.output_rows.dtype)
    tokens = torch.full((1, read), prompt[-1])
    hidden = head.step(features, tokens, torch.arange(read)[None], cache)[:, -1:]

    def head_step() -> None:
        head.logits(head.step(hidden, tokens[:, :1], torch.tensor([[read]]), cache))
        cache.rollback_to(read)

    return {
        "target_1": 1000 * plan.seconds[1],
        "target_wide": 1000 * plan.seconds[min(depth + 1, max(plan.seconds))],
        "copy_step": median_ms(copy_step),
        "head_step": median_ms(head_step),
    }


def simulate(records: list[dict], cost: dict[str, float], choose, floor: float) -> float:
    """Speedup over the target alone of the steps `choose` picks."""
    seconds = tokens = 0.0
    for record in records:
        answer, start = record["sequence"], record["prompt"]
        while start < len(answer):
            at = start - record["prompt"]
            options = {}
            for name, step in (("copy", cost["copy_step"]), ("head", cost["head_step"])):
                chain = cut(*record[name][at], floor)
                kept = min(right(chain, answer, start), len(answer) - start - 1)
                options[name] = (kept + 1, cost["target_wide"] + step * len(chain))
            lookup = record["lookup"][at]
            if lookup:
                kept = min(right(lookup, answer, start), len(answer) - start - 1)
                options["lookup"] = (kept + 1, cost["target_wide"])
            gained, spent = options[choose(options, record["head"][at][1][0])]
            start += gained
            tokens += gained
            seconds += spent
    return cost["target_1"] / (seconds / tokens)


def report(records: list[dict], cost: dict[str, float], floor: float) -> dict[str, object]:
    rows = []
    for record in records:
        answer = record["sequence"]
        for at, start in enumerate(range(record["prompt"], len(answer))):
            head_chain, head_probs = record["head"][at]
            copy_chain = record["copy"][at][0]
            rows.append(
                (
                    head_probs[0],
                    head_chain[0] == answer[start],
                    right(head_chain, answer, start),
                    copy_chain[0] == answer[start],
                    right(copy_chain, answer, start),
                )
            )
    table = np.array(rows, dtype=float)
    buckets = []
    for low, high in itertools.pairwise(BUCKETS):
        inside = (table[:, 0] >= low) & (table[:, 0] < high)
        if inside.any():
            buckets.append(
                {
                    "head_first_probability": [low, min(high, 1.0)],
                    "share": float(inside.mean()),
                    "head_first_right": float(table[inside, 1].mean()),
                    "head_run": float(table[inside, 2].mean()),
                    "copy_run": float(table[inside, 4].mean()),
                }
            )
    policies: dict[str, float] = {
        "lookup, then the copy (the default)": simulate(
            records, cost, lambda o, p: "lookup" if "lookup" in o else "copy", floor
        ),
        "the copy alone": simulate(records, cost, lambda o, p: "copy", floor),
        "the head alone": simulate(records, cost, lambda o, p: "head", floor),
    }
    for threshold in (0.8, 0.9, 0.95):
        policies[f"lookup, the head where its first probability >= {threshold}, else the copy"] = (
            simulate(
                records,
                cost,
                lambda o, p, t=threshold: (
                    "lookup" if "lookup" in o else ("head" if p >= t else "copy")
                ),
                floor,
            )
        )
    policies["the best source at each step, knowing the outcome (bound)"] = simulate(
        records, cost, lambda o, p: max(o, key=lambda name: o[name][0] / o[name][1]), floor
    )
    return {
        "positions": len(table),
        "head_first_right": float(table[:, 1].mean()),
        "copy_first_right": float(table[:, 3].mean()),
        "by_head_confidence": buckets,
        "speedup_over_target": policies,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/dev_prompts.jsonl"))
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--min-confidence", type=float, default=0.4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(cpu_identity(), f"{torch.get_num_threads()} threads")
    pair = load_pair("embedded")
    model, tokenizer = pair.target.model, pair.tokenizer
    head, _ = load_head(HEAD, model)
    llama = open_gguf(embedded_gguf_path(), context_length=4096, threads=torch.get_num_threads())
    chains = Chains(pair, head, llama, args.depth)
    lookup = LookupDrafter(3, 2)
    lines = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    records, cost = [], None
    for line in lines[: args.limit]:
        messages = [{"role": "user", "content": line["turns"][0]}]
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        prompt = [int(token) for token in encoded["input_ids"]]
        with torch.no_grad():
            sequence = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                eos_token_id=pair.eos_token_ids,
            )[0]
            if cost is None:
                cost = costs(pair, head, llama, prompt, args.depth)
            found = {
                "prompt": len(prompt),
                "sequence": sequence.tolist(),
                "head": chains.head_chains(sequence, len(prompt)),
                "copy": chains.copy_chains(sequence.tolist(), len(prompt)),
                "lookup": [
                    lookup.propose(sequence[:start], args.depth, None, None).tokens.tolist()  # type: ignore[arg-type]
                    for start in range(len(prompt), sequence.shape[0])
                ],
            }
        records.append(found)
        print(
            f"question {line.get('question_id')}: {sequence.shape[0] - len(prompt)} answer tokens"
        )
    assert cost is not None
    print("costs (ms, medians):", {name: round(value, 2) for name, value in cost.items()})
    result = report(records, cost, args.min_confidence)
    print(
        f"{result['positions']} positions; first draft right:"
        f" head {result['head_first_right']:.3f}, copy {result['copy_first_right']:.3f}"
    )
    print("head's first-draft probability | share | head right | head run | copy run")
    for bucket in result["by_head_confidence"]:
        low, high = bucket["head_first_probability"]
        print(
            f"[{low:.2f}, {high:.2f}) | {bucket['share']:.2f} | {bucket['head_first_right']:.2f}"
            f" | {bucket['head_run']:.2f} | {bucket['copy_run']:.2f}"
        )
    for name, speedup in result["speedup_over_target"].items():
        print(f"{speedup:.2f}x  {name}")
    if args.json:
        result.update(
            cpu=cpu_identity(), costs=cost, settings=vars(args) | {"prompts": str(args.prompts)}
        )
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
