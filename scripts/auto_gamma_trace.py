"""Step by step, what the `auto` gamma policy saw and chose on one Spec-Bench prompt
with the embedded pair and the default `hybrid` drafter: drafts and accepted
tokens, the drafter's and the target's seconds, and after each step the
policy's estimates (seconds per draft, target seconds per number of drafts,
acceptance at draft positions 1 to 3) and the tokens per second it expects
for gamma 0, 4 and 8. For finding out why a run drafts less than it could.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/auto_gamma_trace.py --category stem

A diagnosis, not a benchmark: one run after one untraced warm-up run of the same
prompt; the CPU's name is printed first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specrepl.engine.drafters.builder import DrafterSpec, build_drafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.gamma import AutoGamma
from specrepl.engine.generation import speculative_generate
from specrepl.engine.results import StepEvent
from specrepl.engine.widths import cpu_model
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec
from specrepl.models.width_plans import tune_pair_widths

PROMPTS = Path(__file__).resolve().parent.parent / "benchmarks" / "spec_bench.jsonl"


def _milliseconds(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--category", default="stem", help="the first prompt of this category")
    parser.add_argument("--max-gamma", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    print(cpu_model())
    pair = load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))
    tune_pair_widths(pair, args.max_gamma)
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    row = next(row for row in rows if row["category"] == args.category)
    messages = [{"role": "user", "content": row["turns"][0]}]
    ids = pair.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )
    target = pair.target.model
    copy = pair.drafter_is_copy
    spec = DrafterSpec(DrafterOptions(kind="hybrid"), copy_of_target=copy)
    drafter = build_drafter(
        spec,
        target=target,
        model=pair.drafter.model,
        target_tuning=pair.target.tuning,
        model_tuning=pair.drafter.tuning,
    )

    def run(policy: AutoGamma, on_step=None) -> None:
        result = speculative_generate(
            ids, drafter, target, gamma=policy, max_gen_len=args.max_new_tokens,
            eos_tokens_id=pair.eos_token_ids, vocab_size=pair.vocab_size, on_step=on_step,
            tuning=pair.target.tuning,
        )  # fmt: skip
        speed = result.tokens_per_second
        print(f"{result.new_tokens} tokens in {result.steps} steps, {speed:.1f} tok/s")

    run(AutoGamma(args.max_gamma))  # warm-up
    policy = AutoGamma(args.max_gamma)

    def show(event: StepEvent) -> None:
        line = (
            f"k={event.gamma} accepted={event.accepted}"
            f" from={getattr(drafter, 'last_source', '-')}"
            f" draft={_milliseconds(event.draft_seconds)}ms"
            f" target={_milliseconds(event.target_seconds)}ms"
        )
        if policy.target_cost:
            rates = policy.rates()
            measured = sorted(policy.target_cost.items())
            costs = ", ".join(f"{k}:{_milliseconds(seconds)}" for k, seconds in measured)
            acceptance = [round(rate, 2) for rate in policy.position_acceptance()[:3]]
            line += (
                f" | per draft {_milliseconds(policy.draft_cost)}ms, target {{{costs}}}ms,"
                f" acceptance {acceptance}, tok/s γ0 {rates[0]:.1f} γ4 {rates[4]:.1f}"
                f" γ8 {rates[args.max_gamma]:.1f}, next γ {policy.next_gamma()}"
            )
        print(line)

    run(policy, show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
