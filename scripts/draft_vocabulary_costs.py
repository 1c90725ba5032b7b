"""What a copy of the embedded model with a narrower output layer would buy: its
agreement with the float32 target and its cost per drafted token, on this machine.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/draft_vocabulary_costs.py
        [--sizes 8192,16384,24576] [--lengths 64,1000,2900] [--rounds 25] [--json OUT]

The shipped copy (Q4_1, its tied embedding in Q8_0) computes the logits of all
49,152 tokens at every draft: a fifth of its multiply-adds. A copy that keeps
only the K tokens the target answers with most often (counted over the
training records of `distill-data/`, the target's own answers; EAGLE-3 calls
this a draft vocabulary) computes K rows. llama.cpp sizes a model's output
layer by its tokenizer, so such a copy is a GGUF file whose vocabulary is
those K tokens (in the order of their ids) and whose embedding is their rows;
it reads its input as embeddings (the full table's rows, de-quantized), since
most ids of a text are not among its K.

For each K this prints:

- coverage: the share of the held-back records' answer tokens among the K
  (held back by the layout rule `distill` uses: record i of a shard when
  i % 33 == 0);
- agreement: the share of the target's greedy tokens on the development
  prompts that the copy's argmax gives, read after the target's earlier
  tokens, over all 49,152 rows (the shipped copy) and over the K kept rows
  only; the narrow file's logits of its K rows are checked to equal the
  shipped copy's there, so the second is exactly the narrow copy's;
- cost: one cached decoding step after L held positions, the shipped copy fed
  token ids (as specrepl feeds it, "all") and embeddings (under its own
  vocabulary size), the narrow ones embeddings, alternated in rounds in one
  process, median ms. Each file is a weight set of its own, so which of them
  a large cache keeps between steps weighs in too: compare the narrow sizes
  with each other for what the rows cost.

A measurement for the docs, not a test; specrepl does not import it. The CPU's
name, family and model are printed first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize
from llamacpp_formats import target_answers

from specrepl.engine.widths import cpu_identity
from specrepl.models.embedded import embedded_gguf_path
from specrepl.train.shards import decode_shard

DATA = Path(__file__).resolve().parents[1] / "distill-data" / "smollm2-135m-instruct"
VOCABULARY = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
HELD_BACK_EVERY = 33
FLOAT32 = 0
"""ggml's type id of float32: the copy keeps float32 keys and values to take the target's."""
SPECIAL = 17
"""SmolLM2's special tokens are ids 0-16: always kept, so their ids stay theirs."""


def answer_counts(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Token counts over the training records' answers, and the held-back answers' ids."""
    counts = np.zeros(vocab, dtype=np.int64)
    held: list[np.ndarray] = []
    for path in sorted(DATA.glob("shard-*.npz")):
        with np.load(path) as arrays:
            records = decode_shard(dict(arrays), vocab)
        for index, record in enumerate(records):
            answer = record.ids[record.prompt_length :].astype(np.int64)
            if index % HELD_BACK_EVERY == 0:
                held.append(answer)
            else:
                counts += np.bincount(answer, minlength=vocab)
    return counts, np.concatenate(held)


def kept_ids(counts: np.ndarray, size: int) -> np.ndarray:
    ranked = counts.copy()
    ranked[:SPECIAL] = ranked.max() + 1
    return np.sort(np.argsort(-ranked, kind="stable")[:size])


def write_narrow(reader: GGUFReader, keep: np.ndarray, out: Path) -> None:
    """`reader`'s file with only the `keep` tokens in its vocabulary and embedding."""
    writer = GGUFWriter(str(out), str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            values = field.contents()
            writer.add_array(name, [values[i] for i in keep] if name in VOCABULARY else values)
        else:
            writer.add_key_value(name, field.contents(), kind)
    for tensor in reader.tensors:
        data = tensor.data[keep] if tensor.name == "token_embd.weight" else tensor.data
        writer.add_tensor(
            tensor.name, np.ascontiguousarray(data), raw_shape=data.shape,
            raw_dtype=tensor.tensor_type,
        )  # fmt: skip
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class EmbeddingFeed:
    """Decodes ids into a llama.cpp model as rows of the full embedding table."""

    def __init__(self, llama_cpp, llama, table) -> None:
        self.llama_cpp, self.llama, self.table = llama_cpp, llama, table
        self.width = int(llama.n_embd())
        self.batch = llama_cpp.llama_batch_init(512, self.width, 1)

    def decode(self, ids: list[int], position: int) -> np.ndarray:
        """Decode `ids` from `position` (at most 512); the last one's logits."""
        rows = dequantize(self.table.data[np.asarray(ids)], self.table.tensor_type)
        embd = np.ctypeslib.as_array(self.batch.embd, shape=(512 * self.width,))
        embd[: len(ids) * self.width] = rows.reshape(-1)
        for index in range(len(ids)):
            self.batch.pos[index] = position + index
            self.batch.n_seq_id[index] = 1
            self.batch.seq_id[index][0] = 0
            self.batch.logits[index] = int(index == len(ids) - 1)
        self.batch.n_tokens = len(ids)
        if self.llama_cpp.llama_decode(self.llama.ctx, self.batch) != 0:
            raise RuntimeError("llama.cpp could not decode the embeddings")
        pointer = self.llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(int(self.llama.n_vocab()),)).copy()

    def read(self, ids: list[int]) -> None:
        self.clear()
        for offset in range(0, len(ids), 512):
            self.decode(ids[offset : offset + 512], offset)

    def remove_from(self, position: int) -> None:
        memory = self.llama_cpp.llama_get_memory(self.llama.ctx)
        self.llama_cpp.llama_memory_seq_rm(memory, 0, position, -1)

    def clear(self) -> None:
        self.llama_cpp.llama_memory_clear(self.llama_cpp.llama_get_memory(self.llama.ctx), True)


def agreements(full, answers, sizes_keep: dict[int, np.ndarray]) -> dict[str, float]:
    """The shipped copy's argmax against the target's tokens: over every row, and over each K."""
    hits: dict[str, list[bool]] = {"all": [], **{str(size): [] for size in sizes_keep}}
    for prompt, answer in answers:
        full.reset()
        full.eval(prompt + answer)
        scores = np.asarray(full.scores[len(prompt) - 1 : len(prompt) + len(answer) - 1])
        truth = np.asarray(answer)
        hits["all"].extend(scores.argmax(-1) == truth)
        for size, keep in sizes_keep.items():
            hits[str(size)].extend(keep[scores[:, keep].argmax(-1)] == truth)
    return {name: float(np.mean(values)) for name, values in hits.items()}


def step_costs(llama_cpp, shipped, fed: dict[int, EmbeddingFeed], ids, length, rounds):
    """Median ms of one decoding step after `length` held positions: the
    `shipped` copy fed ids ("all"), and each copy `fed` embeddings, by its
    vocabulary size."""
    shipped.reset()
    shipped.eval(ids[:length])
    for feed in fed.values():
        feed.read(ids[:length])
    memory, width = llama_cpp.llama_get_memory(shipped.ctx), int(shipped.n_vocab())
    seconds: dict[str, list[float]] = {"all": [], **{str(size): [] for size in fed}}
    for _ in range(rounds):
        began = time.perf_counter()
        shipped.eval([ids[length]])
        pointer = llama_cpp.llama_get_logits_ith(shipped.ctx, -1)
        int(np.argmax(np.ctypeslib.as_array(pointer, shape=(width,)).copy()))
        seconds["all"].append(time.perf_counter() - began)
        shipped.n_tokens = length
        llama_cpp.llama_memory_seq_rm(memory, 0, length, -1)
        for size, feed in fed.items():
            began = time.perf_counter()
            int(np.argmax(feed.decode([ids[length]], length)))
            seconds[str(size)].append(time.perf_counter() - began)
            feed.remove_from(length)
    return {name: 1e3 * statistics.median(values) for name, values in seconds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8192,16384,24576")
    parser.add_argument("--lengths", default="64,1000,2900")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import llama_cpp  # optional: scripts/setup.sh builds it

    print(cpu_identity(), f"llama-cpp-python {llama_cpp.__version__}, {args.threads} threads")
    shipped = embedded_gguf_path()
    reader = GGUFReader(str(shipped))
    table = next(tensor for tensor in reader.tensors if tensor.name == "token_embd.weight")
    vocab = int(table.shape[1])
    counts, held = answer_counts(vocab)
    sizes = [int(size) for size in args.sizes.split(",")]
    keeps = {size: kept_ids(counts, size) for size in sizes}
    lengths = [int(length) for length in args.lengths.split(",")]
    context = max(lengths) + 64
    result: dict = {"cpu": cpu_identity(), "held_back_answer_tokens": int(held.size)}
    result["coverage"] = {str(s): float(np.isin(held, k).mean()) for s, k in keeps.items()}
    print(f"coverage of {held.size} held-back answer tokens:", result["coverage"])
    answers = target_answers(args.prompts, args.tokens)
    options = {"n_threads": args.threads, "n_batch": 512, "verbose": False}
    options.update(type_k=FLOAT32, type_v=FLOAT32)
    full = llama_cpp.Llama(str(shipped), n_ctx=context, logits_all=True, **options)
    result["agreement"] = agreements(full, answers, keeps)
    print(f"agreement on {sum(len(a) for _, a in answers)} target tokens:", result["agreement"])
    with tempfile.TemporaryDirectory() as folder:
        narrow: dict[int, EmbeddingFeed] = {}
        for size, keep in keeps.items():
            path = Path(folder) / f"narrow-{size}.gguf"
            write_narrow(reader, keep, path)
            model = llama_cpp.Llama(str(path), n_ctx=context, **options)
            narrow[size] = EmbeddingFeed(llama_cpp, model, table)
        prompt = answers[0][0] + answers[0][1]
        full.reset()
        full.eval(prompt)
        for size, feed in narrow.items():  # the narrow copy's rows are the shipped copy's
            feed.read(prompt[:-1])
            logits = feed.decode(prompt[-1:], len(prompt) - 1)
            difference = np.abs(np.asarray(full.scores[len(prompt) - 1])[keeps[size]] - logits)
            result.setdefault("largest_difference", {})[str(size)] = float(difference.max())
        print("largest |logit difference| on the kept rows:", result["largest_difference"])
        del full  # its output buffer holds every position's logits: steps timed without
        plain = llama_cpp.Llama(str(shipped), n_ctx=context, **options)
        whole = llama_cpp.Llama(str(shipped), n_ctx=context, **options)
        narrow[vocab] = EmbeddingFeed(llama_cpp, whole, table)  # every row, fed embeddings
        ids = [int(token) for token in held[: context + 8]]
        result["step_ms"] = {}
        for length in lengths:
            costs = step_costs(llama_cpp, plain, narrow, ids, length, args.rounds)
            result["step_ms"][str(length)] = costs
            print(f"step after {length} positions, ms:", {k: round(v, 2) for k, v in costs.items()})
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
