"""The static-cache runtime (`engine/static_runtime.py`): its passes, padded to
their width bucket, give the eager runtime's logits; greedy speculative output
equals the target alone for every drafter kind, gamma, prompt longer than the
widest bucket, a context that runs to the cache's end, and across a chat;
sampling follows the target's exact law (chi-square, with a negative control);
a newer runtime ends the older; models it cannot run are refused with the
reason; compiled (on the CPU here; a GPU in tests/test_cuda.py) it gives the
same text.

Tiny seeded models built in code, uncompiled unless a test says."""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from specrepl.engine import target_choice
from specrepl.engine.drafters import runtime as drafter_runtimes
from specrepl.engine.drafters.draft_runtime import TorchDraftRuntime
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.drafters.runtime import choose_runtime
from specrepl.engine.drafters.runtime import static_or_eager as drafter_static_or_eager
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.processors import TopKProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.runtime import TorchModel
from specrepl.engine.static_runtime import StaticRuntimeRefused, StaticTorchModel
from specrepl.engine.target_choice import static_or_eager as target_static_or_eager
from specrepl.testing import (
    assert_speculative_sampling_is_exact,
    perturbed_copy,
    tiny_head,
    tiny_llama,
)

VOCAB = 32
PROMPTS = (
    [1, 17, 4, 30, 8, 8, 2, 11, 17, 4, 30],
    [1, 5, 9, 12],
    [6, 7, 6, 7, 6, 7] * 5,  # longer than the widest bucket: fed uncompiled
)


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(VOCAB, seed=0, max_position_embeddings=256)


@pytest.fixture(scope="module")
def static(target) -> StaticTorchModel:
    return StaticTorchModel(target, compile=False)


@pytest.fixture(scope="module")
def head(target):
    return tiny_head(target, draft_vocab=24)


def drafter(kind: str, target, head):
    copy = perturbed_copy(target, 0.1, seed=1)
    return {
        "model": lambda: ModelDrafter(copy),
        "model-copy": lambda: ModelDrafter(copy, copy_of_target=True),
        "lookup": lambda: LookupDrafter(3),
        "ngram": lambda: NgramDrafter(),
        "head": lambda: HeadDrafter(head),
        "hybrid-head": lambda: HybridDrafter(HeadDrafter(head), LookupDrafter(3), min_match=1),
    }[kind]()


def test_a_padded_pass_gives_the_eager_logits(target, static) -> None:
    sequence = torch.tensor(PROMPTS[0] * 3)
    eager = TorchModel(target).open()
    runtime = static.open()
    eager.score(sequence[:10], 1, VOCAB)
    runtime.score(sequence[:10], 1, VOCAB)
    for width in range(1, 18):
        ours, _ = runtime.score(sequence[: 10 + width], width, VOCAB)
        theirs, _ = eager.score(sequence[: 10 + width], width, VOCAB)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        assert runtime.length == 10 + width
        runtime.rollback_to(10)
        eager.rollback_to(10)
    features, hidden = runtime.score(sequence[:14], 4, VOCAB, features=True, feature_layers=(1,))
    _, eager_hidden = eager.score(sequence[:14], 4, VOCAB, features=True, feature_layers=(1,))
    torch.testing.assert_close(hidden, eager_hidden, atol=1e-5, rtol=1e-5)
    assert features.shape == (4, VOCAB)


@pytest.mark.parametrize("kind", ["model", "model-copy", "lookup", "ngram", "head", "hybrid-head"])
@pytest.mark.parametrize("gamma", [1, 3, 8, 16, "auto:8"])
def test_greedy_speculative_equals_the_static_target(target, static, head, kind, gamma) -> None:
    policy = make_policy("auto", 8) if gamma == "auto:8" else gamma
    for prompt in PROMPTS:
        reference = autoregressive_generate(prompt, target, max_gen_len=40)
        alone = autoregressive_generate(prompt, static, max_gen_len=40)
        assert alone.token_ids == reference.token_ids
        result = speculative_generate(
            prompt, drafter(kind, target, head), static, gamma=policy, max_gen_len=40
        )
        assert result.token_ids == reference.token_ids, (kind, gamma, prompt)


def test_greedy_holds_up_to_the_end_of_the_cache(target) -> None:
    """Near the end, a pass whose padding would run past the cache is fed as it is."""
    short = StaticTorchModel(target, compile=False, max_length=48)
    assert short.context == 48
    prompt = PROMPTS[0]
    reference = autoregressive_generate(prompt, target, max_gen_len=48 - len(prompt))
    for gamma in (3, 8, 16):
        result = speculative_generate(
            prompt, LookupDrafter(3), short, gamma=gamma, max_gen_len=48 - len(prompt)
        )
        assert result.token_ids == reference.token_ids, gamma
    with pytest.raises(ValueError, match="context"):
        autoregressive_generate(list(range(1, 31)) * 2, short, max_gen_len=4)


def test_a_chat_keeps_the_static_cache_and_stays_exact(target, static) -> None:
    kept, history = PromptCache(), list(PROMPTS[0])
    model_drafter = ModelDrafter(perturbed_copy(target, 0.1, seed=1), keep_between_prompts=True)
    for turn in range(3):
        ids = [*history, 2, 25, 20 + turn, 21]
        reference = autoregressive_generate(ids, target, max_gen_len=16)
        result = speculative_generate(
            ids, model_drafter, static, gamma=4, max_gen_len=16, prompt_cache=kept
        )
        assert result.token_ids == reference.token_ids, turn
        if turn:
            assert result.reused_prompt_tokens >= len(history) - 1
        history = [*ids, *result.token_ids]


def test_sampling_follows_the_static_targets_law(target, static) -> None:
    drafter = ModelDrafter(perturbed_copy(target, 0.5, seed=1))
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    assert_speculative_sampling_is_exact(
        static, drafter, PROMPTS[0], TopKProcessor(top_k=3), options, law_model=target
    )


def test_the_law_test_sees_a_static_target_with_other_weights(target) -> None:
    """Negative control: the law enumerated from other weights fails the test."""
    other = StaticTorchModel(perturbed_copy(target, 0.3, seed=2), compile=False)
    drafter = ModelDrafter(perturbed_copy(target, 0.5, seed=1))
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    with pytest.raises(AssertionError, match=r"^\(|allow"):
        assert_speculative_sampling_is_exact(
            other, drafter, PROMPTS[0], TopKProcessor(top_k=3), options, law_model=target
        )


def test_runtimes_take_turns_over_the_one_cache(target, static) -> None:
    """Two runtimes over the same static cache, passing in turn (a chat's
    speculative run and target alone), each keep their own prefix."""
    sequences = [torch.tensor(PROMPTS[0] * 2), torch.tensor(PROMPTS[2])]
    ours = [static.open(), static.open()]
    eager = [TorchModel(target).open(), TorchModel(target).open()]
    ends = [4, 4]
    for turn, index in enumerate((0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0)):
        if turn % 5 == 4:  # a rejected draft: both drop the last positions
            ends[index] -= 3
            ours[index].rollback_to(ends[index])
            eager[index].rollback_to(ends[index])
        fed = 1 + turn % 3
        ends[index] += fed
        mine, _ = ours[index].score(sequences[index][: ends[index]], fed, VOCAB)
        theirs, _ = eager[index].score(sequences[index][: ends[index]], fed, VOCAB)
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    uncached = static.open(use_cache=False)
    logits, _ = uncached.score(torch.tensor(PROMPTS[1]), 1, VOCAB)
    assert logits.shape == (1, VOCAB)


def test_the_warm_up_times_every_bucket_for_the_gamma_policy(target) -> None:
    model = StaticTorchModel(target, compile=False, buckets=(1, 5, 9))
    assert model.step_seconds() is None and model.one_token_seconds() is None
    timed = model.warm_up(repeats=1)
    assert set(timed) == {1, 5, 9} and all(seconds > 0 for seconds in timed.values())
    steps = model.step_seconds()
    assert sorted(steps) == list(range(9))
    assert steps[0] == timed[1] and steps[4] == timed[5] and steps[5] == timed[9]
    assert model.one_token_seconds() == timed[1]
    assert model.open().length == 0


def test_models_it_cannot_run_are_refused_with_the_reason(target) -> None:
    config = MistralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        max_position_embeddings=64,
    )
    with pytest.raises(StaticRuntimeRefused, match="sliding-window"):
        StaticTorchModel(MistralForCausalLM(config), compile=False)
    with pytest.raises(StaticRuntimeRefused, match="buckets"):
        StaticTorchModel(target, compile=False, buckets=(0, 4))


def test_compiled_on_the_cpu_it_gives_the_same_text(target) -> None:
    compiled = StaticTorchModel(target, compile=True, buckets=(1, 5))
    compiled.warm_up(repeats=1)
    for prompt in PROMPTS[:2]:
        reference = autoregressive_generate(prompt, target, max_gen_len=30)
        result = speculative_generate(prompt, LookupDrafter(3), compiled, gamma=4, max_gen_len=30)
        assert result.token_ids == reference.token_ids


def test_a_chat_session_runs_both_generators_on_the_static_target(pair) -> None:
    """The REPL's session with `target_runtime static`: the speculative run and
    the target alone both run over the static cache, their tokens agree turn
    after turn with the caches kept, and the summary names the runtime."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings

    for kind in ("model", "lookup"):
        settings = Settings(max_new_tokens=12, drafter_kind=kind, target_runtime="static")
        session = ChatSession(pair, settings)
        choice = session.target.choice(session.settings)
        assert choice.runtime == "static"
        assert isinstance(choice.runnable, StaticTorchModel)
        assert choice.runnable.context == pair.context_length
        assert "static cache" in (session.target.summary(session.settings) or "")
        for prompt in ("w1 w2 w3", "w4 w5"):
            answer = session.answer(prompt)
            assert answer.refusal is None
            speculative, alone = answer.runs["speculative"], answer.runs["target"]
            assert speculative.result.token_ids == alone.result.token_ids
            assert speculative.result.token_ids


def static_drafter(target, **options) -> ModelDrafter:
    """A model drafter whose model runs over a static cache of its own."""
    copy = StaticTorchModel(perturbed_copy(target, 0.1, seed=1), compile=False)
    return ModelDrafter(TorchDraftRuntime(copy), **options)


@pytest.mark.parametrize("gamma", [1, 4, 8, 16])
@pytest.mark.parametrize("on_static", [False, True], ids=["eager-target", "static-target"])
def test_a_model_drafter_over_the_static_runtime_keeps_the_targets_text(
    target, static, gamma, on_static
) -> None:
    verifier = static if on_static else target
    model_drafter = static_drafter(target)
    assert model_drafter.runtime.name == "static"
    for prompt in PROMPTS:
        reference = autoregressive_generate(prompt, target, max_gen_len=40)
        result = speculative_generate(prompt, model_drafter, verifier, gamma=gamma, max_gen_len=40)
        assert result.token_ids == reference.token_ids, (gamma, prompt)
        assert result.accepted > 0


def test_a_static_drafter_keeps_its_cache_through_a_chat(target) -> None:
    kept, history = PromptCache(), list(PROMPTS[0])
    model_drafter = static_drafter(target, keep_between_prompts=True)
    for turn in range(3):
        ids = [*history, 2, 25, 20 + turn, 21]
        reference = autoregressive_generate(ids, target, max_gen_len=16)
        result = speculative_generate(
            ids, model_drafter, target, gamma=4, max_gen_len=16, prompt_cache=kept
        )
        assert result.token_ids == reference.token_ids, turn
        if turn:  # it read only what it had not seen
            assert result.read_tokens < len(ids) // 2
        history = [*ids, *result.token_ids]


def test_sampling_with_a_static_drafter_follows_the_targets_law(target) -> None:
    copy = StaticTorchModel(perturbed_copy(target, 0.5, seed=1), compile=False)
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    assert_speculative_sampling_is_exact(
        target, ModelDrafter(TorchDraftRuntime(copy)), PROMPTS[0], TopKProcessor(top_k=3), options
    )


def test_the_drafter_runtime_static_is_built_and_drafts(target) -> None:
    copy = perturbed_copy(target, 0.1, seed=1)
    choice = choose_runtime("static", copy, None, context_length=128)
    assert choice.runtime == "static" and "warmed up" in choice.reason
    assert choice.static is not None and choice.static.context == 128
    assert sorted(choice.seconds) == ["static"]
    built = choice.model_drafter(DrafterOptions(kind="model", runtime="static"), target)
    assert built is not None and built.runtime.name == "static"
    reference = autoregressive_generate(PROMPTS[0], target, max_gen_len=24)
    assert speculative_generate(PROMPTS[0], built, target, gamma=4, max_gen_len=24).token_ids == (
        reference.token_ids
    )
    assert "static cache" in choice.describe()


def test_a_drafter_the_static_runtime_cannot_run_is_refused(target) -> None:
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
        max_position_embeddings=64,
    )  # fmt: skip
    with pytest.raises(StaticRuntimeRefused, match="sliding-window"):
        choose_runtime("static", MistralForCausalLM(config), None)
    chosen = drafter_static_or_eager(MistralForCausalLM(config), 64, compile=False)
    assert chosen.runtime == "torch" and "sliding-window" in chosen.reason


def test_auto_takes_the_static_drafter_only_where_it_measured_cheaper(target, monkeypatch) -> None:
    copy = perturbed_copy(target, 0.1, seed=1)
    chosen = drafter_static_or_eager(copy, 128, compile=False)
    assert sorted(chosen.seconds) == ["static", "torch"]
    cheaper = chosen.seconds["static"] < chosen.seconds["torch"]
    assert chosen.runtime == ("static" if cheaper else "torch")
    monkeypatch.setattr(drafter_runtimes, "measure_widths", lambda model, width: {1: 1e3})
    assert drafter_static_or_eager(copy, 128, compile=False).runtime == "static"
    monkeypatch.setattr(drafter_runtimes, "measure_widths", lambda model, width: {1: 1e-9})
    assert drafter_static_or_eager(copy, 128, compile=False).runtime == "torch"


def test_auto_takes_a_static_target_only_if_cheaper_and_its_text_is_eagers(
    target, monkeypatch
) -> None:
    eager = TorchModel(target)
    prompts = [list(PROMPTS[0]), list(PROMPTS[1])]
    chosen = target_static_or_eager(eager, 128, prompts, compile=False)
    assert sorted(chosen.seconds) == ["static", "torch"] and chosen.measured
    if chosen.seconds["static"] >= chosen.seconds["torch"]:
        assert chosen.runtime == "torch" and "measured" in chosen.reason
    else:
        assert chosen.runtime == "static"
    monkeypatch.setattr(target_choice, "torch_step_seconds", lambda model, tuning: 1e3)
    chosen = target_static_or_eager(eager, 128, prompts, compile=False)
    assert chosen.runtime == "static" and "the same text on 2 prompts" in chosen.reason
    again = target_static_or_eager(eager, 128, prompts, earlier=chosen.verdict(), compile=False)
    assert again.runtime == "static" and again.earlier and not again.measured
    feed = StaticTorchModel.feed

    def off_by_a_little(self, ids, start, keep, *, features):  # another model's text
        logits, hidden = feed(self, ids, start, keep, features=features)
        return logits + 3.0 * torch.nn.functional.one_hot(ids[-keep:] % VOCAB, VOCAB), hidden

    monkeypatch.setattr(StaticTorchModel, "feed", off_by_a_little)
    refused = target_static_or_eager(eager, 128, prompts, compile=False)
    assert refused.runtime == "torch" and "differs from eager's on calibration prompt" in (
        refused.reason
    )
