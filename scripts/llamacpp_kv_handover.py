"""Whether a llama.cpp target's keys and values can be handed to the llama.cpp
copy of it, and what that costs: the next step for the target in llama.cpp.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/llamacpp_kv_handover.py
        [--context 500] [--new 8] [--checks 5]

Opens the embedded model's float32 GGUF file (the llama.cpp target, as
`--target-runtime llamacpp` runs it) and its 4-bit file twice (the copy that
drafts, and a reader that reads for itself), every context with float32 keys
and values and two sequences. The target reads `context` tokens of a
repeated English text; its whole sequence state is written into the copy
(`llama_state_seq_get_data` / `set_data`). Then, `checks` times: the target
reads `new` more tokens; only those positions are handed over (the target's
sequence 0 marked into its sequence 1 with `llama_memory_seq_cp`, the state of
sequence 1 read, written into the copy's sequence 1 and joined to its
sequence 0); the copy and the reader each predict the next token, and their
argmax and largest logit difference are printed. The copy's logits never
equal the reader's (its own keys come from its 4-bit weights, the handed ones
from the float32 target); what matters is the argmax. Prints the CPU first;
times in ms, one run each (not a benchmark).

A measurement, not a test: see specrepl/engine/drafters/llamacpp_kv.py for
the same handover from a torch target.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path
from typing import Any

import numpy as np

from specrepl.engine.llamacpp import import_llamacpp, open_gguf
from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.models.gguf_f32 import float32_gguf

TEXT = "The history of the city begins with a small settlement by the river. " * 200


def decode(library: Any, llama: Any, tokens: list[int], position: int, sequence: int = 0):
    """Feed `tokens` from `position` into `sequence`; the last token's logits."""
    batch = library.llama_batch_init(len(tokens), 0, 1)
    try:
        batch.n_tokens = len(tokens)
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = position + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence
            batch.logits[index] = index == len(tokens) - 1
        if library.llama_decode(llama.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        library.llama_batch_free(batch)
    pointer = library.llama_get_logits_ith(llama.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llama.n_vocab(),)).copy()


def sequence_state(library: Any, llama: Any, sequence: int) -> tuple[Any, int]:
    size = library.llama_state_seq_get_size(llama.ctx, sequence)
    buffer = (ctypes.c_uint8 * size)()
    return buffer, library.llama_state_seq_get_data(llama.ctx, buffer, size, sequence)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--new", type=int, default=8)
    parser.add_argument("--checks", type=int, default=5)
    args = parser.parse_args()
    print("CPU:", cpu_identity())
    library = import_llamacpp()
    quantized = embedded_gguf_path()
    exact = float32_gguf(quantized)
    options = {
        "context_length": 4096,
        "threads": 2,
        "sequences": 2,
        "type_k": library.GGML_TYPE_F32,
        "type_v": library.GGML_TYPE_F32,
    }
    target = open_gguf(Path(exact), **options)
    copy = open_gguf(Path(quantized), **options)
    reader = open_gguf(Path(quantized), **options)
    tokens = target.tokenize(TEXT.encode())
    needed = args.context + args.checks * (args.new + 1) + 1
    if len(tokens) < needed:
        raise SystemExit(f"the text gives {len(tokens)} tokens, {needed} needed")
    target_memory = library.llama_get_memory(target.ctx)
    copy_memory = library.llama_get_memory(copy.ctx)

    held = args.context
    decode(library, target, tokens[:held], 0)
    started = time.perf_counter()
    state, size = sequence_state(library, target, 0)
    taken = time.perf_counter()
    if library.llama_state_seq_set_data(copy.ctx, state, size, 0) != size:
        raise SystemExit("llama.cpp refused the target's state in the copy")
    written = time.perf_counter()
    print(
        f"whole handover of {held} positions: {size / 1e6:.1f} MB,"
        f" read {1e3 * (taken - started):.1f} ms, written {1e3 * (written - taken):.1f} ms"
    )
    started = time.perf_counter()
    decode(library, reader, tokens[:held], 0)
    print(f"the reader reading them itself: {1e3 * (time.perf_counter() - started):.0f} ms")

    for check in range(args.checks):
        # the copy predicts position `held` from the handed keys and values
        copy_logits = decode(library, copy, [tokens[held]], held)
        reader_logits = decode(library, reader, [tokens[held]], held)
        print(
            f"check {check + 1}: after {held + 1} tokens argmax copy {copy_logits.argmax()}"
            f" reader {reader_logits.argmax()}"
            f" max|diff| {float(np.abs(copy_logits - reader_logits).max()):.3f}"
        )
        # the target reads position `held` and `new` more; hand over only those
        fresh = tokens[held : held + args.new + 1]
        decode(library, target, fresh, held)
        decode(library, reader, fresh[1:], held + 1)
        library.llama_memory_seq_rm(copy_memory, 0, held, -1)  # the copy's own read of `held`
        started = time.perf_counter()
        library.llama_memory_seq_rm(target_memory, 1, -1, -1)
        library.llama_memory_seq_cp(target_memory, 0, 1, held, held + len(fresh))
        state, size = sequence_state(library, target, 1)
        library.llama_memory_seq_rm(target_memory, 1, -1, -1)
        if library.llama_state_seq_set_data(copy.ctx, state, size, 1) != size:
            raise SystemExit("llama.cpp refused the appended state in the copy")
        library.llama_memory_seq_cp(copy_memory, 1, 0, -1, -1)
        library.llama_memory_seq_rm(copy_memory, 1, -1, -1)
        print(
            f"  appended {len(fresh)} positions: {size} bytes,"
            f" {1e3 * (time.perf_counter() - started):.2f} ms"
        )
        held += len(fresh)


if __name__ == "__main__":
    main()
