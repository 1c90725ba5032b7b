"""A draft head: a one-layer network that drafts from the target's own hidden states.

For a target with no small sibling (the embedded SmolLM2-135M is the smallest
of its family) the drafter is trained, not borrowed. The head follows EAGLE
(Li et al. 2024, arXiv 2401.15077): at position t it reads the target's final
hidden state f_t (the input of the target's output layer) and the embedding of
the next token x_{t+1}, mixes them with one linear layer, runs one decoder
layer with its own KV cache, and emits h_t, its guess of f_{t+1}. The target's
output rows turn h_t into logits for x_{t+2}. Drafting further feeds h_t back
as the next position's feature. A head may also read earlier layers of the
target (`fused_layers`, EAGLE-3, Li et al. 2025, arXiv 2503.01840): their
outputs, each RMS-normed, are mixed with f_t by one more linear layer into the
feature the head reads; its own outputs stand in for that mix when drafting
further. The output layer is restricted to the tokens
the target produces most often (FR-Spec, Zhao et al. 2025, arXiv 2502.14856),
counted on the training data: the head's q is its softmax over that subset
and zero elsewhere, so rejection sampling stays exact.

The head borrows the target's embedding and output rows (frozen) at load
time; `draft_seconds` and `fastest_dtype` time it on this machine. Its files
(a head directory, checked against the target's fingerprint) are in
`head_store.py`.

Shapes: features (batch, positions, hidden); tokens (batch, positions).
This module knows nothing about generation loops, drafting policy or files.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

__all__ = [
    "DraftHead",
    "HeadCache",
    "HeadConfig",
    "check_fused_layers",
    "draft_seconds",
    "fastest_dtype",
    "head_parameters",
]


@dataclass(frozen=True)
class HeadConfig:
    """The shape of a draft head (the decoder layer has the target's dimensions)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    draft_vocab: int
    layers: int = 1
    fused_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fused_layers", tuple(int(i) for i in self.fused_layers))

    @property
    def feature_width(self) -> int:
        """Width of the target features the head reads: the fused layers' and the final one."""
        return self.hidden_size * (len(self.fused_layers) + 1)

    @classmethod
    def for_target(
        cls,
        target: PreTrainedModel,
        draft_vocab: int,
        layers: int = 1,
        fused_layers: tuple[int, ...] = (),
    ) -> HeadConfig:
        config = target.config.get_text_config()
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            intermediate_size=int(getattr(config, "intermediate_size", None) or 4 * hidden),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            draft_vocab=draft_vocab,
            layers=layers,
            fused_layers=check_fused_layers(fused_layers, int(config.num_hidden_layers)),
        )


def check_fused_layers(fused_layers: tuple[int, ...], target_layers: int) -> tuple[int, ...]:
    """`fused_layers` as given, if each is a decoder layer of the target other than
    its last (whose normed output is always read), in increasing order; else ValueError."""
    layers = tuple(int(i) for i in fused_layers)
    if any(not 1 <= i < target_layers for i in layers):
        raise ValueError(
            f"fused layers {list(layers)}: each must be a decoder layer from 1 to"
            f" {target_layers - 1} (layer {target_layers}, the last, is always read)"
        )
    if list(layers) != sorted(set(layers)):
        raise ValueError(f"fused layers {list(layers)}: give each once, in increasing order")
    return layers


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Rotary:
    """Rotary position embedding (the Llama layout: halves rotated)."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.inverse = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        )

    def __call__(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and sin for `positions` (batch, n): (batch, 1, n, head_dim)."""
        angles = positions.float()[..., None] * self.inverse.to(positions.device)
        angles = torch.cat((angles, angles), dim=-1)[:, None]
        return angles.cos().to(dtype), angles.sin().to(dtype)


class HeadLayer(nn.Module):
    """One pre-norm decoder layer: grouped-query attention and a gated MLP."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        hidden, dim = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, dim
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.q_proj = nn.Linear(hidden, config.num_heads * dim, bias=False)
        self.k_proj = nn.Linear(hidden, config.num_kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(hidden, config.num_kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * dim, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps)
        self.gate_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, hidden, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (b, heads, n, d), keys and values (b, kv_heads, n, d) of x (b, n, hidden)."""
        batch, n, _ = x.shape
        normed = self.input_layernorm(x)
        q = self.q_proj(normed).view(batch, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(normed).view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(normed).view(batch, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def finish(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention of q over keys/values (mask: True = may attend), then the MLP."""
        groups = self.heads // self.kv_heads
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        batch, _, n, _ = attended.shape
        x = x + self.o_proj(attended.transpose(1, 2).reshape(batch, n, -1))
        normed = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(normed)) * self.up_proj(normed))


@dataclass
class HeadCache:
    """Keys and values of every position the head has read, per layer, for batch 1.

    `length` positions are valid; a rollback only lowers it."""

    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0

    def rollback_to(self, length: int) -> None:
        self.length = min(self.length, max(0, length))

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Store k, v (1, kv_heads, n, d) after the valid positions; return all valid ones."""
        n = k.shape[2]
        if layer == len(self.keys):
            capacity = max(256, 2 * (self.length + n))
            self.keys.append(k.new_empty(1, k.shape[1], capacity, k.shape[3]))
            self.values.append(v.new_empty(1, v.shape[1], capacity, v.shape[3]))
        end = self.length + n
        if end > self.keys[layer].shape[2]:
            capacity = max(end, 2 * self.keys[layer].shape[2])
            self.keys[layer] = _grown(self.keys[layer], self.length, capacity)
            self.values[layer] = _grown(self.values[layer], self.length, capacity)
        self.keys[layer][:, :, self.length : end] = k
        self.values[layer][:, :, self.length : end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


def _grown(buffer: torch.Tensor, valid: int, capacity: int) -> torch.Tensor:
    grown = buffer.new_empty(*buffer.shape[:2], capacity, buffer.shape[3])
    grown[:, :, :valid] = buffer[:, :, :valid]
    return grown


class DraftHead(nn.Module):
    """The trained part of a head plus the target's frozen embedding and output rows.

    `token_ids` (draft_vocab,) maps the head's outputs to vocabulary ids.
    """

    def __init__(
        self,
        config: HeadConfig,
        embedding: torch.Tensor,
        output_rows: torch.Tensor,
        token_ids: torch.Tensor,
    ) -> None:
        super().__init__()
        if token_ids.shape[0] != config.draft_vocab:
            raise ValueError(
                f"{token_ids.shape[0]} token ids for a vocabulary of {config.draft_vocab}"
            )
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        if config.fused_layers:  # EAGLE-3: earlier layers' outputs, each normed, mixed in
            count = len(config.fused_layers) + 1
            self.feature_norms = nn.ModuleList(
                RMSNorm(hidden, config.rms_norm_eps) for _ in config.fused_layers
            )
            self.fuse = nn.Linear(count * hidden, hidden, bias=False)
        self.layers = nn.ModuleList(HeadLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.register_buffer("embedding", embedding.detach(), persistent=False)
        self.register_buffer("output_rows", output_rows.detach(), persistent=False)
        self.register_buffer("token_ids", token_ids.long(), persistent=False)
        self.rotary = Rotary(config.head_dim, config.rope_theta)

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features (…, feature_width) as the one feature (…, hidden) the
        head reads: the final layer's alone, or all of them normed and mixed. The
        head's own output is read as it is (it stands for the fused feature)."""
        if not self.config.fused_layers:
            return features
        hidden = self.config.hidden_size
        parts = [
            norm(features[..., i * hidden : (i + 1) * hidden])
            for i, norm in enumerate(self.feature_norms)
        ]
        parts.append(features[..., -hidden:])
        return self.fuse(torch.cat(parts, dim=-1))

    @classmethod
    def for_target(
        cls,
        target: PreTrainedModel,
        token_ids: torch.Tensor,
        *,
        layers: int = 1,
        copy_last_layer: bool = False,
        fused_layers: tuple[int, ...] = (),
    ) -> DraftHead:
        """A new head for `target`: the linear layer starts by passing the feature
        on, the output norm is the target's; the decoder layer starts from
        PyTorch's default initialisation, or with `copy_last_layer` from the
        target's last layer (on the embedded target that learned slower: held-back
        agreement 0.37 against 0.43 after the same 3 minutes)."""
        config = HeadConfig.for_target(target, int(token_ids.shape[0]), layers, fused_layers)
        embedding = target.get_input_embeddings().weight
        output = target.get_output_embeddings().weight
        device = embedding.device
        token_ids = token_ids.to(device)
        head = cls(config, embedding.float(), output[token_ids].float(), token_ids).to(device)
        with torch.no_grad():
            nn.init.normal_(head.fc.weight, std=0.02)
            hidden = config.hidden_size
            head.fc.weight[:, hidden:] += torch.eye(
                hidden, device=device
            )  # start by passing the feature on
            if config.fused_layers:  # the mix starts as the final feature plus a little
                nn.init.normal_(head.fuse.weight, std=0.02)
                head.fuse.weight[:, -hidden:] += torch.eye(hidden, device=device)
            last = _last_decoder_layer(target) if copy_last_layer else None
            if last is not None:
                own = head.layers[0].state_dict()
                for name, value in _flat_layer_state(last).items():
                    if name in own and own[name].shape == value.shape:
                        own[name].copy_(value.float())
            final_norm = _final_norm_weight(target)
            if final_norm is not None and final_norm.shape == head.norm.weight.shape:
                head.norm.weight.copy_(final_norm.float())
        return head

    def step(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: HeadCache | None = None,
    ) -> torch.Tensor:
        """Read (feature, next token) pairs at `positions` (b, n); return h (b, n, hidden).

        With a cache (batch 1) the pairs follow the cached positions and are
        stored; without one they are a whole causal sequence."""
        x = self.fc(torch.cat((self.embedding[tokens].to(features.dtype), features), dim=-1))
        cos, sin = self.rotary(positions, x.dtype)
        n = x.shape[1]
        for index, layer in enumerate(self.layers):
            q, k, v = layer.project(x, cos, sin)
            if cache is None:
                mask = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
            else:
                past = cache.length
                k, v = cache.append(index, k, v)
                mask = None
                if n > 1:
                    mask = torch.ones(n, past + n, dtype=torch.bool, device=x.device).tril(past)
            x = layer.finish(x, q, k, v, mask)
        if cache is not None:
            cache.length += n
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (…, draft_vocab)."""
        return hidden @ self.output_rows.to(hidden.dtype).T

    def unrolled(
        self, features: torch.Tensor, tokens: torch.Tensor, depth: int
    ) -> list[torch.Tensor]:
        """Training with the head's own guesses: h for `depth` passes over whole
        sequences (b, n). Pass 1 reads the target's features. Pass j reads, at
        position t, pass j-1's guess of f_t and attends as drafting would at
        draft position j: to the target's features up to t-j+1 (pass 1) and to
        the guesses of passes 2..j at the positions between. Returns [h_1, ..., h_depth]."""
        features = self.fused(features)
        batch, n, _ = features.shape
        positions = torch.arange(n, device=features.device).expand(batch, n)
        cos, sin = self.rotary(positions, features.dtype)
        embedded = self.embedding[tokens].to(features.dtype)
        device = features.device
        index = torch.arange(n, device=device)
        outputs: list[torch.Tensor] = []
        current = features
        per_layer_keys: list[list[torch.Tensor]] = [[] for _ in self.layers]
        per_layer_values: list[list[torch.Tensor]] = [[] for _ in self.layers]
        for j in range(1, depth + 1):
            if j > 1:  # pass j-1's guess at t-1 is the feature read at t
                current = torch.cat((features[:, :1] * 0, outputs[-1][:, :-1]), dim=1)
            x = self.fc(torch.cat((embedded, current), dim=-1))
            # mask over [pass 1 keys | pass 2 keys | ... | pass j keys]
            blocks = [index[None, :] <= index[:, None] - (j - 1)]
            for i in range(2, j + 1):
                blocks.append(index[None, :] == index[:, None] - (j - i))
            mask = torch.cat(blocks, dim=1)
            for number, layer in enumerate(self.layers):
                q, k, v = layer.project(x, cos, sin)
                per_layer_keys[number].append(k)
                per_layer_values[number].append(v)
                keys = torch.cat(per_layer_keys[number], dim=2)
                values = torch.cat(per_layer_values[number], dim=2)
                x = layer.finish(x, q, keys, values, mask)
            outputs.append(self.norm(x))
        return outputs


def _last_decoder_layer(target: PreTrainedModel) -> nn.Module | None:
    layers = getattr(getattr(target, "model", None), "layers", None)
    return layers[-1] if layers is not None and len(layers) else None


def _final_norm_weight(target: PreTrainedModel) -> torch.Tensor | None:
    norm = getattr(getattr(target, "model", None), "norm", None)
    return getattr(norm, "weight", None)


def _flat_layer_state(layer: nn.Module) -> dict[str, torch.Tensor]:
    """A transformers Llama-style layer's weights under the head layer's names."""
    state = {}
    for name, value in layer.state_dict().items():
        short = name.removeprefix("self_attn.").removeprefix("mlp.")
        state[short] = value
    return state


@torch.no_grad()
def draft_seconds(head: DraftHead, steps: int = 12, context: int = 128) -> float:
    """Median seconds of one drafted token (a cached step over `context`
    positions plus the draft logits), timed on this machine."""
    device = head.token_ids.device
    dtype = head.output_rows.dtype
    hidden = head.config.hidden_size
    cache = HeadCache()
    positions = torch.arange(context, device=device)[None]
    tokens = head.token_ids[:1].expand(1, context)
    width = head.config.feature_width
    read = head.fused(torch.zeros(1, context, width, dtype=dtype, device=device))
    head.step(read, tokens, positions, cache)
    feature = torch.zeros(1, 1, hidden, dtype=dtype, device=device)
    where = torch.tensor([[context]], device=device)
    times = []
    for _ in range(steps + 2):
        cache.rollback_to(context)
        began = time.perf_counter()
        out = head.step(feature, tokens[:, :1], where, cache)
        head.logits(out[0, 0]).argmax()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times[2:])


def fastest_dtype(
    head: DraftHead, candidates: tuple[torch.dtype, ...]
) -> tuple[torch.dtype, dict[str, float]]:
    """The candidate dtype in which `head` drafts fastest here (measured on a
    copy, not assumed: bfloat16 is cheaper than float32 on some CPUs and dearer
    on others), and the seconds per drafted token of each."""
    timed = {}
    for dtype in candidates:
        timed[dtype] = draft_seconds(copy.deepcopy(head).to(dtype))
    best = min(timed, key=timed.__getitem__)
    return best, {str(dtype).removeprefix("torch."): t for dtype, t in timed.items()}


def head_parameters(head: DraftHead) -> int:
    """Trained parameters (the borrowed embedding and output rows are buffers)."""
    return sum(p.numel() for p in head.parameters())
