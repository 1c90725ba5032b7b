"""Long prompts read with flash attention for a llama.cpp target
(`engine/llamacpp_reading.py`): the values' layout moves both ways unchanged;
a wide read leaves the target where a plain read would, within flash
attention's rounding; greedy speculative output equals the target alone with
wide reads, for every drafter kind and across a chat with kept caches; the
choice is measured, and a target whose drafter reads its features never
reads wide.

Tiny GGUF files are written here from tiny torch models (`testing.tiny_gguf`);
the tests need llama-cpp-python (skipped without it unless
SPECREPL_REQUIRE_LLAMACPP=1, as in CI).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
import torch

from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.ngram import NgramDrafter
from specrepl.engine.gamma import make_policy
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.llamacpp_reading import READ_WIDTH, transposed_values
from specrepl.engine.llamacpp_runtime import LlamaCppModel
from specrepl.engine.prompt_cache import PromptCache
from specrepl.testing import perturbed_copy, tiny_gguf, tiny_llama

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
REQUIRED = os.environ.get("SPECREPL_REQUIRE_LLAMACPP") == "1"
pytestmark = pytest.mark.skipif(
    not HAS_LLAMA_CPP and not REQUIRED, reason="llama-cpp-python is not installed"
)

VOCAB = 300
PROMPT = [1, 2, 264, 290, 271, 280, 290, 271, 3, 2, 266, 270, 283, 285, 266, 271, 290, 281]
WIDE_FROM = 6
"""The fewest new tokens read wide in these tests (the prompts are short)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, LlamaCppModel]:
    model = tiny_llama(VOCAB, hidden_size=64, num_layers=2, sharpness=6.0)
    path = tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, LlamaCppModel(path, context_length=256, threads=1)


@pytest.fixture
def wide(tiny):
    """The tiny model reading prompts of `WIDE_FROM`+ new tokens wide."""
    model, llama = tiny
    llama.reads_wide_from = WIDE_FROM
    yield model, llama
    llama.reads_wide_from, llama.reading = None, None


def test_the_values_layout_moves_both_ways_unchanged(tiny) -> None:
    _, llama = tiny
    runtime = llama.open()
    runtime.score(torch.tensor(PROMPT), 1, VOCAB)
    buffer, size = runtime.sequence_state(0, len(PROMPT))
    state = np.frombuffer(buffer, dtype=np.uint8, count=size)
    by_position = transposed_values(state, to_transposed=False)
    assert by_position.size == state.size and not np.array_equal(by_position, state)
    assert np.array_equal(transposed_values(by_position, to_transposed=True), state)
    with pytest.raises(ValueError, match="already"):
        transposed_values(state, to_transposed=True)


def test_a_wide_read_leaves_the_target_where_a_plain_read_does(tiny) -> None:
    """The prompt's logits, and the steps after it (which read the moved keys
    and values), agree with a plain read within flash attention's rounding;
    values moved without their layout changed would not."""
    _, llama = tiny
    held, rest = PROMPT[:5], PROMPT[5:]
    runs = {}
    for reads_wide in (False, True):
        llama.reads_wide_from = WIDE_FROM if reads_wide else None
        runtime = llama.open()
        runtime.score(torch.tensor(held), 1, VOCAB)
        sequence = torch.tensor(PROMPT)
        logits = [runtime.score(sequence, 1, VOCAB)[0][-1]]
        assert runtime.held() == PROMPT
        for token in (266, 271, 290):
            sequence = torch.cat((sequence, torch.tensor([token])))
            logits.append(runtime.score(sequence, 1, VOCAB)[0][-1])
        runs[reads_wide] = torch.stack(logits)
    llama.reads_wide_from = None
    assert len(rest) >= WIDE_FROM
    scale = float(runs[False].abs().max())
    torch.testing.assert_close(runs[True], runs[False], atol=2e-3 * scale, rtol=0)


def test_an_earlier_wide_verdict_makes_the_flash_context_at_once(tiny, monkeypatch) -> None:
    """A reading taken from a stored verdict makes its flash-attention context
    then (start-up), not in the first long prompt's answer, where making a
    context costs up to a second; a plain verdict makes none."""
    import specrepl.engine.llamacpp_runtime as llamacpp_runtime

    _, llama = tiny
    made: list[bool] = []
    original = llamacpp_runtime._Context.__init__

    def counted(self, *args, **kwargs) -> None:
        made.append(bool(kwargs.get("flash")))
        original(self, *args, **kwargs)

    monkeypatch.setattr(llamacpp_runtime._Context, "__init__", counted)
    plain = LlamaCppModel(llama.path, context_length=256, threads=1)
    plain.take_reading(None, "reads prompts plainly (measured)")
    assert made == []
    fresh = LlamaCppModel(llama.path, context_length=256, threads=1)
    fresh.take_reading(WIDE_FROM, "reads prompts of 6+ new tokens with flash attention")
    runtime = fresh.open()
    assert made == [True, False]  # the reader's, at once; then the runtime's own
    reads: list[int] = []
    read_wide = fresh.read_wide
    monkeypatch.setattr(
        fresh, "read_wide", lambda c, t, w: reads.append(len(t)) or read_wide(c, t, w)
    )
    runtime.score(torch.tensor(PROMPT), 1, VOCAB)
    assert reads == [len(PROMPT)] and made == [True, False] and runtime.held() == PROMPT


def test_a_refused_move_reads_plainly_and_stops_reading_wide(wide, monkeypatch) -> None:
    import specrepl.engine.llamacpp_reading as reading

    _, llama = wide
    expected, _ = llama.open().score(torch.tensor(PROMPT), 1, VOCAB)  # wide, as asked
    llama.reading = "reads prompts of 6+ new tokens with flash attention"

    def refuse(*args: object) -> None:
        raise RuntimeError("llama.cpp took 0 of 10 bytes of keys and values")

    monkeypatch.setattr(reading, "_set_state", refuse)
    runtime = llama.open()
    runtime.score(torch.tensor(PROMPT[:2]), 1, VOCAB)
    logits, _ = runtime.score(torch.tensor(PROMPT), 1, VOCAB)
    assert runtime.held() == PROMPT  # read plainly instead
    assert llama.reads_wide_from is None and "a wide read failed" in llama.reading
    scale = float(expected.abs().max())
    torch.testing.assert_close(logits, expected, atol=2e-3 * scale, rtol=0)


def test_a_move_refused_when_reading_is_timed_reads_plainly(tiny, monkeypatch) -> None:
    import specrepl.engine.llamacpp_reading as reading

    def refuse(*args: object) -> None:
        raise RuntimeError("llama.cpp took 0 of 10 bytes of keys and values")

    monkeypatch.setattr(reading, "_set_state", refuse)
    llama = LlamaCppModel(tiny[1].path, context_length=512, threads=1)
    described = llama.time_reading()
    assert llama.reads_wide_from is None
    assert described == llama.reading and "a wide read failed: llama.cpp took 0" in described


def drafters(model: torch.nn.Module) -> dict:
    return {
        "model": ModelDrafter(perturbed_copy(model, 0.3)),
        "lookup": LookupDrafter(),
        "ngram": NgramDrafter(),
    }


@pytest.mark.parametrize("kind", ["model", "lookup", "ngram"])
@pytest.mark.parametrize("gamma", [4, "auto:8"])
def test_greedy_speculative_equals_the_target_alone_reading_wide(wide, kind, gamma) -> None:
    model, llama = wide
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    reference = autoregressive_generate(PROMPT, llama, max_gen_len=40, **options)
    policy = make_policy("auto", 8) if gamma == "auto:8" else gamma
    result = speculative_generate(
        PROMPT, drafters(model)[kind], llama, gamma=policy, max_gen_len=40, **options
    )
    assert result.token_ids == reference.token_ids


@pytest.mark.parametrize("kind", ["model", "lookup", "ngram"])
def test_a_chat_with_kept_caches_reading_wide_stays_exact(wide, kind) -> None:
    """Each turn's new text is read wide by both runs, after the same held
    tokens: the target alone's kept cache and the speculative run's."""
    model, llama = wide
    options = {"eos_tokens_id": 3, "vocab_size": VOCAB}
    drafter = drafters(model)[kind]
    kept_target, kept_speculative, history = PromptCache(), PromptCache(), list(PROMPT[:4])
    for turn in range(4):
        ids = [*history, 2, 265, 270 + turn, 281, 283, 285, 266, 290]
        reference = autoregressive_generate(
            ids, llama, max_gen_len=16, prompt_cache=kept_target, **options
        )
        result = speculative_generate(
            ids, drafter, llama, gamma=4, max_gen_len=16, prompt_cache=kept_speculative, **options
        )
        assert result.token_ids == reference.token_ids, turn
        if turn:
            assert result.reused_prompt_tokens == reference.reused_prompt_tokens
        history = [*ids, *result.token_ids]


def test_sampling_follows_the_exact_law_reading_wide(wide) -> None:
    """The prompt read wide, then sampled from speculatively: the target's law
    (enumerated by torch on the same weights: a wide read moves the logits by
    flash attention's rounding only)."""
    from specrepl.engine.processors import TopKProcessor
    from specrepl.testing import assert_speculative_sampling_is_exact

    model, llama = wide
    drafter = ModelDrafter(perturbed_copy(model, 0.5, seed=1))
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    assert_speculative_sampling_is_exact(
        llama, drafter, PROMPT, TopKProcessor(top_k=3), options, law_model=model
    )


def test_a_kept_runtime_holds_every_token_but_the_last(tiny) -> None:
    """However far a verification went (drafts kept up to an end token), the
    kept runtime holds what the target alone's would: all but the last token."""
    _, llama = tiny
    runtime = llama.open()
    sequence = torch.tensor(PROMPT)
    runtime.score(sequence, 1, VOCAB)
    cache = PromptCache()
    cache.keep(runtime, sequence[:-3])
    assert runtime.length == len(PROMPT) - 4
    taken, reused = cache.take(llama, PROMPT)
    assert taken is runtime and reused == len(PROMPT) - 4


def test_reading_is_measured_and_said(tiny) -> None:
    _, short = tiny
    assert "too short" in short.time_reading() and short.reads_wide_from is None
    short.reading = None
    llama = LlamaCppModel(short.path, context_length=512, threads=1)
    described = llama.time_reading()
    assert llama.reading == described
    assert f"{READ_WIDTH} tokens:" in described and "measured" in described
    if llama.reads_wide_from is None:
        assert described.startswith("reads prompts plainly")
    else:
        assert llama.reads_wide_from == READ_WIDTH
        assert described.startswith(f"reads prompts of {READ_WIDTH}+ new tokens")


def test_a_target_whose_drafter_reads_features_never_reads_wide(tiny, monkeypatch) -> None:
    import specrepl.engine.target_choice as target_choice
    from specrepl.engine.tuning import Tuning

    model, llama = tiny
    monkeypatch.setattr(LlamaCppModel, "time_reading", lambda self: "timed")
    choice = target_choice.choose_target_runtime(
        "llamacpp", model, Tuning(), llama.path, context_length=256, features=True
    )
    assert choice.runnable.reads_wide_from is None
    assert "reads prompts plainly (the drafter reads its features)" in choice.describe()
    plain = target_choice.choose_target_runtime(
        "llamacpp", model, Tuning(), llama.path, context_length=256
    )
    assert plain.runnable is not choice.runnable  # a model of its own: its runtimes read alike


def test_an_earlier_verdict_says_how_prompts_are_read_without_timing(
    tiny, tmp_path, monkeypatch
) -> None:
    """Timing the reading costs seconds at a start: it is kept in the stored
    verdict and taken from it at the next start; a verdict kept before it was
    timed has it timed once and marked to be kept."""
    import specrepl.engine.target_choice as target_choice
    from specrepl.engine.tuning import Tuning

    model, _ = tiny
    seconds = {"torch": 0.05, "llamacpp": 0.02}
    said = "reads prompts of 256+ new tokens with flash attention (measured)"
    earlier = target_choice.Verdict("llamacpp", "a step costs 0.40", seconds, READ_WIDTH, said)

    def not_again(self: LlamaCppModel) -> str:
        raise AssertionError("timed again")

    monkeypatch.setattr(LlamaCppModel, "time_reading", not_again)
    path = tiny_gguf(model, tmp_path / "fresh.gguf")  # a model not opened in this process yet
    choose = target_choice.choose_target_runtime
    taken = choose("auto", model, Tuning(), path, context_length=512, earlier=earlier)
    assert taken.runnable.reads_wide_from == READ_WIDTH and taken.runnable.reading == said
    assert not taken.timed_reading and taken.verdict() == earlier

    def timed(self: LlamaCppModel) -> str:
        self.reads_wide_from, self.reading = None, "reads prompts plainly (measured)"
        return self.reading

    monkeypatch.setattr(LlamaCppModel, "time_reading", timed)
    before = target_choice.Verdict("llamacpp", "a step costs 0.40", seconds)
    other = tiny_gguf(model, tmp_path / "other.gguf")
    again = choose("auto", model, Tuning(), other, context_length=512, earlier=before)
    assert again.timed_reading and again.verdict().reading == "reads prompts plainly (measured)"


def test_a_stored_verdict_keeps_the_reading_only_when_well_formed() -> None:
    from specrepl.chat.target import _stored_verdict

    entry = {"runtime": "llamacpp", "reason": "r", "seconds": {"llamacpp": 0.02}}
    now = 1000.0
    entry["measured_at"] = now
    assert _stored_verdict(entry, now).reading is None  # kept before reading was timed
    kept = _stored_verdict({**entry, "reads_wide_from": 256, "reading": "wide"}, now)
    assert (kept.reads_wide_from, kept.reading) == (256, "wide")
    damaged = _stored_verdict({**entry, "reads_wide_from": "x", "reading": "wide"}, now)
    assert (damaged.reads_wide_from, damaged.reading) == (None, None)
