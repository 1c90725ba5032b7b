"""The target in llama.cpp (`engine/llamacpp_runtime.py`): the same weights give
the same logits as torch; greedy speculative output equals the llama.cpp
target alone for every drafter kind, gamma, cache setting and across a chat;
sampling follows the target's exact law (chi-square, with a negative
control); a drafter that reads features is refused; the embedded model's
float32 GGUF runs the target's exact weights.

Tiny GGUF files are written here from tiny torch models (`testing.tiny_gguf`).
The tests need llama-cpp-python (`bash scripts/setup.sh` builds it); they are
skipped without it, unless SPECREPL_REQUIRE_LLAMACPP=1 (as in CI).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specrepl.engine.drafters.base import Drafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.llamacpp_runtime import LlamaCppModel, LlamaCppRuntime
from specrepl.engine.processors import GreedyProcessor, TopKProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.engine.runtime import FeaturesUnavailable, TorchModel
from specrepl.testing import (
    assert_speculative_sampling_is_exact,
    perturbed_copy,
    tiny_gguf,
    tiny_llama,
)

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
REQUIRED = os.environ.get("SPECREPL_REQUIRE_LLAMACPP") == "1"
pytestmark = pytest.mark.skipif(
    not HAS_LLAMA_CPP and not REQUIRED, reason="llama-cpp-python is not installed"
)

VOCAB = 300
PROMPT = [1, 2, 264, 290, 271, 280, 290, 271, 3, 2, 266]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, LlamaCppModel]:
    model = tiny_llama(VOCAB, hidden_size=64, num_layers=2, sharpness=6.0)
    path = tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, LlamaCppModel(path, context_length=256, threads=1)


def test_the_same_weights_give_the_same_logits_in_both_runtimes(tiny) -> None:
    model, llama = tiny
    sequence = torch.tensor(PROMPT)
    expected, _ = TorchModel(model).open().score(sequence, len(PROMPT), VOCAB)
    logits, features = llama.open().score(sequence, len(PROMPT), VOCAB)
    assert features is None
    assert logits.shape == (len(PROMPT), VOCAB)
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=1e-3)


def test_a_pass_reads_only_what_the_runtime_does_not_hold_and_rolls_back(tiny) -> None:
    _, llama = tiny
    whole = llama.open()
    expected, _ = whole.score(torch.tensor(PROMPT), 3, VOCAB)
    runtime = llama.open()
    runtime.score(torch.tensor(PROMPT[:5]), 1, VOCAB)
    assert runtime.length == 5
    runtime.score(torch.tensor([*PROMPT[:5], 30, 31]), 2, VOCAB)  # drafts, then rejected
    runtime.rollback_to(5)
    assert runtime.held() == PROMPT[:5]
    logits, _ = runtime.score(torch.tensor(PROMPT), 3, VOCAB)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(RuntimeError, match=r"nothing to feed"):
        runtime.score(torch.tensor(PROMPT), 1, VOCAB)


def test_a_context_reused_after_a_longer_sequence_scores_as_a_fresh_one(tiny) -> None:
    """A context goes back to the pool, and is cleared for its next runtime,
    without its buffers being zeroed: the cells a longer sequence left are
    masked out, so the next sequence's logits are a fresh context's, bit for
    bit, for a runtime that keeps its cache and one that clears before every
    pass."""
    _, llama = tiny
    fresh_model = LlamaCppModel(llama.path, context_length=256, threads=1)

    def left_by_a_longer_sequence(*, use_cache: bool) -> LlamaCppRuntime:
        longer = llama.open()
        longer.score(torch.tensor([(7 * i) % VOCAB for i in range(60)]), 1, VOCAB)
        del longer  # its context, holding 60 positions, goes back to the pool
        return llama.open(use_cache=use_cache)

    for use_cache in (True, False):
        reused = left_by_a_longer_sequence(use_cache=use_cache)
        fresh = fresh_model.open(use_cache=use_cache)
        sequence, keep = torch.tensor(PROMPT), 3
        for token in (266, 271, 290):
            got, expected = (run.score(sequence, keep, VOCAB)[0] for run in (reused, fresh))
            assert torch.equal(got, expected)
            sequence = torch.cat((sequence, torch.tensor([token])))
            keep = 1 if use_cache else 3


def test_greedy_text_is_the_same_in_torch_and_llamacpp(tiny) -> None:
    model, llama = tiny
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    in_torch = autoregressive_generate(PROMPT, model, max_gen_len=40, **options)
    in_llamacpp = autoregressive_generate(PROMPT, llama, max_gen_len=40, **options)
    assert in_llamacpp.token_ids == in_torch.token_ids


def drafters(model: torch.nn.Module) -> dict[str, Drafter]:
    return {
        "model": ModelDrafter(perturbed_copy(model, 0.3)),
        "lookup": LookupDrafter(),
        "ngram": NgramDrafter(),
    }


@pytest.mark.parametrize("kind", ["model", "lookup", "ngram"])
@pytest.mark.parametrize("gamma", [1, 4, 16, "auto:8"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_equals_the_llamacpp_target(tiny, kind, gamma, use_cache) -> None:
    model, llama = tiny
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB, "use_cache": use_cache}
    reference = autoregressive_generate(PROMPT, llama, max_gen_len=40, **options)
    policy = make_policy("auto", 8) if gamma == "auto:8" else gamma
    drafter = drafters(model)[kind]
    result = speculative_generate(PROMPT, drafter, llama, gamma=policy, max_gen_len=40, **options)
    assert result.token_ids == reference.token_ids
    assert result.steps < len(result.token_ids) or kind != "model"


def chat_turns(llama: LlamaCppModel, drafter: Drafter) -> list:
    """Three turns of one chat over `llama` with its context kept: each
    speculative result, asserted equal to the llama.cpp target alone."""
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    kept, history, results = PromptCache(), list(PROMPT), []
    for turn in range(3):
        ids = [*history, 2, 265, 270 + turn, 281]
        reference = autoregressive_generate(ids, llama, max_gen_len=16, **options)
        result = speculative_generate(
            ids, drafter, llama, gamma=4, max_gen_len=16, prompt_cache=kept, **options
        )
        assert result.token_ids == reference.token_ids, turn
        results.append((len(history), result))
        history = [*ids, *result.token_ids]
    return results


@pytest.mark.parametrize("kind", ["model", "lookup", "ngram"])
def test_a_chat_keeps_the_llamacpp_context_and_stays_exact(tiny, kind) -> None:
    model, llama = tiny
    for turn, (history, result) in enumerate(chat_turns(llama, drafters(model)[kind])):
        if turn:
            assert result.reused_prompt_tokens >= history - 1


def test_sampling_follows_the_llamacpp_targets_law(tiny) -> None:
    model, llama = tiny
    drafter = ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    # the law is computed by torch on the same weights (logits equal within 1e-3)
    assert_speculative_sampling_is_exact(
        llama, drafter, PROMPT, TopKProcessor(top_k=3), options, law_model=model
    )


def test_the_law_test_sees_a_target_whose_law_is_not_the_one_enumerated(
    tiny, tmp_path: Path
) -> None:
    """Negative control: the same test, run against a llama.cpp target whose
    weights differ from those the law is enumerated with, fails."""
    model, _ = tiny
    other = LlamaCppModel(
        tiny_gguf(perturbed_copy(model, 0.3, seed=2), tmp_path / "other.gguf"), context_length=256
    )
    drafter = ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    with pytest.raises(AssertionError, match=r"^\(|allow"):  # the law's test, not a count's
        assert_speculative_sampling_is_exact(
            other, drafter, PROMPT, TopKProcessor(top_k=3), options, law_model=model
        )


def test_a_drafter_that_reads_features_is_refused_where_llamacpp_cannot_give_them(
    tiny, tmp_path: Path
) -> None:
    """A llama-cpp-python without the evaluation callback gives no features: a
    drafter that reads them is refused, saying why, before anything runs."""
    from specrepl.engine.llamacpp_features import tap_problem

    class NoCallback:  # a binding as old ones are: no `ggml_backend_sched_eval_callback`
        llama_cpp = None

    assert "no evaluation callback" in (tap_problem(NoCallback()) or "")
    model, _ = tiny
    llama = LlamaCppModel(tiny_gguf(model, tmp_path / "same.gguf"), context_length=64)
    assert llama.gives_features
    llama.features_problem, llama.gives_features = tap_problem(NoCallback()), False
    drafter = LookupDrafter()
    drafter.uses_target_features = True  # as a draft head declares
    with pytest.raises(FeaturesUnavailable, match=r"llama\.cpp"):
        speculative_generate(PROMPT, drafter, llama, gamma=2, max_gen_len=4)
    with pytest.raises(FeaturesUnavailable, match=r"evaluation callback"):
        llama.open().score(torch.tensor(PROMPT), 1, VOCAB, features=True)


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory: pytest.TempPathFactory):
    """A tiny target of three layers in both runtimes, and a head trained for it
    that fuses its first two layers' outputs (EAGLE-3) with the final state."""
    from specrepl.testing import tiny_head

    model = tiny_llama(VOCAB, hidden_size=64, num_layers=3, sharpness=6.0, seed=5)
    path = tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "three.gguf")
    head = tiny_head(model, draft_vocab=200, tokens=50_000, prompts=256, fused_layers=(1, 2))
    return model, LlamaCppModel(path, context_length=256, threads=1), head


def test_hidden_state_indices_map_to_llamacpps_tensor_names() -> None:
    from specrepl.engine.llamacpp_features import feature_names

    assert feature_names((2, 15), 30) == (b"l_out-1", b"l_out-14", b"result_norm")
    assert feature_names((), 30) == (b"result_norm",)
    for outside in (0, 30):
        with pytest.raises(ValueError, match=rf"hidden state {outside}: .* 1 to 29"):
            feature_names((outside,), 30)


@pytest.mark.parametrize("layers", [(), (2,), (1, 2)])
def test_llamacpp_gives_the_features_torch_gives(three_layers, layers) -> None:
    """The hidden states a draft head reads (the final one, and earlier layers'
    outputs before it), from a prompt pass and from a pass over drafts after it:
    llama.cpp's equal torch's within float32 rounding, in the same layout."""
    model, llama, _ = three_layers
    sequence = torch.tensor([*PROMPT, 40, 41, 42])
    in_torch, in_llamacpp = TorchModel(model).open(), llama.open()
    for end in (len(PROMPT), len(sequence)):
        expected = in_torch.score(sequence[:end], 2, VOCAB, features=True, feature_layers=layers)
        got = in_llamacpp.score(sequence[:end], 2, VOCAB, features=True, feature_layers=layers)
        torch.testing.assert_close(got[0], expected[0], atol=1e-3, rtol=1e-3)
        fed = end if end == len(PROMPT) else end - len(PROMPT)
        assert got[1].shape == expected[1].shape == (fed, 64 * (len(layers) + 1))
        torch.testing.assert_close(got[1], expected[1], atol=1e-4, rtol=1e-4)


def test_a_runtime_asked_for_features_keeps_what_it_held(three_layers) -> None:
    """A plain runtime asked for features the first time moves to a context with
    a tap, reading what it held again: it still holds it, and the features of
    the positions fed are those of a runtime that read everything with the tap."""
    _, llama, _ = three_layers
    plain = llama.open()
    plain.score(torch.tensor(PROMPT[:6]), 1, VOCAB)
    assert plain._context.tap is None
    _, features = plain.score(torch.tensor(PROMPT), 2, VOCAB, features=True)
    assert plain._context.tap is not None and plain.held() == PROMPT
    whole = llama.open()
    _, every = whole.score(torch.tensor(PROMPT), 2, VOCAB, features=True)
    torch.testing.assert_close(features, every[6:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"hidden state 3"):
        whole.score(torch.tensor([*PROMPT, 5]), 1, VOCAB, features=True, feature_layers=(3,))


@pytest.mark.parametrize("gamma", [1, 4, "auto:8"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_speculative_with_a_head_equals_the_llamacpp_target(
    three_layers, gamma, use_cache
) -> None:
    from specrepl.engine.drafters.head import HeadDrafter

    _, llama, head = three_layers
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB, "use_cache": use_cache}
    reference = autoregressive_generate(PROMPT, llama, max_gen_len=40, **options)
    policy = make_policy("auto", 8) if gamma == "auto:8" else gamma
    result = speculative_generate(
        PROMPT, HeadDrafter(head), llama, gamma=policy, max_gen_len=40, **options
    )
    assert result.token_ids == reference.token_ids
    # (auto may stop drafting: a tiny target's pass costs less than the head's draft)
    assert result.accepted > 0 or gamma == "auto:8", "a trained head gets drafts accepted"


def test_a_head_chat_keeps_the_llamacpp_context_and_stays_exact(three_layers) -> None:
    from specrepl.engine.drafters.head import HeadDrafter

    _, llama, head = three_layers
    chat_turns(llama, HeadDrafter(head, keep_between_prompts=True))


def test_a_head_keeps_the_target_in_torch_where_llamacpp_gives_no_features(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a llama-cpp-python that cannot give features, "auto" keeps a head's
    target in torch saying why, and a forced llama.cpp is refused with it."""
    import specrepl.engine.llamacpp_runtime as llamacpp_runtime
    from specrepl.engine.llamacpp import LlamaCppUnavailable
    from specrepl.engine.target_choice import choose_target_runtime
    from specrepl.engine.tuning import Tuning

    model, _ = tiny
    path = tiny_gguf(model, tmp_path / "no-tap.gguf")
    monkeypatch.setattr(llamacpp_runtime, "tap_problem", lambda _: "no evaluation callback")
    auto = choose_target_runtime("auto", model, Tuning(), path, context_length=96, features=True)
    assert auto.runtime == "torch"
    assert "features: no evaluation callback" in auto.describe()
    with pytest.raises(LlamaCppUnavailable, match=r"no evaluation callback"):
        choose_target_runtime("llamacpp", model, Tuning(), path, context_length=96, features=True)


def test_widths_are_timed_for_the_gamma_policy(tiny) -> None:
    _, llama = tiny
    seconds = llama.time_widths(5, context=16, repeats=1)
    assert sorted(seconds) == [0, 1, 2, 3, 4]
    assert all(value > 0 for value in seconds.values())
    assert llama.open().step_seconds() == seconds


def test_widths_are_timed_in_rounds(tiny, monkeypatch) -> None:
    """Each round times every width once, so a slow moment of the machine
    falls on all widths alike instead of on the few being timed then."""
    _, llama = tiny
    widths: list[int] = []
    score = LlamaCppRuntime.score

    def recorded(self, sequence, keep, vocab_size, **options):
        widths.append(keep)
        return score(self, sequence, keep, vocab_size, **options)

    monkeypatch.setattr(LlamaCppRuntime, "score", recorded)
    llama.time_widths(3, context=16, repeats=2)
    assert widths == [1, 1, 2, 3, 1, 2, 3]  # the context's pass, then two rounds


def test_greedy_is_unchanged_by_the_processor_object(tiny) -> None:
    _, llama = tiny
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    plain = autoregressive_generate(PROMPT, llama, max_gen_len=12, **options)
    explicit = autoregressive_generate(
        PROMPT, llama, max_gen_len=12, logits_processor=GreedyProcessor(), **options
    )
    assert plain.token_ids == explicit.token_ids


def test_a_float_file_is_its_own_float32_copy(tiny, tmp_path: Path) -> None:
    from specrepl.models.gguf_f32 import float32_gguf

    _, llama = tiny
    assert float32_gguf(llama.path, cache_dir=tmp_path) == llama.path


@pytest.fixture(scope="module")
def embedded_f32(embedded_pair) -> LlamaCppModel:
    """The embedded model's float32 GGUF (written once from its 4-bit file) in llama.cpp."""
    from specrepl.models.gguf_f32 import float32_gguf

    path = float32_gguf(embedded_pair.target.gguf)
    return LlamaCppModel(path, context_length=2048)


def test_the_embedded_float32_file_gives_the_torch_targets_text(embedded_pair, embedded_f32):
    """The float32 copy holds exactly the weights torch de-quantized: the same greedy
    tokens as the torch target, and the copy in llama.cpp drafting against it
    gives them too."""
    from specrepl.engine.drafters.llamacpp import llamacpp_drafter
    from specrepl.engine.llamacpp import open_gguf
    from specrepl.models.prompting import prompt_ids

    target = embedded_pair.target
    options = embedded_pair.generation_options(use_cache=True)
    copy = llamacpp_drafter(open_gguf(target.gguf, context_length=2048))
    kept = PromptCache()
    for text in ("Name three colours of the rainbow.", "Write one sentence about the sea."):
        ids = prompt_ids(embedded_pair.tokenizer, text, chat=True, system_prompt=None)
        in_torch = autoregressive_generate(ids, target.model, max_gen_len=32, **options)
        alone = autoregressive_generate(ids, embedded_f32, max_gen_len=32, **options)
        assert alone.token_ids == in_torch.token_ids
        result = speculative_generate(
            ids, copy, embedded_f32, gamma=make_policy("auto", 16), max_gen_len=32,
            prompt_cache=kept, **options,
        )  # fmt: skip
        assert result.token_ids == in_torch.token_ids
        assert result.accepted > 0


def test_bench_runs_the_exact_peer_and_the_target_in_llamacpp(embedded_pair) -> None:
    """`--target-runtime llamacpp`: bench's target-only and speculative methods run
    the float32 file in llama.cpp, and its default peer (llama.cpp alone on the
    same file, flash attention off and on) gives the same tokens; the speedup
    over llama.cpp alone is over the faster of its two runs."""
    from specrepl.chat.settings import Settings
    from specrepl.measure.bench.options import DEFAULT_PEERS, BenchOptions
    from specrepl.measure.bench.prompts import BenchPrompt
    from specrepl.measure.bench.runner import Benchmark

    settings = Settings(max_new_tokens=16, drafter_kind="lookup", target_runtime="llamacpp")
    options = BenchOptions(settings, peers=DEFAULT_PEERS, warmup=0, tune_widths=False)
    benchmark = Benchmark(embedded_pair, options)
    names = [m.name for m in benchmark.methods]
    assert names == ["target", "speculative", "llamacpp_exact", "llamacpp_exact_flash"]
    assert benchmark.methods[0].settings["target_runtime"].startswith("llama.cpp")
    records = benchmark.run([BenchPrompt(1, "writing", ("Name three colours of the rainbow.",))])
    assert benchmark.unavailable == {}, benchmark.unavailable
    runs = records[0].runs
    assert runs["llamacpp_exact"].token_ids == runs["target"].token_ids
    assert runs["llamacpp_exact_flash"].token_ids == runs["target"].token_ids
    assert runs["speculative"].token_ids == runs["target"].token_ids
    fastest = max(runs[name].tokens_per_second for name in names[2:])
    over = runs["speculative"].speedup_vs_llamacpp
    assert over == pytest.approx(runs["speculative"].tokens_per_second / fastest)


def test_auto_takes_llamacpp_only_where_faster_and_the_text_is_the_same(
    tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specrepl.engine.target_choice as target_choice
    from specrepl.engine.tuning import Tuning

    model, llama = tiny
    prompts = [PROMPT, [1, 2, 265, 268, 273, 281]]
    slow_torch = 10.0  # seconds: torch's step as if it were far dearer than llama.cpp's
    monkeypatch.setattr(target_choice, "torch_step_seconds", lambda *a, **k: slow_torch)
    choose = target_choice.choose_target_runtime
    same = choose("auto", model, Tuning(), llama.path, context_length=256, calibration=prompts)
    assert same.runtime == "llamacpp", same.reason
    assert "the same text on 2 prompts" in same.reason
    other = tiny_gguf(perturbed_copy(model, 0.6, seed=3), tmp_path / "other.gguf")
    differs = choose("auto", model, Tuning(), other, context_length=256, calibration=prompts)
    assert differs.runtime == "torch"
    assert "greedy text differs from torch's on calibration prompt" in differs.reason
    monkeypatch.setattr(target_choice, "torch_step_seconds", lambda *a, **k: 1e-9)
    slower = choose("auto", model, Tuning(), llama.path, context_length=256, calibration=prompts)
    assert slower.runtime == "torch" and "measured" in slower.reason
    forced = choose("llamacpp", model, Tuning(), other, context_length=256)
    assert forced.runtime == "llamacpp" and forced.reason == "asked for"
    assert choose("torch", model, Tuning(), llama.path, context_length=256).runtime == "torch"


def test_auto_takes_an_earlier_verdict_without_measuring_again(
    tiny, monkeypatch: pytest.MonkeyPatch
) -> None:
    import specrepl.engine.target_choice as target_choice
    from specrepl.engine.tuning import Tuning

    model, llama = tiny

    def not_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(target_choice, "torch_step_seconds", not_again)
    monkeypatch.setattr(target_choice, "_same_text", not_again)
    choose = target_choice.choose_target_runtime
    seconds = {"torch": 0.05, "llamacpp": 0.02}
    earlier = target_choice.Verdict("llamacpp", "a step costs 0.40 of torch's", seconds)
    taken = choose("auto", model, Tuning(), llama.path, context_length=256, earlier=earlier)
    assert taken.runtime == "llamacpp" and taken.earlier and not taken.measured
    described = taken.describe()
    assert "a step costs 0.40 of torch's (measured at an earlier start); reads" in described
    # the verdict to keep: the earlier one, with how prompts are read now timed beside it
    assert replace(taken.verdict(), reads_wide_from=None, reading=None) == earlier
    kept = target_choice.Verdict("torch", "llama.cpp's step measured 1.30x torch's", seconds)
    torch_again = choose("auto", model, Tuning(), llama.path, context_length=256, earlier=kept)
    assert torch_again.runtime == "torch" and torch_again.earlier
    forced = choose("torch", model, Tuning(), llama.path, context_length=256, earlier=earlier)
    assert forced.runtime == "torch" and forced.reason == "asked for"


def test_a_hybrid_drafts_with_the_model_where_the_target_gives_no_features(pair, tiny) -> None:
    """Where this llama.cpp cannot give features (a binding without the evaluation
    callback), a hybrid whose head is "auto" drafts with the model, saying why."""
    from specrepl.chat.drafting import choose_hybrid_source
    from specrepl.chat.settings import Settings

    _, tiny_llamacpp = tiny
    llama = LlamaCppModel(tiny_llamacpp.path, context_length=64)
    llama.features_problem, llama.gives_features = "no evaluation callback", False
    settings = Settings(drafter_kind="hybrid", drafter_head="auto")
    choice, head = choose_hybrid_source(settings, pair, None, target=llama)
    assert not choice.head and head is None
    assert "gives the head no features: no evaluation callback" in choice.describe()


def test_a_forced_runtime_that_cannot_run_is_refused_with_the_reason(pair) -> None:
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import SettingError

    session = ChatSession(pair)
    assert session.settings.target_runtime == "auto"  # the default
    with pytest.raises(SettingError, match=r"llama\.cpp cannot run the target: .*GGUF file"):
        session.update(target_runtime="llamacpp")
    assert session.settings.target_runtime == "auto"
    assert session.target.choice(session.settings).runtime == "torch"  # falls back, saying why
    assert "GGUF" in (session.target.summary(session.settings) or "")


def test_a_chat_session_runs_both_generators_on_the_llamacpp_target(embedded_pair) -> None:
    """The REPL's session with `target_runtime llamacpp`: the speculative run and the
    target alone both verify in llama.cpp, their tokens agree turn after turn with
    the caches kept, and /models' summary names the runtime."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings

    settings = Settings(max_new_tokens=24, drafter_kind="lookup", target_runtime="llamacpp")
    session = ChatSession(embedded_pair, settings)
    assert session.target.choice(session.settings).runtime == "llamacpp"
    assert "llama.cpp" in (session.target.summary(session.settings) or "")
    for prompt in ("Name three colours.", "Now name three more, in the same format."):
        answer = session.answer(prompt)
        assert answer.refusal is None
        speculative, alone = answer.runs["speculative"], answer.runs["target"]
        assert speculative.result.token_ids == alone.result.token_ids
        assert speculative.result.token_ids
    assert session.kept_caches()["target"] > 0


def test_a_wide_pass_gives_the_one_token_passes_logits(embedded_f32) -> None:
    """Verification reads a pass over k + 1 tokens, the target alone one token a
    pass: they must agree far below a greedy near-tie. With llama.cpp's default
    float16 keys and values they do not (a chat's turn parted from the target's
    text); the runtime keeps them in float32."""
    width = embedded_f32.width
    ids = [(7919 * i) % 40000 + 100 for i in range(64)]
    one_by_one, wide = embedded_f32.open(), embedded_f32.open()
    one_by_one.score(torch.tensor(ids[:47]), 1, width)
    singles = torch.cat(
        [one_by_one.score(torch.tensor(ids[:n]), 1, width)[0] for n in range(48, 65)]
    )
    wide.score(torch.tensor(ids[:47]), 1, width)
    together, _ = wide.score(torch.tensor(ids), 17, width)
    assert float((singles - together).abs().max()) < 1e-3


def test_a_torch_copy_reads_for_itself_when_the_target_runs_in_llamacpp(embedded_pair) -> None:
    """The embedded copy in torch takes a torch target's keys and values; a
    llama.cpp target hands it none, so it reads for itself, and the text is
    still the target's."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings
    from specrepl.engine.drafters.model import ModelDrafter

    settings = Settings(
        max_new_tokens=16, drafter_kind="model", drafter_runtime="torch", target_runtime="torch"
    )
    session = ChatSession(embedded_pair, settings)
    assert session._drafter(session.settings).uses_target_cache
    session.update(target_runtime="llamacpp")
    drafter = session._drafter(session.settings)
    assert isinstance(drafter, ModelDrafter)
    assert not drafter.uses_target_cache
    answer = session.answer("Name three colours.")
    speculative, alone = answer.runs["speculative"], answer.runs["target"]
    assert speculative.result.token_ids == alone.result.token_ids


def test_a_llamacpp_copy_takes_the_llamacpp_targets_keys_and_values(embedded_pair) -> None:
    """The copy in llama.cpp drafting for the target in llama.cpp takes the
    target context's keys and values (in a context of its own, probed when
    built): over a chat's turns with a pasted text it takes the positions
    instead of reading them, and the text is the target's turn after turn."""
    from specrepl.chat.answers import RunStep
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings
    from specrepl.engine.drafters.llamacpp import LlamaCppDraftRuntime
    from specrepl.engine.drafters.llamacpp_state import StateImporter

    settings = Settings(
        max_new_tokens=32, drafter_kind="model", drafter_runtime="llamacpp",
        target_runtime="llamacpp",
    )  # fmt: skip
    session = ChatSession(embedded_pair, settings)
    drafter = session._drafter(session.settings)
    assert isinstance(drafter.runtime, LlamaCppDraftRuntime)
    assert isinstance(drafter.importer, StateImporter), session.drafter_runtime().describe()
    assert drafter.uses_target_cache and drafter.window is None
    document = "The river town grew around a mill, a bridge and a market square. " * 30
    for prompt in (f"Read this: {document} What grew around the mill?", "And what else?"):
        steps: list = []
        answer = session.answer(prompt, on_event=steps.append)
        speculative, alone = answer.runs["speculative"], answer.runs["target"]
        assert speculative.result.token_ids == alone.result.token_ids
        assert speculative.result.accepted > 0
        events = [
            event.step
            for event in steps
            if isinstance(event, RunStep) and event.generator == "speculative"
        ]
        assert sum(event.imported_tokens for event in events) > 0
        assert sum(event.read_tokens for event in events) < len(events) * 4


def test_auto_on_the_embedded_pair_is_measured_once_and_stored(embedded_pair) -> None:
    """The default (`auto`): the first choice on this machine measures and stores
    its verdict; a later start (a new `ChatTarget`) takes it without measuring."""
    from specrepl.chat.settings import Settings
    from specrepl.chat.target import ChatTarget, verdict_key
    from specrepl.models.gguf_f32 import float32_gguf
    from specrepl.store.json_file import read_json_object
    from specrepl.store.paths import target_runtimes_file

    settings = Settings()
    assert settings.target_runtime == "auto"
    key = verdict_key(embedded_pair, float32_gguf(embedded_pair.target.gguf))
    first = ChatTarget(embedded_pair).choice(settings)
    stored = read_json_object(target_runtimes_file())[key]
    assert stored["runtime"] == first.runtime
    assert set(stored["seconds"]) == {"torch", "llamacpp"}
    again = ChatTarget(embedded_pair).choice(settings)
    assert again.earlier and again.runtime == first.runtime
    assert "(measured at an earlier start); reads " in again.describe()


def test_the_embedded_float32_file_gives_the_torch_targets_features(
    embedded_pair, embedded_f32
) -> None:
    """The hidden states the shipped head reads (its fused layers and the final
    state), from the embedded model's float32 file in llama.cpp and from the
    torch target, over a chat prompt: equal within float32 rounding."""
    from specrepl.engine.drafters.builder import load_drafter_head

    head, _ = load_drafter_head("embedded", embedded_pair.target.model)
    layers = head.config.fused_layers
    ids = torch.tensor(embedded_pair.tokenizer.encode("Name three colours, then a fruit."))
    vocab = embedded_pair.vocab_size
    _, expected = (
        TorchModel(embedded_pair.target.model)
        .open()
        .score(ids, 1, vocab, features=True, feature_layers=layers)
    )
    _, got = embedded_f32.open().score(ids, 1, vocab, features=True, feature_layers=layers)
    assert got.shape == expected.shape == (len(ids), 576 * (len(layers) + 1))
    scale = expected.abs().amax(dim=0).clamp(min=1.0)
    assert float(((got - expected).abs() / scale).max()) < 1e-3


def test_sampling_with_the_shipped_head_follows_the_llamacpp_targets_law(
    embedded_pair, embedded_f32
) -> None:
    """Three sampled tokens under top-3 at temperature 2 (27 outcomes), the shipped
    head drafting from the features of the embedded float32 file in llama.cpp:
    the samples against the law enumerated from the torch target (the same
    weights; the logits agree within 1e-3)."""
    from specrepl.engine.drafters.builder import load_drafter_head
    from specrepl.engine.drafters.head import HeadDrafter

    head, _ = load_drafter_head("embedded", embedded_pair.target.model)
    ids = embedded_pair.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Pick a random word."}],
        add_generation_prompt=True,
        return_dict=False,
    )
    drafter = HeadDrafter(head, keep_between_prompts=True)  # keeps what it read of the prompt
    assert_speculative_sampling_is_exact(
        embedded_f32,
        drafter,
        list(ids),
        TopKProcessor(temperature=2.0, top_k=3),
        embedded_pair.generation_options(use_cache=True),
        law_model=embedded_pair.target.model,
    )


def test_auto_takes_llamacpp_for_a_draft_head(embedded_pair) -> None:
    """A named draft head reads the target's features, which llama.cpp gives:
    under "auto" the target runs where it runs fastest, and the head drafts
    from llama.cpp's features with the target's text."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings

    settings = Settings(max_new_tokens=12, drafter_kind="head", drafter_head="embedded")
    session = ChatSession(embedded_pair, settings)
    choice = session.target.choice(session.settings)
    plain = session.target.choice(Settings())
    assert choice.runtime == plain.runtime  # the features change nothing of the choice
    answer = session.answer("Name three colours.")
    speculative, alone = answer.runs["speculative"], answer.runs["target"]
    assert speculative.result.token_ids == alone.result.token_ids


def test_the_default_hybrid_times_the_head_against_the_copy_over_llamacpp(embedded_pair) -> None:
    """The default drafter (hybrid, head "auto") over the target in llama.cpp:
    the shipped head (reading llama.cpp's features) and the copy are both timed
    there, the verdict is kept apart from one timed over torch, and the answer
    is the target's whichever drafts."""
    from specrepl.chat.config import load_config
    from specrepl.chat.session import ChatSession
    from specrepl.engine.drafters.head import HeadDrafter
    from specrepl.engine.drafters.hybrid import HybridDrafter
    from specrepl.store.paths import default_config_path

    settings = load_config(default_config_path()).settings.updated(
        target_runtime="llamacpp", max_new_tokens=12
    )
    assert settings.drafter_options().chooses_head
    session = ChatSession(embedded_pair, settings)
    answer = session.answer("Name three colours.")
    assert answer.refusal is None, answer.refusal
    assert answer.runs["speculative"].result.token_ids == answer.runs["target"].result.token_ids
    choice = session.drafters.choice(settings)
    assert set(choice.seconds) == {"head", "model"} and choice.tokens > 0
    drafter = session._drafter(settings)
    assert isinstance(drafter, HybridDrafter)
    assert isinstance(drafter.model, HeadDrafter) == choice.head


def test_the_warm_up_makes_a_llamacpp_context_for_both_target_runs(embedded_pair) -> None:
    """The first answer's target-alone run would otherwise make its context (its
    float32 keys and values for the whole context length) inside its timing."""
    from specrepl.chat.session import ChatSession
    from specrepl.chat.settings import Settings

    settings = Settings(max_new_tokens=4, drafter_kind="lookup", target_runtime="llamacpp")
    session = ChatSession(embedded_pair, settings)
    session.warm_up()
    target = session.target.runnable(session.settings)
    assert isinstance(target, LlamaCppModel)
    assert len(target._free[False]) >= 2  # the speculative run's and the target alone's


def windowed_copy(tiny, window: int):
    """A copy of the tiny target (its own file) taking the target's keys and
    values, with `window` held positions, and a target runtime holding 120
    positions of a random sequence of 121 tokens."""
    from specrepl.engine.drafters.llamacpp import llamacpp_drafter
    from specrepl.engine.drafters.llamacpp_state import probe_state_importer

    _, llama = tiny
    importer, reason = probe_state_importer(llama.path, llama, context_length=256, threads=1)
    assert importer is not None, reason
    importer.held_window = window
    drafter = llamacpp_drafter(importer.llama, importer=importer, held_window=window)
    ids = torch.randint(4, VOCAB, (121,), generator=torch.Generator().manual_seed(5))
    runtime = llama.open()
    runtime.score(ids[:120], 1, VOCAB)
    drafter.begin(ids, VOCAB)
    drafter.update(ids, 121, target_cache=runtime)
    return drafter, ids, runtime


def grown(ids: torch.Tensor, runtime, drafter, more: int, seed: int) -> torch.Tensor:
    """`ids` and `more` random tokens, the target holding all but the last."""
    longer = torch.cat(
        [ids, torch.randint(4, VOCAB, (more,), generator=torch.Generator().manual_seed(seed))]
    )
    runtime.score(longer[:-1], 1, VOCAB)
    drafter.update(longer, len(longer), target_cache=runtime)
    return longer


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, LlamaCppModel]:
    """A one-layer model: its keys and values at a position depend only on the
    token and the position, not on the tokens before."""
    model = tiny_llama(VOCAB, hidden_size=64, num_layers=1, sharpness=6.0)
    path = tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "one-layer.gguf")
    return model, LlamaCppModel(path, context_length=256, threads=1)


def test_a_windowed_copy_holds_the_start_and_the_last_positions_where_the_target_does(
    one_layer,
) -> None:
    """With a held window, a long handover takes the sequence's first
    SINK_TOKENS and its last `window` positions from the target, each at its
    own position (nothing is moved): a one-layer copy then predicts what a
    copy that read the whole sequence predicts once the positions between are
    let go, and not what it predicts after reading the held tokens one after
    another."""
    from specrepl.engine.drafters.draft_view import SINK_TOKENS
    from specrepl.engine.drafters.llamacpp_kv import last_logits
    from specrepl.engine.llamacpp import import_llamacpp, open_gguf

    drafter, ids, _ = windowed_copy(one_layer, 16)
    draft = drafter.propose(ids, 1, GreedyProcessor(), None)
    assert draft.imported_tokens == SINK_TOKENS + 16
    assert drafter.view.spans == [(0, SINK_TOKENS), (104, 121)]
    assert drafter.held() == [*ids[:SINK_TOKENS].tolist(), *ids[104:].tolist()]
    windowed = last_logits(drafter.runtime.llama)
    library = import_llamacpp()
    own = open_gguf(one_layer[1].path, context_length=256, threads=1)
    own.eval(ids[:120].tolist())
    library.llama_memory_seq_rm(library.llama_get_memory(own.ctx), 0, SINK_TOKENS, 104)
    own._batch.set_batch(batch=[int(ids[120])], n_past=120, logits_all=False)
    own._ctx.decode(own._batch)
    assert abs(windowed - last_logits(own)).max() < 1e-3
    moved = open_gguf(one_layer[1].path, context_length=256, threads=1)
    moved.eval(drafter.held())  # the held tokens one after another
    assert abs(windowed - last_logits(moved)).max() > 3e-3  # the positions are the target's


def test_a_windowed_copy_slides_its_window_on_and_drafts_as_it_would_holding_it(tiny) -> None:
    """Past its window the copy lets its oldest held positions go and takes
    only the target's new ones: it holds the start and the last `window`
    positions, and its drafts are those of a copy that took that window anew."""
    from specrepl.engine.drafters.draft_view import SINK_TOKENS

    drafter, ids, runtime = windowed_copy(tiny, 40)
    drafter.propose(ids, 1, GreedyProcessor(), None)
    assert drafter.view.spans == [(0, SINK_TOKENS), (80, 121)]
    more = grown(ids, runtime, drafter, 30, seed=6)
    draft = drafter.propose(more, 4, GreedyProcessor(), None)
    assert drafter.view.spans == [(0, SINK_TOKENS), (110, 154)]  # the window, three drafts
    assert draft.imported_tokens == 150 - 121  # only the positions it lacked written
    anew, _, _ = windowed_copy(tiny, 40)
    runtime_anew = tiny[1].open()
    runtime_anew.score(more[:150], 1, VOCAB)
    anew.begin(more, VOCAB)
    anew.update(more, 151, target_cache=runtime_anew)
    again = anew.propose(more, 4, GreedyProcessor(), None)
    assert anew.view.spans == [(0, SINK_TOKENS), (110, 154)]
    assert again.imported_tokens == SINK_TOKENS + 150 - 110
    assert draft.tokens.tolist() == again.tokens.tolist()


def test_a_windowed_copy_takes_its_window_anew_past_a_long_unseen_stretch(tiny) -> None:
    from specrepl.engine.drafters.draft_view import SINK_TOKENS

    drafter, ids, runtime = windowed_copy(tiny, 40)
    drafter.propose(ids, 1, GreedyProcessor(), None)
    longer = grown(ids, runtime, drafter, 60, seed=7)
    draft = drafter.propose(longer, 1, GreedyProcessor(), None)
    assert drafter.view.spans == [(0, SINK_TOKENS), (140, 181)]
    assert draft.imported_tokens == 180 - 140
    assert drafter.held() == [*longer[:SINK_TOKENS].tolist(), *longer[140:].tolist()]


def importer_beside_a_target(tiny, length: int, seed: int) -> tuple:
    """An importer probed on the tiny target's own file, `length` random
    tokens, and a target runtime holding all of them."""
    from specrepl.engine.drafters.llamacpp_state import probe_state_importer

    _, llama = tiny
    importer, reason = probe_state_importer(llama.path, llama, context_length=256, threads=1)
    assert importer is not None, reason
    ids = torch.randint(4, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
    runtime = llama.open()
    runtime.score(ids, 1, VOCAB)
    return importer, ids.tolist(), runtime


def test_a_copy_drops_held_positions_and_keeps_the_rest_where_they_are(tiny) -> None:
    from specrepl.engine.drafters.llamacpp import held_positions

    importer, ids, runtime = importer_beside_a_target(tiny, 60, seed=9)
    importer.write(runtime, 40, ids)
    importer.drop(4, 10)
    positions = held_positions(importer.llama)
    assert (positions.gap_at, positions.skipped) == (4, 10)
    assert importer.llama.input_ids[:30].tolist() == [*ids[:4], *ids[14:40]]
    importer.append(runtime, 40, 50, ids, held=30)  # continues the gap
    assert importer.llama.input_ids[:40].tolist() == [*ids[:4], *ids[14:50]]
    with pytest.raises(ValueError, match="gap"):
        importer.append(runtime, 52, 55, ids, held=40)  # a second gap
    with pytest.raises(ValueError, match="gap after 4"):
        importer.drop(8, 2)
    importer.append(runtime, 20, 30, ids, held=4)  # the window anew: one gap again
    assert (positions.gap_at, positions.skipped) == (4, 16)


@pytest.mark.parametrize("window", [8, 32])
def test_greedy_speculative_equals_the_target_with_a_windowed_copy(tiny, window) -> None:
    """A chat with a long second turn: the windowed copy drafts, the text is
    the llama.cpp target's."""
    from specrepl.engine.drafters.llamacpp import llamacpp_drafter
    from specrepl.engine.drafters.llamacpp_state import probe_state_importer

    _, llama = tiny
    importer, reason = probe_state_importer(llama.path, llama, context_length=256, threads=1)
    assert importer is not None, reason
    drafter = llamacpp_drafter(
        importer.llama, importer=importer, held_window=window, keep_between_prompts=True
    )
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    kept, history = PromptCache(), list(PROMPT)
    pasted = torch.randint(4, VOCAB, (60,), generator=torch.Generator().manual_seed(8)).tolist()
    for turn, user in enumerate(([2, 265, 281], [2, *pasted, 266], [2, 270, 281])):
        ids = [*history, *user]
        reference = autoregressive_generate(ids, llama, max_gen_len=16, **options)
        result = speculative_generate(
            ids, drafter, llama, gamma=4, max_gen_len=16, prompt_cache=kept, **options
        )
        assert result.token_ids == reference.token_ids, turn
        history = [*ids, *result.token_ids]
    assert len(drafter.held()) < len(history)


def test_the_shortest_stretch_handed_over_is_the_first_that_costs_less_than_its_read() -> None:
    """`fewest_worth_handing_over`: reads[w - 1] is a pass of w tokens; a
    stretch of `count` is worth handing over where that costs less than the
    pass of `count` + 1 tokens costs more than the one-token pass."""
    from specrepl.engine.drafters.llamacpp_state import fewest_worth_handing_over

    reads = [0.010, 0.016, 0.018, 0.022]  # a 4-bit copy: every token read costs
    assert fewest_worth_handing_over(reads, [0.0006, 0.0006, 0.0006]) == 1
    assert fewest_worth_handing_over(reads, [0.0070, 0.0070, 0.0070]) == 2
    flat = [0.010, 0.0102, 0.0104, 0.0106]  # a wider pass costs next to nothing more
    assert fewest_worth_handing_over(flat, [0.0006, 0.0006, 0.0006]) == 4
    assert fewest_worth_handing_over(flat, [0.0001, 0.0006, 0.0006]) == 1


def test_a_long_handover_teaches_the_cost_a_position_and_a_short_one_the_calls() -> None:
    """`learn_append_cost`: a slow long append no longer makes the call's own
    cost look dear (every short handover after it was refused)."""
    from types import SimpleNamespace

    from specrepl.engine.drafters.draft_runtime import learn_append_cost

    def learnt(positions: int, seconds: float) -> tuple[float, float]:
        costs = SimpleNamespace(seconds_per_position=0.0001, append_seconds=0.0005)
        learn_append_cost(costs, positions, seconds, long_stretch=24)
        return costs.seconds_per_position, costs.append_seconds

    per_position, fixed = learnt(800, 0.150)
    assert fixed == 0.0005
    assert per_position == pytest.approx(0.7 * 0.0001 + 0.3 * (0.150 - 0.0005) / 800)
    assert learnt(1, 0.0021) == (0.0001, pytest.approx(0.7 * 0.0005 + 0.3 * 0.002))
    assert learnt(2, 0.0) == (0.0001, 0.7 * 0.0005)


def test_a_long_handover_leaves_the_copys_own_cost_of_a_call(tiny) -> None:
    from specrepl.engine.drafters.llamacpp_state import PROBE_TOKENS

    importer, ids, runtime = importer_beside_a_target(tiny, 120, seed=12)
    importer.write(runtime, 10, ids)
    fixed, per_position = importer.append_seconds, importer.seconds_per_position
    importer.append(runtime, 10, 10 + 4 * PROBE_TOKENS, ids)
    assert importer.append_seconds == fixed and importer.seconds_per_position != per_position
    importer.append(runtime, 10 + 4 * PROBE_TOKENS, 11 + 4 * PROBE_TOKENS, ids)
    assert importer.append_seconds != fixed


def kept_every_draft(drafter, runtime, ids: torch.Tensor, bonus: int) -> tuple:
    """Draft 3 after `ids` (the target holding all but the last), then the
    step where the target kept all 3 and added `bonus`: the next draft."""
    first = drafter.propose(ids, 3, GreedyProcessor(), None)
    longer = torch.cat([ids, first.tokens, torch.tensor([bonus])])
    runtime.score(longer[:-1], 1, VOCAB)
    drafter.update(longer, len(longer), target_cache=runtime)
    return first, drafter.propose(longer, 3, GreedyProcessor(), None)


def test_a_copy_takes_the_draft_it_never_read_where_the_probe_found_that_cheaper(tiny) -> None:
    """After a step that kept every draft, the copy lacks its last draft (it
    never fed it) besides the target's new token. Where a handover of one
    position is worth it (`fewest_positions` 1), it takes that position from
    the target and reads the one token, and drafts what a copy reading both
    drafts; else it reads both."""
    from specrepl.engine.drafters.llamacpp import llamacpp_drafter
    from specrepl.engine.drafters.llamacpp_state import probe_state_importer

    _, llama = tiny
    ids = torch.randint(4, VOCAB, (40,), generator=torch.Generator().manual_seed(11))
    drafts = {}
    for fewest in (1, 4):
        importer, reason = probe_state_importer(llama.path, llama, context_length=256, threads=1)
        assert importer is not None, reason
        assert 1 <= importer.fewest_positions <= 4 and "position" in reason
        importer.fewest_positions = fewest
        drafter = llamacpp_drafter(importer.llama, importer=importer)
        runtime = llama.open()
        runtime.score(ids[:-1], 1, VOCAB)
        drafter.begin(ids, VOCAB)
        drafter.update(ids, len(ids), target_cache=runtime)
        first, second = kept_every_draft(drafter, runtime, ids, bonus=7)
        assert (first.imported_tokens, first.read_tokens) == (39, 1)
        expected = (1, 1) if fewest == 1 else (0, 2)
        assert (second.imported_tokens, second.read_tokens) == expected
        drafts[fewest] = (first.tokens.tolist(), second.tokens.tolist())
    assert drafts[1] == drafts[4]


def copy_taking_every_position(path: Path) -> tuple[ModelDrafter, list[int]]:
    """The model drafter over the GGUF file at `path` in llama.cpp, taking a
    llama.cpp target's keys and values however few (`fewest_positions` 1),
    and the list to which each handover appends how many positions it took."""
    from specrepl.engine.drafters.llamacpp import llamacpp_drafter
    from specrepl.engine.drafters.llamacpp_state import StateImporter
    from specrepl.engine.llamacpp import import_llamacpp, open_gguf

    library = import_llamacpp()
    llama = open_gguf(
        path, context_length=256, threads=1, sequences=2,
        type_k=library.GGML_TYPE_F32, type_v=library.GGML_TYPE_F32,
    )  # fmt: skip
    importer = StateImporter(llama, seconds_per_position=0.0)
    importer.fewest_positions = 1
    handed: list[int] = []
    append = importer.append

    def recorded(target, start: int, count: int, tokens, **keywords) -> float:
        handed.append(count - start)
        return append(target, start, count, tokens, **keywords)

    importer.append = recorded  # type: ignore[method-assign]
    return llamacpp_drafter(llama, importer=importer, keep_between_prompts=True), handed


def test_a_chat_stays_exact_with_a_copy_taking_every_position(tiny) -> None:
    """Greedy over a three-turn chat with kept caches: the copy takes even one
    position a step from the target, and the text is the target's."""
    _, llama = tiny
    drafter, handed = copy_taking_every_position(llama.path)
    results = chat_turns(llama, drafter)
    assert all(result.accepted > 0 for _, result in results)
    assert handed.count(1) >= 3


def test_sampling_with_a_copy_taking_every_position_follows_the_targets_law(
    tiny, tmp_path: Path
) -> None:
    """A perturbed copy (drafts differ from the target's law, so some are
    rejected) taking even one position a step from the target: chi-square
    against the target's exact law. Gamma 1 and 5 tokens (the first comes
    from the prompt's pass), so that a step after a kept draft comes within
    the tokens sampled: the copy then takes that one position."""
    model, llama = tiny
    path = tiny_gguf(perturbed_copy(model, 0.1, seed=1), tmp_path / "copy.gguf")
    drafter, handed = copy_taking_every_position(path)
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    processor = TopKProcessor(top_k=2)  # 32 outcomes of 5 tokens
    assert_speculative_sampling_is_exact(
        llama, drafter, PROMPT, processor, options,
        law_model=model, gamma=1, length=5, samples=1600,
    )  # fmt: skip
    assert handed.count(1) > 100
