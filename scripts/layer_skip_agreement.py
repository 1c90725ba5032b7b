"""Would the embedded target with some of its layers left out draft well enough?

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/layer_skip_agreement.py [--drop 14]
        [--choose 8] [--tokens 96]

A copy that skips layers (self-speculative decoding: Draft & Verify, SWIFT,
LayerSkip) costs in proportion to the layers it keeps, and where it is handed
the target's keys and values, as the llama.cpp copy is, it drafts after the
full model's cache. This measures that case in torch, float32: the full
model's greedy answers are written once; then, at every answer position, the
skipping model's argmax is read after the full model's keys and values of the
earlier positions (its own only at the position itself), against the full
model's argmax there (the chance a first draft is accepted). Layers are left
out one at a time, each time the one whose loss costs least on the first
`--choose` first turns of `benchmarks/chat_filled.jsonl`; the agreement is
read on the 8 dev prompts, which chose nothing.

A measurement, not a test; the CPU is named first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from specrepl.engine.widths import cpu_identity
from specrepl.models.loading import load_pair
from specrepl.models.prompting import chat_prompt_ids

ROOT = Path(__file__).resolve().parents[1]


class Layers:
    """The embedded model's decoder layers, run by hand so that attention can
    read another run's keys and values."""

    def __init__(self, model) -> None:
        config = model.config
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads

    def _project(self, layer, hidden, cos, sin):
        n = hidden.shape[1]
        attention = layer.self_attn
        x = layer.input_layernorm(hidden)
        q = attention.q_proj(x).view(1, n, self.heads, self.head_dim).transpose(1, 2)
        k = attention.k_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attention.v_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _finish(self, layer, hidden, attended):
        n = hidden.shape[1]
        hidden = hidden + layer.self_attn.o_proj(attended.transpose(1, 2).reshape(1, n, -1))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def full(self, ids):
        """Every layer's keys and values, the rotary tables and the argmax."""
        n = ids.shape[1]
        hidden = self.model.model.embed_tokens(ids)
        cos, sin = self.model.model.rotary_emb(hidden, torch.arange(n)[None])
        group = self.heads // self.kv_heads
        keys, values = [], []
        for layer in self.model.model.layers:
            q, k, v = self._project(layer, hidden, cos, sin)
            keys.append(k)
            values.append(v)
            attended = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=True
            )
            hidden = self._finish(layer, hidden, attended)
        logits = self.model.lm_head(self.model.model.norm(hidden))
        return keys, values, cos, sin, logits.argmax(-1)[0]

    def skipping(self, ids, full, kept: list[int]):
        """The argmax at each position of the layers `kept` alone, each position
        attending to the full model's keys and values before it."""
        keys, values, cos, sin, _ = full
        n = ids.shape[1]
        group = self.heads // self.kv_heads
        earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)
        hidden = self.model.model.embed_tokens(ids)
        for index in kept:
            layer = self.model.model.layers[index]
            q, k, v = self._project(layer, hidden, cos, sin)
            full_k = keys[index].repeat_interleave(group, 1)
            full_v = values[index].repeat_interleave(group, 1)
            own_k, own_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            scores = (q @ full_k.transpose(-1, -2)).masked_fill(~earlier, float("-inf"))
            own = (q * own_k).sum(-1, keepdim=True)
            weights = torch.softmax(torch.cat([scores, own], -1) / self.head_dim**0.5, -1)
            attended = weights[..., :n] @ full_v + weights[..., n:] * own_v
            hidden = self._finish(layer, hidden, attended)
        return self.model.lm_head(self.model.model.norm(hidden)).argmax(-1)[0]


def answered(model, tokenizer, layers: Layers, prompts: list[str], tokens: int):
    """(ids, where the answer starts, the full model's run) per prompt."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt}])])
        whole = model.generate(ids, max_new_tokens=tokens, do_sample=False)
        out.append((whole, ids.shape[1], layers.full(whole)))
    return out


def agreement(layers: Layers, runs, kept: list[int]) -> float:
    right = total = 0
    for ids, start, full in runs:
        drafted = layers.skipping(ids, full, kept)[start - 1 : -1]
        right += int((drafted == full[4][start - 1 : -1]).sum())
        total += len(drafted)
    return right / total


def first_turns(path: Path) -> list[str]:
    return [json.loads(line)["turns"][0] for line in path.read_text().splitlines() if line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drop", type=int, default=14, help="layers to leave out, one by one")
    parser.add_argument("--choose", type=int, default=8, help="prompts the choice is made on")
    parser.add_argument("--tokens", type=int, default=96, help="answer tokens per prompt")
    args = parser.parse_args()
    print(f"CPU: {cpu_identity()}", flush=True)
    torch.set_grad_enabled(False)
    pair = load_pair("embedded", device="cpu")
    tokenizer, model = pair.tokenizer, pair.target.model.eval()
    layers = Layers(model)
    choose = answered(
        model,
        tokenizer,
        layers,
        first_turns(ROOT / "benchmarks" / "chat_filled.jsonl")[: args.choose],
        args.tokens,
    )
    read = answered(
        model,
        tokenizer,
        layers,
        first_turns(ROOT / "benchmarks" / "dev_prompts.jsonl"),
        args.tokens,
    )
    kept = list(range(len(model.model.layers)))
    print(f"all {len(kept)} layers: agreement {agreement(layers, read, kept):.3f}", flush=True)
    for dropped in range(1, args.drop + 1):
        scored = [(agreement(layers, choose, [j for j in kept if j != i]), i) for i in kept]
        best, index = max(scored)
        kept.remove(index)
        print(
            f"{dropped:2d} left out (layer {index}): agreement {agreement(layers, read, kept):.3f}"
            f" on the dev prompts, {best:.3f} where chosen",
            flush=True,
        )


if __name__ == "__main__":
    main()
