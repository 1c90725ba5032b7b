"""The GPU check: one command that says how specrepl runs on a GPU, in one JSON file.

On a CUDA machine (a lent GPU) it runs, in this order, each part written to
the JSON as soon as it ends (a run cut short keeps what it finished):

1. `tests/test_cuda.py` (greedy equality and distill on the GPU, tiny models);
2. for Llama shapes of 1B and 8B with random bfloat16 weights (the shapes of
   Llama-3.2-1B and Llama-3.1-8B, output head untied and scaled so that the
   greedy choice is rarely a near-tie): specrepl's torch runtime's pass over
   1 to 17 new tokens after a fixed context (a one-token step and every
   verification width up to gamma 16);
3. specrepl's target alone against transformers `generate()` (eager, its
   dynamic cache), same prompt, same number of new tokens, greedy;
4. speculative runs with an oracle drafter (it proposes the target's own
   greedy continuation, known from the target's run, so every draft is
   right where the bfloat16 passes agree) at gamma 4, 8 and 16: what the loop
   itself costs a step beyond its verification pass;
5. the 1B shape drafting for the 8B shape (a real model drafter, random
   weights, so nearly nothing is accepted): its cost per draft against the
   8B shape's one-token step;
6. transformers `generate()` with a static cache, compiled (the
   reduce-overhead mode transformers chooses on a GPU): the compile time and
   the run after it, the yardstick for a compiled runtime;
7. specrepl's static runtime (compiled on a GPU) for each shape: its
   warm-up, the target alone, the oracle at each gamma whose verification
   width is a bucket; then the 1B shape drafting for the 8B shape with both
   over their static runtimes: its cost per draft against the 8B shape's
   compiled one-token pass.

Without CUDA (`--cpu`, or no GPU found) it runs parts 2-7 on tiny shapes on
the CPU in seconds, so that CI keeps the script working; the figures of that
mode mean nothing.

    python scripts/gpu_check.py --out benchmarks/results/<date>-<gpu>-gpu-check/gpu-check.json

`--budget` seconds bounds the whole run: a part that would start after it is
recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from specrepl.engine.devices import synchronize
from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.draft_runtime import TorchDraftRuntime
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.output_match import first_difference as parting
from specrepl.engine.results import GenerationResult
from specrepl.engine.runtime import TorchModel
from specrepl.engine.static_runtime import StaticTorchModel

# Llama-3.2-1B and Llama-3.1-8B as their config.json files give them.
GPU_SHAPES: dict[str, dict[str, int]] = {
    "llama-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
    ),
}
CPU_SHAPES: dict[str, dict[str, int]] = {
    "tiny-draft": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
    "tiny-target": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
    ),
}
HEAD_SCALE = 8.0
WIDTHS = range(1, 18)
GAMMAS = (4, 8, 16)
PARTS = ("tests", "widths", "alone", "oracle", "drafter", "compiled", "static")


class OracleDrafter(Drafter):
    """Proposes the next tokens of a known sequence (the target's own greedy
    answer): every draft is right while the run follows that answer. A
    measuring instrument: it costs nothing and reads nothing from the device."""

    def __init__(self, known: torch.Tensor) -> None:
        self.name = "oracle"
        self.known = known

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        pass

    def propose(self, sequence, k, processor, generator, min_confidence=0.0) -> Draft:
        start = sequence.shape[0]
        return Draft(self.known[start : start + k], None)

    def update(self, sequence, valid_length, target_logits=None, target_features=None) -> None:
        pass


class Check:
    """The JSON being written, the clock of the whole run and its budget."""

    def __init__(self, out: Path, budget: float, device: torch.device) -> None:
        self.out = out
        self.budget = budget
        self.device = device
        self.started = time.perf_counter()
        self.report: dict[str, Any] = {"parts": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def save(self) -> None:
        self.report["elapsed_seconds"] = round(self.elapsed(), 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.report, indent=1) + "\n")

    def part(self, name: str, run: Callable[[], Any], *, needs: float = 0.0) -> Any:
        """Run one part, unless fewer than `needs` seconds of the budget are
        left; record its result (or why it was skipped, or how it failed)."""
        left = self.budget - self.elapsed()
        if left < needs:
            self.report["parts"][name] = {"skipped": f"{left:.0f} s of the budget left"}
            self.save()
            return None
        began = time.perf_counter()
        try:
            result = run()
        except Exception as error:  # a failed part is a finding; the rest still runs
            self.report["parts"][name] = {"failed": f"{type(error).__name__}: {error}"}
            print(f"[{name}] failed: {error}", flush=True)
            self.save()
            return None
        self.report["parts"][name] = {"seconds": round(time.perf_counter() - began, 1), **result}
        print(f"[{name}] done in {time.perf_counter() - began:.1f} s", flush=True)
        self.save()
        return result

    def wall(self, run: Callable[[], Any]) -> tuple[float, Any]:
        """Seconds `run` takes, the device drained before and after."""
        synchronize(self.device)
        began = time.perf_counter()
        value = run()
        synchronize(self.device)
        return time.perf_counter() - began, value


def machine(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu_name(),
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        facts |= {
            "gpu": properties.name,
            "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
            "multiprocessors": properties.multi_processor_count,
            "capability": f"{properties.major}.{properties.minor}",
            "cuda": torch.version.cuda,
        }
    return facts


def cpu_name() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor()
    fields = dict(line.split(":", 1) for line in lines.splitlines() if ":" in line)
    return ", ".join(
        f"{key.strip().lower()} {fields[key].strip()}"
        for key in ("Model name", "CPU family", "Model")
        if key in fields
    )


def build_llama(shape: dict[str, int], device: torch.device, dtype: torch.dtype, seed: int):
    """A Llama of this shape with random weights, on `device` in `dtype`,
    its output head scaled by HEAD_SCALE (see the module docstring)."""
    config = LlamaConfig(
        **shape,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    with torch.no_grad():
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def random_tokens(count: int, vocab_size: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab_size, (count,), generator=generator).tolist()


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 3)


def pass_widths(check: Check, model, context: int, reps: int) -> dict[str, Any]:
    """specrepl's torch runtime: one pass over w new tokens after `context`
    tokens, w = 1..17 (median ms of `reps` after one warm-up each)."""
    runnable = TorchModel(model)
    runtime = runnable.open()
    vocab = runnable.width
    ids = random_tokens(context + max(WIDTHS), vocab, seed=7)
    sequence = torch.tensor(ids, device=check.device)
    with torch.inference_mode():
        runtime.score(sequence[:context], 1, vocab)
        widths: dict[str, float] = {}
        for width in WIDTHS:
            times = []
            for _ in range(reps + 1):
                seconds, _ = check.wall(
                    lambda w=width: runtime.score(sequence[: context + w], w, vocab)
                )
                runtime.rollback_to(context)
                times.append(seconds)
            widths[str(width)] = median_ms(times[1:])
    return {"context": context, "reps": reps, "ms_by_width": widths}


def timed_runs(check: Check, run: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    """One warm-up, then `reps` timed runs; the last run's value."""
    run()
    times, value = [], None
    for _ in range(reps):
        seconds, value = check.wall(run)
        times.append(seconds)
    return times, value


def agreeing_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens the two runs share."""
    position = parting(a, b)
    return len(a) if position is None else position


def target_alone(check: Check, model, prompt: list[int], new: int, reps: int) -> dict[str, Any]:
    """specrepl's target alone and transformers' eager generate(), same tokens asked."""
    runnable = TorchModel(model)

    def ours() -> GenerationResult:
        return autoregressive_generate(prompt, runnable, max_gen_len=new)

    inputs = torch.tensor([prompt], device=check.device)

    def theirs() -> list[int]:
        with torch.inference_mode():
            output = model.generate(inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        return output[0, len(prompt) :].tolist()

    our_times, result = timed_runs(check, ours, reps)
    their_times, their_tokens = timed_runs(check, theirs, reps)
    return {
        "new_tokens": new,
        "reps": reps,
        "specrepl_target": tokens_per_second(our_times, new),
        "transformers_generate_eager": tokens_per_second(their_times, new),
        "same_tokens_as_generate": result.token_ids == their_tokens,
        "agreeing_prefix": agreeing_prefix(result.token_ids, their_tokens),
        "tokens": result.token_ids,
    }


def tokens_per_second(times: list[float], new: int) -> dict[str, float]:
    seconds = statistics.median(times)
    return {"median_seconds": round(seconds, 4), "tokens_per_second": round(new / seconds, 2)}


def first_difference(model, prompt: list[int], reference: list[int], tokens: list[int]):
    """Where a run parts from the reference: the position, and how far apart
    the two tokens' logits are there in one pass over the prompt and the
    reference before it (a gap within the pass's rounding is a near-tie)."""
    position = agreeing_prefix(tokens, reference)
    if position >= min(len(tokens), len(reference)):
        return None
    device = model.lm_head.weight.device
    ids = torch.tensor([prompt + reference[:position]], device=device)
    with torch.inference_mode():
        logits = model(ids, logits_to_keep=1).logits[0, -1].float()
    top2 = logits.topk(2).values
    return {
        "position": position,
        "reference_minus_run_logit": round(
            float(logits[reference[position]] - logits[tokens[position]]), 4
        ),
        "top2_gap": round(float(top2[0] - top2[1]), 4),
        "logit_std": round(float(logits.std()), 3),
        "reference_is_argmax": int(logits.argmax()) == reference[position],
    }


def oracle_runs(
    check: Check, model, prompt: list[int], reference: list[int], reps: int, step_ms: dict
) -> dict[str, Any]:
    """Speculative runs whose drafts are the target's own answer, gamma 4/8/16."""
    runnable = TorchModel(model)
    known = torch.tensor(prompt + reference, device=check.device)
    new = len(reference)
    _, alone = timed_runs(
        check, lambda: autoregressive_generate(prompt, runnable, max_gen_len=new), 1
    )
    rows = {}
    for gamma in GAMMAS:

        def run(g=gamma) -> GenerationResult:
            return speculative_generate(
                prompt,
                OracleDrafter(known),
                runnable,
                gamma=make_policy("fixed", g),
                max_gen_len=new,
            )

        times, result = timed_runs(check, run, reps)
        seconds = statistics.median(times)
        loop = result.seconds - result.draft_seconds - result.target_seconds
        rows[str(gamma)] = {
            **tokens_per_second(times, new),
            "steps": result.steps,
            "tokens_per_step": round(len(result.token_ids) / max(result.steps, 1), 2),
            "acceptance": round(result.accepted / max(result.drafted, 1), 3),
            "same_text": result.token_ids == reference,
            "agreeing_prefix": agreeing_prefix(result.token_ids, reference),
            "ms_per_step": round(seconds / max(result.steps, 1) * 1000, 3),
            "target_ms_per_step": round(result.target_seconds / max(result.steps, 1) * 1000, 3),
            "loop_ms_per_step": round(loop / max(result.steps, 1) * 1000, 3),
            "verification_pass_ms": step_ms.get(str(gamma + 1)),
            "first_difference": first_difference(model, prompt, reference, result.token_ids),
        }
    rows["target_alone_same_as_before"] = alone.token_ids == reference
    return {"new_tokens": new, "reps": reps, "by_gamma": rows}


def model_drafter(check: Check, drafter, target, prompt: list[int], new: int, steps: dict):
    """A real model drafter (the smaller shape) for the larger: cost per draft."""
    runnable = TorchModel(target)

    def run() -> GenerationResult:
        return speculative_generate(
            prompt, ModelDrafter(drafter), runnable, gamma=make_policy("fixed", 4), max_gen_len=new
        )

    times, result = timed_runs(check, run, 1)
    per_draft = result.draft_seconds / max(result.drafted, 1)
    one_step = steps["target"]["ms_by_width"]["1"] / 1000
    return {
        "gamma": 4,
        "new_tokens": new,
        "drafted": result.drafted,
        "accepted": result.accepted,
        "same_text_as_target": result.token_ids == steps["reference"][:new],
        "ms_per_draft": round(per_draft * 1000, 3),
        "target_one_token_ms": steps["target"]["ms_by_width"]["1"],
        "draft_cost_over_target_step": round(per_draft / one_step, 3),
        "one_token_step_ratio": round(
            steps["drafter"]["ms_by_width"]["1"] / steps["target"]["ms_by_width"]["1"], 3
        ),
        "run_seconds": round(statistics.median(times), 3),
    }


def compiled_generate(check: Check, model, prompt: list[int], reference: list[int], reps: int):
    """transformers generate() with a static cache (compiled where transformers compiles)."""
    inputs = torch.tensor([prompt], device=check.device)
    new = len(reference)

    def run() -> list[int]:
        with torch.inference_mode():
            output = model.generate(
                inputs,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                cache_implementation="static",
            )
        return output[0, len(prompt) :].tolist()

    first, _ = check.wall(run)
    times, tokens = timed_runs(check, run, reps)
    return {
        "first_call_seconds": round(first, 2),
        **tokens_per_second(times, new),
        "same_tokens_as_specrepl_target": tokens == reference,
        "agreeing_prefix": agreeing_prefix(tokens, reference),
        "compiled": check.device.type == "cuda",
    }


def static_runtime(
    check: Check,
    model,
    prompt: list[int],
    reference: list[int],
    reps: int,
    buckets: tuple,
    kept: dict[str, Any],
) -> dict[str, Any]:
    """specrepl's static-cache runtime (compiled on a GPU): its warm-up (the
    compilation of every bucket), the target alone, and the oracle's drafts
    at each gamma whose verification width is a bucket. The warmed-up
    runtime and its text are left in `kept` for the static drafter's part."""
    began = time.perf_counter()
    static = StaticTorchModel(model, buckets=buckets, max_length=1024)
    kept["static"] = static
    timed = static.warm_up()
    warm_up = time.perf_counter() - began
    new = len(reference)
    times, alone = timed_runs(
        check, lambda: autoregressive_generate(prompt, static, max_gen_len=new), reps
    )
    own = alone.token_ids
    kept["text"] = own
    known = torch.tensor(prompt + own, device=check.device)
    rows = {}
    for gamma in [bucket - 1 for bucket in static.buckets if bucket > 1]:
        spec_times, result = timed_runs(
            check,
            lambda g=gamma: speculative_generate(
                prompt, OracleDrafter(known), static, gamma=make_policy("fixed", g), max_gen_len=new
            ),
            reps,
        )
        rows[str(gamma)] = {
            **tokens_per_second(spec_times, new),
            "steps": result.steps,
            "acceptance": round(result.accepted / max(result.drafted, 1), 3),
            "same_text_as_static_alone": result.token_ids == own,
            "agreeing_prefix": agreeing_prefix(result.token_ids, own),
            "loop_ms_per_step": round(
                (result.seconds - result.draft_seconds - result.target_seconds)
                / max(result.steps, 1)
                * 1000,
                3,
            ),
        }
    return {
        "compiled": static.compiled,
        "buckets": list(static.buckets),
        "warm_up_seconds": round(warm_up, 1),
        "ms_by_bucket": {
            str(bucket): round(seconds * 1000, 3) for bucket, seconds in timed.items()
        },
        "target_alone": tokens_per_second(times, new),
        "agreeing_prefix_with_eager_target": agreeing_prefix(own, reference),
        "oracle_by_gamma": rows,
    }


def static_drafter(
    check: Check, drafter: StaticTorchModel, target: StaticTorchModel, prompt: list[int], own
) -> dict[str, Any]:
    """The smaller shape drafting for the larger, both over their static
    runtimes (compiled on a GPU), gamma 4: its cost per draft against the
    target's one-token pass there (random weights: nearly nothing is
    accepted; the text must be the static target's own)."""
    new = len(own)

    def run() -> GenerationResult:
        return speculative_generate(
            prompt,
            ModelDrafter(TorchDraftRuntime(drafter)),
            target,
            gamma=make_policy("fixed", 4),
            max_gen_len=new,
        )

    times, result = timed_runs(check, run, 1)
    per_draft = result.draft_seconds / max(result.drafted, 1)
    one_step = target.one_token_seconds() or float("nan")
    return {
        "gamma": 4,
        "new_tokens": new,
        "drafted": result.drafted,
        "accepted": result.accepted,
        "same_text_as_static_target": result.token_ids == own,
        "ms_per_draft": round(per_draft * 1000, 3),
        "target_one_token_ms": round(one_step * 1000, 3),
        "draft_cost_over_target_step": round(per_draft / one_step, 3),
        "run_seconds": round(statistics.median(times), 3),
    }


def cuda_tests() -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    began = time.perf_counter()
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_cuda.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = (finished.stdout + finished.stderr).strip().splitlines()
    return {
        "returncode": finished.returncode,
        "summary": lines[-1] if lines else "",
        "tail": lines[-15:],
        "test_seconds": round(time.perf_counter() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    parser.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (CI's mode)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    parser.add_argument("--new-tokens", type=int, default=None, help="new tokens a generation")
    parser.add_argument(
        "--reps", type=int, default=None, help="timed runs a measure (after one warm-up)"
    )
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="the models' dtype (default: bfloat16 on a GPU, float32 on the CPU)",
    )
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"which parts to run, comma-separated among {','.join(PARTS)}",
    )
    parser.add_argument(
        "--buckets",
        default="1,5,9,17",
        help="the static runtime's compiled widths, comma-separated",
    )
    arguments = parser.parse_args(argv)
    buckets = tuple(int(width) for width in arguments.buckets.split(","))
    parts = {part.strip() for part in arguments.parts.split(",") if part.strip()}
    if parts - set(PARTS):
        parser.error(f"unknown parts {sorted(parts - set(PARTS))}; choose among {', '.join(PARTS)}")

    on_gpu = torch.cuda.is_available() and not arguments.cpu
    device = torch.device("cuda") if on_gpu else torch.device("cpu")
    shapes = GPU_SHAPES if on_gpu else CPU_SHAPES
    dtype = getattr(torch, arguments.dtype or ("bfloat16" if on_gpu else "float32"))
    new = arguments.new_tokens or (128 if on_gpu else 16)
    reps = arguments.reps or (3 if on_gpu else 1)
    context = 256 if on_gpu else 24
    check = Check(arguments.out, arguments.budget, device)
    check.report |= {
        "mode": "gpu" if on_gpu else "cpu (tiny shapes: the figures mean nothing)",
        "machine": machine(device),
        "dtype": str(dtype).removeprefix("torch."),
        "shapes": shapes,
        "head_scale": HEAD_SCALE,
        "embedded_pair": (
            "not run: the embedded model's smallest file (its Q4 GGUF, 98 MB) is over the "
            "64 MiB a device call carries, and the device machine reaches no registry"
        ),
    }
    check.save()
    if "tests" in parts and on_gpu:
        check.part("cuda_tests", cuda_tests)
    elif "tests" in parts:
        check.report["parts"]["cuda_tests"] = {
            "skipped": "no CUDA (CI runs tests/test_cuda.py skipped)"
        }

    drafter_name, target_name = shapes
    models = {
        name: build_llama(shape, device, dtype, seed=index)
        for index, (name, shape) in enumerate(shapes.items())
    }
    prompt = random_tokens(64 if on_gpu else 12, shapes[target_name]["vocab_size"], seed=3)
    found: dict[str, Any] = {}
    for name, model in models.items():
        if "widths" in parts:
            found[name] = check.part(
                f"pass_widths/{name}", lambda m=model: pass_widths(check, m, context, reps)
            )
    for name, model in models.items():
        if "alone" in parts:
            alone = check.part(
                f"target_alone/{name}",
                lambda m=model: target_alone(check, m, prompt, new, reps),
                needs=30 if on_gpu else 0,
            )
            if alone is None:
                continue
            reference = alone["tokens"]
        else:
            reference = autoregressive_generate(
                prompt, TorchModel(model), max_gen_len=new
            ).token_ids
        found[f"{name}/reference"] = reference
        if "oracle" not in parts:
            continue
        widths = found.get(name) or {"ms_by_width": {}}
        check.part(
            f"oracle/{name}",
            lambda m=model, r=reference, w=widths: oracle_runs(
                check, m, prompt, r, reps, w["ms_by_width"]
            ),
            needs=30 if on_gpu else 0,
        )
    if (
        "drafter" in parts
        and found.get(drafter_name)
        and found.get(target_name)
        and found.get(f"{target_name}/reference")
    ):
        steps = {
            "drafter": found[drafter_name],
            "target": found[target_name],
            "reference": found[f"{target_name}/reference"],
        }
        check.part(
            "model_drafter",
            lambda: model_drafter(
                check, models[drafter_name], models[target_name], prompt, min(new, 32), steps
            ),
            needs=30 if on_gpu else 0,
        )
    for name, model in models.items():
        reference = found.get(f"{name}/reference")
        if reference is None or "compiled" not in parts:
            continue
        check.part(
            f"static_compiled/{name}",
            lambda m=model, r=reference: compiled_generate(check, m, prompt, r, reps),
            needs=120 if on_gpu else 0,
        )
    statics: dict[str, dict[str, Any]] = {name: {} for name in models}
    for name, model in models.items():
        reference = found.get(f"{name}/reference")
        if reference is None or "static" not in parts:
            continue
        check.part(
            f"static_runtime/{name}",
            lambda m=model, r=reference, k=statics[name]: static_runtime(
                check, m, prompt, r, reps, buckets, k
            ),
            needs=60 if on_gpu else 0,
        )
    if "text" in statics[drafter_name] and "text" in statics[target_name]:
        check.part(
            "static_drafter",
            lambda: static_drafter(
                check,
                statics[drafter_name]["static"],
                statics[target_name]["static"],
                prompt,
                statics[target_name]["text"][: min(new, 32)],
            ),
            needs=30 if on_gpu else 0,
        )
    if on_gpu:
        check.report["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    check.save()
    failed = [name for name, part in check.report["parts"].items() if "failed" in part]
    print(f"wrote {arguments.out} in {check.elapsed():.0f} s; failed parts: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
