"""Forward seconds per width of the embedded pair's models with their linear layers
in the stock form (x Wᵀ), weight first ((W xᵀ)ᵀ) and packed (oneDNN with a packed
copy of the weights, where this torch and CPU can), on this machine.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/linear_forms_costs.py [--rounds 3]
        [--prompt-widths 64,256,769]

With --prompt-widths, prompt-sized passes (that many tokens at once after the
context, one logit kept) are timed stock and packed too, as a width plan
decides for every pass wider than its own widths (`widths.WIDE_WIDTHS`).

The forms are timed in alternating rounds in one process (a slow spell of the
machine lands on both), as `widths.py` times them at start-up; the CPU's name
is printed first. A measurement, not a test: see specrepl/engine/linear_forms.py.
"""

from __future__ import annotations

import argparse
import statistics

from specrepl.engine.linear_forms import RowForms
from specrepl.engine.widths import cpu_identity, measure_wide_samples, measure_width_samples
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec
from specrepl.models.tuning import allow_linear_forms, pack_linear_weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-width", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--prompt-widths", default="")
    args = parser.parse_args()

    print(cpu_identity())
    pair = load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))
    every = frozenset(range(1, args.max_width + 1))
    for role, loaded in (("target", pair.target), ("drafter", pair.drafter)):
        model = loaded.model
        allow_linear_forms(model, loaded.tuning)
        forms = {"stock": RowForms(), "weight first": RowForms(weight_first=every)}
        if pack_linear_weights(model, loaded.tuning):
            forms["packed"] = RowForms(packed=every)
        times: dict[str, dict[int, list[float]]] = {form: {} for form in forms}
        for _ in range(args.rounds):
            for form, row_forms in forms.items():
                samples = measure_width_samples(
                    model,
                    args.max_width,
                    context=args.context,
                    repeats=3,
                    forms=row_forms,
                    tuning=loaded.tuning,
                )
                for width, seconds in samples.items():
                    times[form].setdefault(width, []).extend(seconds)
        one = statistics.median(times["stock"][1])
        print(f"{role} ({loaded.dtype}): ms per width 1..{args.max_width} (× stock width 1)")
        for form, per_width in times.items():
            cells = [
                f"{1e3 * statistics.median(t):.0f} ({statistics.median(t) / one:.2f})"
                for _, t in sorted(per_width.items())
            ]
            print(f"  {form:12s} " + "  ".join(cells))
        prompt_widths = tuple(int(w) for w in args.prompt_widths.split(",") if w)
        if prompt_widths and "packed" in forms:
            timed = measure_wide_samples(
                model,
                prompt_widths,
                {"stock": forms["stock"], "packed": RowForms(packed_from=1)},
                context=args.context,
                repeats=args.rounds,
                tuning=loaded.tuning,
            )
            print(
                "  prompt passes, ms (stock / packed): "
                + "  ".join(
                    f"{w}: {1e3 * statistics.median(timed['stock'][w]):.0f}"
                    f" / {1e3 * statistics.median(timed['packed'][w]):.0f}"
                    for w in prompt_widths
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
