"""The embedded pair end to end, offline: speculative output is the target's output."""

from __future__ import annotations

import pytest

from specrepl.chat.config import load_config
from specrepl.chat.session import ChatSession
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import load_head, resolve_head, target_fingerprint
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.store.paths import default_config_path

pytestmark = pytest.mark.embedded

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the square of a number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog.",
)
NEW_TOKENS = 24


def chat_ids(pair, prompt: str) -> list[int]:
    return list(
        pair.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
        )
    )


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_the_target_on_chat_prompts(embedded_pair, prompt) -> None:
    pair = embedded_pair
    ids = chat_ids(pair, prompt)
    common = {
        "max_gen_len": NEW_TOKENS,
        "eos_tokens_id": pair.eos_token_ids,
        "vocab_size": pair.vocab_size,
        "tokenizer": pair.tokenizer,
    }
    reference = autoregressive_generate(ids, pair.target.model, **common)
    assert reference.new_tokens > 0 and reference.text
    drafters = {
        "bf16 copy, gamma 4": (ModelDrafter(pair.drafter.model), 4),
        "bf16 copy, auto": (ModelDrafter(pair.drafter.model), make_policy("auto", 6)),
        "ngram, heuristic": (NgramDrafter(3), make_policy("heuristic", 6)),
        "lookup, gamma 3": (LookupDrafter(3), 3),
        "bf16 copy on the target's keys and values, auto": (
            ModelDrafter(pair.drafter.model, copy_of_target=True, tuning=pair.drafter.tuning),
            make_policy("auto", 8),
        ),
        "hybrid, bf16 copy on the target's keys and values, gamma 6": (
            HybridDrafter(
                ModelDrafter(pair.drafter.model, copy_of_target=True, tuning=pair.drafter.tuning),
                LookupDrafter(3),
            ),
            6,
        ),
    }
    for name, (drafter, gamma) in drafters.items():
        result = speculative_generate(ids, drafter, pair.target.model, gamma=gamma, **common)
        assert result.token_ids == reference.token_ids, name
        assert result.text == reference.text, name
    uncached = speculative_generate(
        ids, pair.drafter.model, pair.target.model, gamma=4, use_cache=False, **common
    )
    assert uncached.token_ids == reference.token_ids


def test_the_bf16_copy_agrees_with_the_target_nearly_always(embedded_pair) -> None:
    pair = embedded_pair
    assert pair.drafter_is_copy  # so the default drafter takes the target's keys and values
    result = speculative_generate(
        chat_ids(pair, PROMPTS[0]),
        pair.drafter.model,
        pair.target.model,
        gamma=4,
        max_gen_len=NEW_TOKENS,
        eos_tokens_id=pair.eos_token_ids,
        vocab_size=pair.vocab_size,
    )
    assert result.acceptance_rate > 0.7


# -- the draft head shipped for the embedded target ------------------------------------

# Own prompts, used nowhere else (not in training, not in any benchmark).
HEAD_PROMPTS = (
    "Give me three tips for keeping houseplants alive.",
    "Explain what a variable is in programming, for a beginner.",
    "Write a short note thanking a neighbour for watering my garden.",
)
# docs/draft-heads.md states the shipped head's figures; this is the floor the test holds it to
# (first-draft acceptance, greedy, fixed gamma 4, 48 new tokens per prompt, pooled).
# The head of 2026-11-23 measured 0.28 here; the fused head of 2026-11-26 measures 0.554
# (41 of 74, AMD EPYC family 25 model 17) and accepts 59% of first drafts on the dev prompts.
SHIPPED_HEAD_FIRST_DRAFT_ACCEPTANCE = 0.4


@pytest.fixture(scope="module")
def shipped_head(embedded_pair):
    head, description = load_head(resolve_head("embedded"), embedded_pair.target.model)
    return head, description


def test_shipped_head_is_made_for_the_embedded_target(embedded_pair, shipped_head) -> None:
    _, description = shipped_head
    assert description["target"]["fingerprint"] == target_fingerprint(embedded_pair.target.model)
    weights = resolve_head("embedded") / "head.safetensors"
    assert weights.stat().st_size <= 16 * 2**20


def test_shipped_head_keeps_the_targets_greedy_output(embedded_pair, shipped_head) -> None:
    pair = embedded_pair
    head, _ = shipped_head
    common = {
        "max_gen_len": NEW_TOKENS,
        "eos_tokens_id": pair.eos_token_ids,
        "vocab_size": pair.vocab_size,
    }
    for prompt in PROMPTS:
        ids = chat_ids(pair, prompt)
        reference = autoregressive_generate(ids, pair.target.model, **common)
        runs = {
            "head, gamma 4": speculative_generate(
                ids, HeadDrafter(head), pair.target.model, gamma=4, **common
            ),
            "head, auto": speculative_generate(
                ids, HeadDrafter(head), pair.target.model, gamma=make_policy("auto", 8), **common
            ),
            "hybrid head, gamma 6": speculative_generate(
                ids,
                HybridDrafter(HeadDrafter(head), LookupDrafter(3)),
                pair.target.model,
                gamma=6,
                **common,
            ),
            "head, no cache": speculative_generate(
                ids, HeadDrafter(head), pair.target.model, gamma=3, use_cache=False, **common
            ),
        }
        for name, result in runs.items():
            assert result.token_ids == reference.token_ids, (prompt, name)


@pytest.mark.parametrize("runtime", ["torch", "auto"])
def test_the_default_hybrid_times_the_shipped_head_against_the_copy(
    embedded_pair, request, runtime
) -> None:
    """The default drafter (hybrid, head "auto") on the embedded pair: both the
    shipped head and the copy are timed (in llama.cpp too where it runs), the
    verdict is kept, and the answer is the target's whichever drafts. The
    target runs in torch here; over a llama.cpp target the two are timed there
    (tests/test_llamacpp_target.py)."""
    if runtime == "auto":
        request.getfixturevalue("llama")  # llama.cpp installed (required in CI)
    settings = load_config(default_config_path()).settings.updated(
        drafter_runtime=runtime, target_runtime="torch", max_new_tokens=NEW_TOKENS
    )
    assert settings.drafter_options().chooses_head
    session = ChatSession(embedded_pair, settings)
    answer = session.answer(PROMPTS[1])
    assert answer.refusal is None, answer.refusal
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids
    choice = session.drafters.choice(settings)
    assert choice.head_path == str(resolve_head("embedded"))
    assert set(choice.seconds) == {"head", "model"} and choice.tokens > 0
    drafter = session._drafter(settings)
    assert isinstance(drafter, HybridDrafter)
    assert isinstance(drafter.model, HeadDrafter) == choice.head


def test_shipped_head_reaches_its_stated_acceptance(embedded_pair, shipped_head) -> None:
    pair = embedded_pair
    head, _ = shipped_head
    first_tried = first_taken = 0
    for prompt in HEAD_PROMPTS:
        result = speculative_generate(
            chat_ids(pair, prompt),
            HeadDrafter(head),
            pair.target.model,
            gamma=4,
            max_gen_len=48,
            eos_tokens_id=pair.eos_token_ids,
            vocab_size=pair.vocab_size,
        )
        first_tried += result.drafted_per_position[0]
        first_taken += result.accepted_per_position[0]
    assert first_taken / first_tried >= SHIPPED_HEAD_FIRST_DRAFT_ACCEPTANCE


def test_sampling_with_the_shipped_head_follows_the_targets_exact_law(
    embedded_pair, shipped_head
) -> None:
    """Three sampled tokens under top-3 at temperature 2 (27 outcomes; the last
    two from a step the head drafted for): the speculative samples against the
    law enumerated from the target."""
    from specrepl.engine.processors import TopKProcessor
    from specrepl.testing import assert_speculative_sampling_is_exact

    pair = embedded_pair
    head, _ = shipped_head
    processor = TopKProcessor(temperature=2.0, top_k=3)
    ids = chat_ids(pair, "Pick a random word.")
    drafter = HeadDrafter(head, keep_between_prompts=True)  # keeps what it read of the prompt
    options = pair.generation_options(use_cache=True)
    assert_speculative_sampling_is_exact(pair.target.model, drafter, ids, processor, options)


# -- a chat that keeps its caches (the embedded pair) ----------------------------------

CHAT_TURNS = (
    "My name is Ada and I keep bees.",
    "What do bees need in winter?",
    "How many hives should a beginner start with?",
    "What is my name?",
    "Name two flowers bees like.",
    "Why is honey sweet?",
    "Write one sentence about bees.",
    "How long do worker bees live?",
    "What do I keep?",
    "Thank you, goodbye.",
)


@pytest.mark.parametrize("kind", ["hybrid", "head"])
def test_ten_chat_turns_with_kept_caches_equal_a_recomputed_chat(
    embedded_pair, kind, monkeypatch
) -> None:
    """Token for token, with every prompt read the plain way: a llama.cpp target
    that reads a long prompt with flash attention (`llamacpp_reading`) rounds
    it otherwise than the steps a kept cache read it in, which may turn a near
    tie (both runs of one chat read alike: `test_llamacpp_reading`)."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings
    from specrepl.engine.llamacpp_runtime import LlamaCppModel

    monkeypatch.setattr(LlamaCppModel, "reads_wide", lambda self, count: False)

    settings = Settings(max_new_tokens=16, drafter_kind=kind, drafter_head="embedded")
    if kind == "hybrid":
        settings = settings.updated(drafter_head=None)
    kept = ChatSession(embedded_pair, settings)
    for turn, prompt in enumerate(CHAT_TURNS):
        fresh = ChatSession(embedded_pair, settings)
        fresh.history = [dict(message) for message in kept.history]
        expected = fresh.answer(prompt)
        answer = kept.answer(prompt)
        for name, run in answer.runs.items():
            assert run.result.token_ids == expected.runs[name].result.token_ids, (turn, name)
            if turn:
                assert run.result.reused_prompt_tokens > run.result.prompt_tokens // 2
