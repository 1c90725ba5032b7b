"""How much a bounded view would cost the llama.cpp copy in agreement, and save in time.

In a long chat the copy drafting in llama.cpp attends over the whole context,
and its step grows with it (on the 2-core AMD EPYC family 25 model 17: about
8 ms after 64 tokens, 10 after 1,000, 20 after 3,000), while the target's own
step grows far less. A copy that kept only the chat's first tokens and the
last W (as StreamingLLM keeps a sink and a window) would draft at about the
short-context cost. This script measures both sides of that trade on the
pasted-documents chat, with llama.cpp alone:

- it plays the chat through the full-context copy (its greedy answers, up to
  `--answer-tokens` each, become the history);
- at every turn whose prompt has at least `--min-context` tokens, the full
  copy's greedy answer is the reference, and the same copy fed only the
  prompt's first 4 tokens and its last W (for each W in `--windows`), then
  the reference answer token by token, is scored by how often its argmax is
  the reference token (teacher-forced agreement with the full copy);
- one decoding step is timed after the full prompt and after each window.

The full copy agrees with the float32 target on about 98% of greedy tokens
(docs/llamacpp.md), so agreement with it stands for agreement with the
target. A measurement, not a test: run it on a quiet machine; the CPU is
named first.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/drafting_window.py benchmarks/chat_pasted.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from specrepl.engine.llamacpp import import_llamacpp
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path

SINK = 4
TEMPLATE_TURN = "<|im_start|>{role}\n{text}<|im_end|>\n"


def chat_ids(llama, turns: list[tuple[str, str]], question: str) -> list[int]:
    """The ChatML prompt of `turns` (role, text) then `question`, as token ids."""
    text = "".join(TEMPLATE_TURN.format(role=r, text=t) for r, t in turns)
    text += TEMPLATE_TURN.format(role="user", text=question) + "<|im_start|>assistant\n"
    return llama.tokenize(text.encode(), add_bos=False, special=True)


def last_argmax(llama) -> int:
    """The argmax of the logits after the last token evaluated."""
    library = import_llamacpp()
    pointer = library.llama_get_logits_ith(llama.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(pointer, shape=(llama.n_vocab(),))))


def greedy(llama, prompt: list[int], count: int, end: int) -> list[int]:
    """The copy's greedy continuation of `prompt` (at most `count` tokens)."""
    llama.reset()
    llama.eval(prompt)
    out: list[int] = []
    for _ in range(count):
        token = last_argmax(llama)
        if token == end:
            break
        out.append(token)
        llama.eval([token])
    return out


def agreement(llama, view: list[int], reference: list[int]) -> float:
    """How often the copy fed `view`, then the reference token by token, has
    the reference token as its argmax."""
    llama.reset()
    llama.eval(view)
    right = 0
    for token in reference:
        right += last_argmax(llama) == token
        llama.eval([token])
    return right / max(1, len(reference))


def step_ms(llama, view: list[int], repeats: int = 9) -> float:
    """Median ms of one decoding step after `view` (the step rolled back each time)."""
    llama.reset()
    llama.eval(view)
    held = llama.n_tokens
    times = []
    for _ in range(repeats):
        llama.n_tokens = held
        start = time.perf_counter()
        llama.eval([view[-1]])
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chat", type=Path, help="a chat file (one JSON line with `turns`)")
    parser.add_argument("--windows", default="256,512,1024")
    parser.add_argument("--answer-tokens", type=int, default=96)
    parser.add_argument("--min-context", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=0, help="only the first N turns (0: all)")
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]

    print(cpu_identity())
    llama_cpp = import_llamacpp()
    llama = llama_cpp.Llama(
        model_path=str(embedded_gguf_path()),
        n_ctx=8192,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    end = llama.tokenize(b"<|im_end|>", add_bos=False, special=True)[0]
    questions = json.loads(args.chat.read_text().splitlines()[0])["turns"]
    questions = questions[: args.turns] if args.turns else questions
    history: list[tuple[str, str]] = []
    rows = []
    for index, question in enumerate(questions, 1):
        prompt = chat_ids(llama, history, question)
        answer = greedy(llama, prompt, args.answer_tokens, end)
        if len(prompt) >= args.min_context and answer:
            row = {"turn": index, "context": len(prompt), "full_ms": step_ms(llama, prompt)}
            for window in windows:
                view = prompt[:SINK] + prompt[-window:]
                row[f"agree_{window}"] = agreement(llama, view, answer)
                row[f"ms_{window}"] = step_ms(llama, view)
            rows.append(row)
            cells = "  ".join(
                f"W{w}: {row[f'agree_{w}']:.3f} {row[f'ms_{w}']:.1f} ms" for w in windows
            )
            print(f"turn {index:2d} context {len(prompt):5d} full {row['full_ms']:.1f} ms  {cells}")
        reply = llama.detokenize(answer).decode(errors="replace")
        history += [("user", question), ("assistant", reply)]
    if rows:
        print(f"full context: step {statistics.median(r['full_ms'] for r in rows):.1f} ms (median)")
        for window in windows:
            agree = statistics.median(r[f"agree_{window}"] for r in rows)
            ms = statistics.median(r[f"ms_{window}"] for r in rows)
            print(f"window {window}: agreement {agree:.3f}, step {ms:.1f} ms (medians over turns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
