"""What another llama.cpp format of the embedded drafter would buy, on this machine:
its agreement with the float32 target and its cost per drafted token.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/llamacpp_formats.py [--formats Q4_0,Q8_0]
        [--prompts 8] [--tokens 96] [--rounds 5] [--widths 1,2,4,8,16]

The shipped file (Q4_1, its embedding in Q8_0) is what the target's weights
are decoded from, so the copy drafting from it agrees with the target almost
always. Each other format is made from that file with llama.cpp's own
requantization (into a temporary folder, removed at the end) and measured
the same way:

- agreement: the share of the target's greedy tokens (on the development
  prompts) that the copy's argmax gives at the same place, each place read
  after the target's own earlier tokens (the chance a greedy draft there is
  accepted);
- cost: one cached decoding step, timed in alternating rounds in one process
  (a slow spell of the machine lands on all), median ms;
- with --widths, the shipped file's cost of one pass over that many tokens,
  as a multiple of one token (what verifying drafts inside llama.cpp would
  cost, e.g. a copy checking a cheaper drafter's tokens).

A measurement, not a test; the CPU's name, family and model are printed first.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.loading import load_pair
from specrepl.models.prompting import chat_prompt_ids

FORMATS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q8_0": 7, "IQ4_NL": 25, "F16": 1, "BF16": 32}
"""llama.cpp's file types (enum llama_ftype) by name."""

DEV_PROMPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "dev_prompts.jsonl"


def requantized(llama_cpp, source: Path, name: str, folder: Path) -> Path:
    out = folder / f"{name}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FORMATS[name]
    params.allow_requantize = True
    params.nthread = 2
    if llama_cpp.llama_model_quantize(
        str(source).encode(), str(out).encode(), ctypes.byref(params)
    ):
        raise RuntimeError(f"llama.cpp could not write {name}")
    return out


def target_answers(count: int, tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the float32 target's greedy answer) for the first dev prompts."""
    pair = load_pair("embedded")
    lines = DEV_PROMPTS.read_text(encoding="utf-8").splitlines()[:count]
    answers = []
    for line in lines:
        prompt = chat_prompt_ids(
            pair.tokenizer, [{"role": "user", "content": json.loads(line)["turns"][0]}]
        )
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = pair.target.model.generate(ids, max_new_tokens=tokens, do_sample=False)
        answers.append((prompt, out[0, len(prompt) :].tolist()))
    return answers


def agreement(model, answers: list[tuple[list[int], list[int]]]) -> float:
    hits = []
    for prompt, answer in answers:
        model.reset()
        model.eval(prompt + answer)
        scores = np.asarray(model.scores[len(prompt) - 1 : len(prompt) + len(answer) - 1])
        hits.extend(scores.argmax(-1) == np.asarray(answer))
    return float(np.mean(hits))


def step_seconds(model, prompt: list[int], answer: list[int]) -> list[float]:
    model.reset()
    model.eval(prompt)
    seconds = []
    for token in answer[:48]:
        began = time.perf_counter()
        model.eval([token])
        seconds.append(time.perf_counter() - began)
    return seconds


def width_costs(model, prompt: list[int], widths: list[int], rounds: int) -> dict[int, float]:
    samples: dict[int, list[float]] = {w: [] for w in widths}
    filler = (prompt * (1 + max(widths) // max(len(prompt), 1)))[: max(widths)]
    for _ in range(rounds):
        for width in widths:
            model.reset()
            model.eval(prompt)
            began = time.perf_counter()
            model.eval(filler[:width])
            samples[width].append(time.perf_counter() - began)
    one = statistics.median(samples[widths[0]])
    return {w: statistics.median(s) / one for w, s in samples.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="Q4_0,Q5_0,Q8_0,IQ4_NL")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--widths", default="")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import llama_cpp  # optional: scripts/setup.sh builds it

    print(cpu_identity(), f"llama-cpp-python {llama_cpp.__version__}, {args.threads} threads")
    shipped = embedded_gguf_path()
    answers = target_answers(args.prompts, args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        files = {"Q4_1 (shipped)": shipped}
        for name in filter(None, args.formats.split(",")):
            files[name] = requantized(llama_cpp, shipped, name, Path(folder))
        models = {
            name: llama_cpp.Llama(
                model_path=str(path),
                n_ctx=2048,
                n_threads=args.threads,
                n_batch=512,
                logits_all=True,
                verbose=False,
            )
            for name, path in files.items()
        }
        seconds: dict[str, list[float]] = {name: [] for name in models}
        for _ in range(args.rounds):
            for name, model in models.items():
                for prompt, answer in answers[:3]:
                    seconds[name].extend(step_seconds(model, prompt, answer))
        shipped_step = statistics.median(seconds["Q4_1 (shipped)"])
        tokens = sum(len(answer) for _, answer in answers)
        print(f"agreement with the float32 target's greedy tokens ({tokens} tokens), step cost")
        for name, model in models.items():
            step = statistics.median(seconds[name])
            print(
                f"  {name:16s} agreement {agreement(model, answers):.3f}   step {1e3 * step:.2f} ms"
                f" ({step / shipped_step:.2f} of the shipped file's)"
            )
        if args.widths:
            widths = sorted(int(w) for w in args.widths.split(","))
            costs = width_costs(models["Q4_1 (shipped)"], answers[0][0], widths, args.rounds)
            print("the shipped file, one pass over N tokens, x one token:")
            print("  " + "  ".join(f"{w}: {c:.2f}" for w, c in costs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
