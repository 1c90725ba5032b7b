"""Tiny, seeded models and a word-level tokenizer built in code, for tests.

Used by the test-suite and by anyone who wants to try the engine without a
download: everything here runs in milliseconds on a CPU. Nothing in the
application imports this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from torch.overrides import TorchFunctionMode
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<unk>", "<s>", "<|im_start|>", "<|im_end|>")
ROLE_WORDS = ("system", "user", "assistant")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|> {{ message['role'] }} {{ message['content'] }} <|im_end|> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tiny_llama(
    vocab_size: int = 32,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_position_embeddings: int = 256,
    sharpness: float = 30.0,
) -> LlamaForCausalLM:
    """A random Llama whose next-token distributions are far from uniform.

    `sharpness` scales the output head so that sampling tests see peaked
    distributions: a random head gives nearly uniform ones, under which a
    sampler that draws from the wrong law is hard to tell from a right one.
    """
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=3,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    return model.eval()


def tiny_tokenizer(vocab_size: int = 32, *, word_prefix: str = "w") -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer with a ChatML-like template.

    Ids 0-3 are `<unk> <s> <|im_start|> <|im_end|>`, then the role words, then
    `w7, w8, ...` up to `vocab_size` (`word_prefix` changes those strings, to
    build an incompatible vocabulary of the same size).
    """
    words = [*SPECIAL_TOKENS, *ROLE_WORDS]
    words += [f"{word_prefix}{i}" for i in range(len(words), vocab_size)]
    if len(words) != vocab_size:
        raise ValueError(f"vocab_size must be at least {len(words)}")
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _fast(backend)


def tiny_char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with `tiny_tokenizer`'s special tokens and
    chat template: ids 0-3 the special tokens, then a space and every
    character of `tiny_tokenizer`'s words (letters and digits), one token
    each. Another tokenizer than the word-level one, for drafting across
    tokenizers: it writes the text of any of those words."""
    characters = sorted(set(" w0123456789" + "".join(ROLE_WORDS)))
    vocabulary = [*SPECIAL_TOKENS, *characters]
    backend = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(vocabulary)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return _fast(backend)


def reworded_tokenizer(
    vocab_size: int = 32, *, seed: int = 0, renamed: int = 0
) -> PreTrainedTokenizerFast:
    """`tiny_tokenizer(vocab_size)`'s vocabulary with its words under other ids
    (a seeded shuffle; the special tokens keep theirs), and its last `renamed`
    words replaced by words the target does not have: the same strings under
    other ids (`renamed` 0) or different tokenizers sharing most tokens."""
    words = [*ROLE_WORDS] + [
        f"w{i}" for i in range(len(SPECIAL_TOKENS) + len(ROLE_WORDS), vocab_size)
    ]
    for index in range(1, renamed + 1):
        words[-index] = f"v{index}"
    order = torch.randperm(len(words), generator=torch.Generator().manual_seed(seed)).tolist()
    vocabulary = [*SPECIAL_TOKENS, *(words[i] for i in order)]
    backend = Tokenizer(
        models.WordLevel({w: i for i, w in enumerate(vocabulary)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _fast(backend)


def _fast(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """`backend` with `tiny_tokenizer`'s special tokens and chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def relabelled_copy(
    model: LlamaForCausalLM, drafter_of_target: torch.Tensor, size: int
) -> LlamaForCausalLM:
    """A copy of `model` that reads and writes another vocabulary of `size`
    ids: drafter id `drafter_of_target[t]` gets the rows of the model's token
    t (embedding and output head); ids no target token maps to keep random
    rows. With a `Translation`'s map, a drafter that predicts what the target
    does, through another tokenizer."""
    config = model.config.to_dict()
    config["vocab_size"] = size
    copy = LlamaForCausalLM(type(model.config)(**config))
    state = {
        k: v
        for k, v in model.state_dict().items()
        if "embed_tokens" not in k and "lm_head" not in k
    }
    copy.load_state_dict(state, strict=False)
    rows = torch.nonzero(drafter_of_target >= 0).flatten()
    with torch.no_grad():
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            mine, theirs = copy.state_dict()[name], model.state_dict()[name]
            mine[drafter_of_target[rows]] = theirs[rows]
    return copy.eval()


def perturbed_copy(model: LlamaForCausalLM, noise: float, *, seed: int = 0) -> LlamaForCausalLM:
    """A copy of `model` with Gaussian noise added to every weight: a drafter
    that agrees with the target often but not always."""
    copy = LlamaForCausalLM(model.config)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(
                torch.randn(parameter.shape, generator=generator) * noise * parameter.std()
            )
    return copy.eval()


@contextmanager
def interrupt_on_call(model: torch.nn.Module, call: int) -> Iterator[None]:
    """Raise KeyboardInterrupt (as Ctrl-C would) in the model's `call`-th forward pass, once."""
    calls = 0

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == call:
            raise KeyboardInterrupt

    handle = model.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


HOST_READS = frozenset(
    ("item", "tolist", "__bool__", "__int__", "__index__", "__float__", "numpy", "__format__")
)
"""The tensor methods that bring a value back to the host: on a GPU each waits
for the device's queue (a synchronisation)."""


class HostReads(TorchFunctionMode):
    """Counts, while active, the reads of a tensor's values back to the host
    (`HOST_READS`) made by specrepl's own code (the line that calls them, not
    torch's or transformers' internals). On a CPU they cost nothing; each is a
    wait for the device on a GPU, so the count shows, on a CPU, how often a run
    would wait there. Each read is kept with the specrepl modules on the
    stack when it was made, innermost first (`stacks`), so that a read a
    drafter makes through a shared helper can be told from the loop's."""

    def __init__(self) -> None:
        super().__init__()
        self.stacks: list[tuple[str, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in HOST_READS:
            modules = []
            frame = sys._getframe(1)
            while frame is not None:
                path = frame.f_code.co_filename
                if PACKAGE_MARK in path and TORCH_MARK not in path:
                    modules.append(path.rsplit(PACKAGE_MARK, 1)[1].replace(os.sep, "/"))
                frame = frame.f_back
            if modules:
                self.stacks.append(tuple(modules))
        return func(*args, **(kwargs or {}))

    def made_in(self, *modules: str, outside: tuple[str, ...] = ()) -> int:
        """Reads made by a line of one of `modules` (paths under `specrepl/`, e.g.
        "engine/steps.py"), leaving out those made while a module whose path
        starts with one of `outside` (e.g. "engine/drafters/") was running."""
        return sum(
            1
            for stack in self.stacks
            if stack[0] in modules
            and not any(module.startswith(outside) for module in stack if outside)
        )

    @property
    def total(self) -> int:
        return len(self.stacks)


PACKAGE_MARK = f"{os.sep}specrepl{os.sep}"
TORCH_MARK = f"{os.sep}torch{os.sep}"


def visible_state(model: torch.nn.Module) -> dict[str, Any]:
    """What anything else running `model` can see of it: each module's class and
    the names of its attributes, by module name, and the attention its config
    names (specrepl's tuning must leave all of it as loaded outside its own
    passes)."""
    state: dict[str, Any] = {
        name: (type(module), tuple(sorted(vars(module)))) for name, module in model.named_modules()
    }
    state["<attention>"] = getattr(model.config, "_attn_implementation", None)
    return state


def tiny_head(
    target: LlamaForCausalLM,
    *,
    draft_vocab: int | None = None,
    tokens: int = 35_000,
    prompts: int = 48,
    seed: int = 0,
    end_token: int = 3,
    fused_layers: tuple[int, ...] = (),
) -> Any:
    """A draft head for a tiny target, trained over `tokens` answer tokens on the
    target's own greedy continuations of `prompts` random prompts, through the
    same data and training code as `python infer.py distill` (`fused_layers`:
    EAGLE-3's fused features). The budget is tokens, not time, so the head is the
    same on a slow machine as on a fast one."""
    import tempfile
    from pathlib import Path

    from specrepl.train.data import batched_generate, target_features
    from specrepl.train.training import TrainSettings, train_head

    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(
            4, vocab, (int(torch.randint(4, 12, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(prompts)
    ]
    generated = batched_generate(
        target, prompts, max_new_tokens=24, end_tokens=[end_token], pad_id=0, keep_features=False
    )
    features = target_features(target, generated.ids, pad_id=0, feature_layers=fused_layers)
    records = [
        {"ids": ids, "features": feats, "prompt_length": length}
        for ids, feats, length in zip(
            generated.ids, features, generated.prompt_lengths, strict=True
        )
    ]
    settings = TrainSettings(
        draft_vocab=draft_vocab or vocab,
        depth=2,
        learning_rate=3e-3,
        batch_sequences=8,
        max_minutes=60.0,  # never the limit: `tokens` is
        max_tokens=tokens,
        seed=seed,
        checkpoint_seconds=1e9,
        fused_layers=fused_layers,
    )
    with tempfile.TemporaryDirectory() as work:
        state = train_head(
            target, records, settings, Path(work), end_tokens=[end_token], vocab_size=vocab
        )
    return state.head


class CountingLlama:
    """A llama.cpp model (`llama_cpp.Llama`), counting the tokens each `eval` feeds."""

    def __init__(self, llama: Any) -> None:
        self.inner = llama
        self.fed: list[int] = []

    def eval(self, tokens: Any) -> None:
        self.fed.append(len(tokens))
        self.inner.eval(tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("inner", "fed"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)


def law_after(
    target: Any, processor: Any, ids: list[int], length: int
) -> dict[tuple[int, ...], float]:
    """The exact joint law of the `length` tokens `target` samples after `ids`
    under `processor` (every branch enumerated: keep the processor's support
    small, e.g. top-3)."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            longer = {}
            for prefix, chance in law.items():
                logits = target(input_ids=torch.tensor([[*ids, *prefix]])).logits[0, -1]
                probs = processor.probabilities(logits)
                for token in torch.nonzero(probs).flatten().tolist():
                    longer[(*prefix, token)] = chance * float(probs[token])
            law = longer
    return law


def distance_from_law(
    counts: dict[tuple[int, ...], int], law: dict[tuple[int, ...], float]
) -> tuple[float, float]:
    """(chi-square p-value, total variation) of sampled `counts` against `law`;
    outcomes expected fewer than 5 times are pooled into one bin."""
    from scipy import stats  # a test dependency only

    samples = sum(counts.values())
    total = sum(law.values())
    rare = [o for o in law if law[o] * samples / total < 5]
    bins = [[o] for o in sorted(law) if o not in rare] + ([rare] if rare else [])
    observed = [sum(counts.get(o, 0) for o in group) for group in bins]
    expected = [sum(law[o] for o in group) * samples / total for group in bins]
    total_variation = 0.5 * sum(
        abs(c - e) / samples for c, e in zip(observed, expected, strict=True)
    )
    return float(stats.chisquare(observed, expected).pvalue), total_variation


def assert_speculative_sampling_is_exact(
    target: Any,
    drafter: Any,
    ids: list[int],
    processor: Any,
    options: dict[str, Any],
    *,
    law_model: Any = None,
    gamma: int = 2,
    length: int = 3,
    samples: int = 800,
) -> None:
    """Sample the `length` tokens after `ids` `samples` times by speculative decoding
    (`gamma`, the target's prompt kept in a prompt cache, a seeded generator)
    and assert that they follow the target's exact law under `processor`
    (chi-square p > 1e-3, total variation < 0.08), having drafted often
    enough to test something (some drafts accepted, some rejected). Keep the
    outcomes few against the samples (top-3 over 3 tokens: 27 outcomes, 800
    samples; top-2 over 5 tokens: 32, 1,600). The law is enumerated
    with `law_model` (a torch model with the target's weights) where the
    target is not a torch model itself."""
    from specrepl.engine.generation import speculative_generate
    from specrepl.engine.prompt_cache import PromptCache

    law = law_after(target if law_model is None else law_model, processor, ids, length)
    kept = PromptCache()
    generator = torch.Generator().manual_seed(0)
    counts: dict[tuple[int, ...], int] = {}
    accepted = drafted = 0
    for _ in range(samples):
        result = speculative_generate(
            ids, drafter, target, logits_processor=processor, gamma=gamma, max_gen_len=length,
            generator=generator, prompt_cache=kept, **options,
        )  # fmt: skip
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
        accepted, drafted = accepted + result.accepted, drafted + result.drafted
    assert set(counts) <= set(law), "an outcome the target's law does not allow"
    assert 0.05 < accepted / drafted < 0.98, (
        f"drafts must be rejected sometimes to test much: {accepted} of {drafted} accepted"
    )
    p_value, total_variation = distance_from_law(counts, law)
    assert p_value > 1e-3 and total_variation < 0.08, (p_value, total_variation)


def _rope_permuted(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """A query or key projection's rows reordered from transformers' rotary
    layout (halves) to GGUF's llama layout (interleaved pairs)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def tiny_gguf(model: LlamaForCausalLM, path: Any) -> Any:
    """Write `model` (a `tiny_llama`) as a float32 llama GGUF file at `path`, so
    that llama.cpp runs the same weights as torch; returns the path.

    Its tokenizer is a sentencepiece-style vocabulary: ids 0-3 `tiny_tokenizer`'s
    special tokens, then the 256 byte tokens (so that llama.cpp can tokenize any
    text, as its crash trial does), then words: the model's vocabulary must
    have at least 260 ids. The tests feed it ids."""
    from gguf import GGUFWriter, TokenType  # a dependency of the models layer

    config = model.config
    vocab = config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    if vocab < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"a tiny GGUF needs a vocabulary of at least 260 ids, not {vocab}")
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    words = [*SPECIAL_TOKENS, *byte_tokens]
    words += [f"\u2581w{index}" for index in range(len(words), vocab)]
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("specrepl tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(words)
    writer.add_token_scores([0.0] * vocab)
    kinds = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    normal = [TokenType.NORMAL] * (vocab - len(kinds) - 256)
    writer.add_token_types([*kinds, *[TokenType.BYTE] * 256, *normal])
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    parts = {
        "attn_norm": "input_layernorm",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        for ours, theirs in parts.items():
            writer.add_tensor(f"blk.{layer}.{ours}.weight", state[f"{prefix}{theirs}.weight"])
        query = torch.from_numpy(state[f"{prefix}self_attn.q_proj.weight"])
        key = torch.from_numpy(state[f"{prefix}self_attn.k_proj.weight"])
        writer.add_tensor(f"blk.{layer}.attn_q.weight", _rope_permuted(query, heads).numpy())
        writer.add_tensor(f"blk.{layer}.attn_k.weight", _rope_permuted(key, kv_heads).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_no_draft_past_end(steps: list[Any], end: int, label: object = None) -> bool:
    """Assert no step (`StepEvent`s) drafted after the end token `end`; whether any drafted it."""
    drafting_it = [step.drafts for step in steps if end in step.drafts]
    assert all(d.index(end) == len(d) - 1 for d in drafting_it), (label, drafting_it)
    return bool(drafting_it)
