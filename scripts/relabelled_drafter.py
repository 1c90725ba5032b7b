"""Write the embedded model's 4-bit GGUF under other tokenizers, as drafters.

For measuring drafting across tokenizers with a drafter that is cheap and
good (the embedded SmolLM2-135M-Instruct's own 4-bit file, which specrepl
drafts with in llama.cpp), this writes three GGUF files under OUT, each the
embedded file with its tokenizer changed and the token embedding's rows
(the output head is tied to it) moved with the ids:

- `shared.gguf`: the embedded tokenizer as it is, with the row of token 0
  (`<|endoftext|>`, never in a chat) taken from token 1, so that the weights'
  fingerprint differs and the drafter is not taken for a copy of the target
  (a copy takes the target's keys and values instead of reading): the same
  weights, drafting for themselves with the shared tokenizer;
- `ids.gguf`: as `shared.gguf`, with every normal token's id shuffled
  (seeded; control tokens keep theirs): the same strings under other ids;
- `text.gguf`: as `ids.gguf`, without the tokens of the last `--drop` merges
  (the rarest words): another tokenizer, drafting through text.

    HF_HUB_OFFLINE=1 python scripts/relabelled_drafter.py OUT [--drop 512]
    HF_HUB_OFFLINE=1 python infer.py bench --drafter OUT/text.gguf --drafter-kind model ...

specrepl does not import this script.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from specrepl.models.embedded import embedded_gguf_path

NORMAL = 1
"""gguf's token type of an ordinary token (control tokens are 3)."""


def new_ids(types: list[int], drop: int, seed: int | None) -> list[int]:
    """The old id of each new id: control tokens first at their own ids, then
    the normal ones (shuffled with a `seed`) without the last `drop`."""
    fixed = [i for i, kind in enumerate(types) if kind != NORMAL]
    if fixed != list(range(len(fixed))):
        raise ValueError("the control tokens are not the first ids")
    normal = [i for i, kind in enumerate(types) if kind == NORMAL]
    normal = normal[: len(normal) - drop]
    if seed is not None:
        order = torch.randperm(len(normal), generator=torch.Generator().manual_seed(seed))
        normal = [normal[i] for i in order.tolist()]
    return fixed + normal


def write(source: GGUFReader, out: Path, drop: int, seed: int | None) -> None:
    fields = source.fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    types = list(fields["tokenizer.ggml.token_type"].contents())
    old_of_new = new_ids(types, drop, seed)
    kept = set(old_of_new)
    gone = {tokens[i] for i in range(len(tokens)) if i not in kept}
    merges = [
        merge
        for merge in fields["tokenizer.ggml.merges"].contents()
        if merge.replace(" ", "") not in gone and not any(p in gone for p in merge.split(" "))
    ]
    writer = GGUFWriter(str(out), str(fields["general.architecture"].contents()))
    for name, field in fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "tokenizer.ggml.tokens":
            writer.add_array(name, [tokens[i] for i in old_of_new])
        elif name == "tokenizer.ggml.token_type":
            writer.add_array(name, [types[i] for i in old_of_new])
        elif name == "tokenizer.ggml.merges":
            writer.add_array(name, merges)
        elif name.endswith(".vocab_size"):
            writer.add_uint32(name, len(old_of_new))
        elif field.types[0] == GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), field.types[0])
    for tensor in source.tensors:
        data = np.asarray(tensor.data)
        if tensor.name in ("token_embd.weight", "output.weight"):
            data = data[old_of_new].copy()
            data[0] = data[1]  # token 0's row: the weights are not the target's
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(
        f"{out}: {len(old_of_new)} tokens, {len(merges)} merges, ids shuffled: {seed is not None}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--drop", type=int, default=512, help="merges' tokens left out of text")
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    source = GGUFReader(str(embedded_gguf_path()))
    arguments.out.mkdir(parents=True, exist_ok=True)
    write(source, arguments.out / "shared.gguf", 0, None)
    write(source, arguments.out / "ids.gguf", 0, arguments.seed)
    write(source, arguments.out / "text.gguf", arguments.drop, arguments.seed)


if __name__ == "__main__":
    main()
