"""Drafting across tokenizers: a drafter model whose vocabulary is not the target's.

Greedy speculative text equals the target's own for every drafter kind that
can draft that way, through text or id by id, across gamma, cache on and off
and a chat of several turns with kept caches; sampling keeps the target's
exact law (chi-square, with a negative control); the pair says which path
applies, and a drafter that cannot write the target's text is refused.
"""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.builder import DrafterSpec, build_drafter
from specrepl.engine.drafters.hybrid import HybridDrafter
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.drafters.translated import TextOfIds, TranslatedDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.processors import TopKProcessor
from specrepl.engine.prompt_cache import PromptCache
from specrepl.models.compatibility import IncompatibleTokenizersError
from specrepl.models.pair import ModelPair
from specrepl.models.vocabularies import TokenizerCodec, match_vocabularies
from specrepl.testing import (
    assert_no_draft_past_end,
    assert_speculative_sampling_is_exact,
    perturbed_copy,
    relabelled_copy,
    reworded_tokenizer,
    tiny_char_tokenizer,
    tiny_llama,
    tiny_tokenizer,
)

VOCAB = 32
PROMPT_TEXT = "<|im_start|> user w7 w12 w9 w20 <|im_end|> <|im_start|> assistant"
TOKENIZERS = {
    "same strings, other ids": lambda: reworded_tokenizer(VOCAB, seed=1),
    "other words": lambda: reworded_tokenizer(VOCAB, seed=1, renamed=2),
    "characters": tiny_char_tokenizer,
}


@pytest.fixture(scope="module")
def target():
    return tiny_llama(VOCAB, seed=4)


def prompt_ids(text: str = PROMPT_TEXT) -> list[int]:
    return tiny_tokenizer(VOCAB).encode(text, add_special_tokens=False)


def translated(target, name: str, *, noise: float = 0.0, use_cache: bool = True):
    """A drafter over the `name` tokenizer whose model is the target's
    weights relabelled to that vocabulary (perturbed by `noise`)."""
    drafter_tokenizer = TOKENIZERS[name]()
    _, match = match_vocabularies(
        tiny_tokenizer(VOCAB), drafter_tokenizer, target_logits=VOCAB,
        drafter_logits=len(drafter_tokenizer),
    )  # fmt: skip
    assert match is not None and match.translation is not None
    model = target if noise == 0 else perturbed_copy(target, noise, seed=1)
    model = relabelled_copy(model, match.translation.drafter_of_target, len(drafter_tokenizer))
    inner = ModelDrafter(model, use_cache=use_cache)
    return TranslatedDrafter(inner, match.translation), match


def test_the_pair_says_which_path_applies() -> None:
    target = tiny_tokenizer(VOCAB)
    kinds = {}
    for name, build in TOKENIZERS.items():
        drafter = build()
        width, match = match_vocabularies(
            target, drafter, target_logits=VOCAB, drafter_logits=len(drafter)
        )
        assert width == VOCAB
        kinds[name] = (match.kind, match.shared, match.samples)
    assert kinds["same strings, other ids"] == ("ids", VOCAB, True)
    assert kinds["other words"] == ("text", VOCAB - 2, True)
    assert kinds["characters"][0] == "text" and not kinds["characters"][2]
    _, same = match_vocabularies(
        target, tiny_tokenizer(VOCAB), target_logits=VOCAB, drafter_logits=VOCAB
    )
    assert same.kind == "one" and same.describe() == "one tokenizer"
    assert (
        "under other ids"
        in match_vocabularies(
            target,
            TOKENIZERS["same strings, other ids"](),
            target_logits=VOCAB,
            drafter_logits=VOCAB,
        )[1].describe()
    )


def test_a_drafter_that_cannot_write_the_targets_text_is_refused() -> None:
    other = reworded_tokenizer(VOCAB, seed=1, renamed=8)  # 8 of 28 words unknown to it
    with pytest.raises(IncompatibleTokenizersError, match=r"writes back only \d+%"):
        match_vocabularies(tiny_tokenizer(VOCAB), other, target_logits=VOCAB, drafter_logits=VOCAB)


def test_a_drafter_whose_logits_miss_its_own_tokens_is_refused() -> None:
    other = tiny_char_tokenizer()
    with pytest.raises(IncompatibleTokenizersError, match="drafter model's logits have 10 columns"):
        match_vocabularies(tiny_tokenizer(VOCAB), other, target_logits=VOCAB, drafter_logits=10)


def test_a_pair_with_another_tokenizer_is_assembled_not_refused(target) -> None:
    drafter_tokenizer = reworded_tokenizer(VOCAB, seed=1, renamed=2)
    pair = ModelPair.from_models(
        target,
        tiny_llama(VOCAB, seed=9),
        tiny_tokenizer(VOCAB),
        drafter_tokenizer=drafter_tokenizer,
    )
    assert pair.vocabulary is not None and pair.vocabulary.kind == "text"
    assert pair.translation is not None and not pair.drafter_is_copy
    drafter = build_drafter(
        DrafterSpec(DrafterOptions(kind="hybrid")), model=pair.drafter.model,
        translation=pair.translation,
    )  # fmt: skip
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model, TranslatedDrafter)


@pytest.mark.parametrize("name", list(TOKENIZERS))
@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_text_is_the_targets_across_tokenizers(target, name, gamma, use_cache) -> None:
    ids = prompt_ids()
    reference = autoregressive_generate(ids, target, max_gen_len=30, eos_tokens_id=[3])
    for noise in (0.0, 0.3):
        drafter, _ = translated(target, name, noise=noise, use_cache=use_cache)
        result = speculative_generate(
            ids, drafter, target, gamma=gamma, max_gen_len=30, eos_tokens_id=[3],
            use_cache=use_cache,
        )  # fmt: skip
        assert result.token_ids == reference.token_ids, (name, noise)
        assert result.drafted > 0


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_no_translated_draft_goes_past_the_answers_end(target, name) -> None:
    """The target's end token, given to the drafter in its own ids, stops its
    drafts there (nothing after it is kept) and the text is the target's."""
    ids = prompt_ids()
    reference = autoregressive_generate(ids, target, max_gen_len=30).token_ids
    end = reference[5]
    expected = reference[: reference.index(end) + 1]
    drafter, _ = translated(target, name)
    steps = []
    result = speculative_generate(
        ids, drafter, target, gamma=8, max_gen_len=30, eos_tokens_id=end, on_step=steps.append
    )
    assert result.token_ids == expected and result.stop_reason == "eos"
    met = assert_no_draft_past_end(steps, end, name)
    if name != "characters":  # drafted word by word, the end comes among the drafts
        assert met, name  # the case was met


def test_a_drafter_with_the_targets_strings_is_right_as_often_as_the_target(target) -> None:
    """The target's own weights under other ids (or other words, where the
    text has none of them) draft what the target says: every draft kept."""
    ids = prompt_ids("<|im_start|> user w7 w8 w9 <|im_end|> <|im_start|> assistant")
    for name in ("same strings, other ids", "other words"):
        drafter, _ = translated(target, name)
        result = speculative_generate(ids, drafter, target, gamma=4, max_gen_len=24)
        assert result.drafted > 0
        if name == "same strings, other ids":
            assert result.accepted == result.drafted


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_hybrid_over_a_translated_model_keeps_the_text(target, name) -> None:
    ids = prompt_ids("<|im_start|> user w7 w8 w9 w7 w8 <|im_end|> <|im_start|> assistant w7")
    reference = autoregressive_generate(ids, target, max_gen_len=30)
    model, _ = translated(target, name, noise=0.3)
    drafter = HybridDrafter(model, LookupDrafter(3))
    result = speculative_generate(ids, drafter, target, gamma=4, max_gen_len=30)
    assert result.token_ids == reference.token_ids


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_a_chat_with_kept_caches_keeps_the_targets_text(target, name) -> None:
    """Several turns, the target's prompt cache and the drafter's state kept
    (the drafter holds what it read of earlier turns in its own ids)."""
    drafter, _ = translated(target, name, noise=0.3)
    drafter.inner.keep_between_prompts = True
    kept, history = PromptCache(), []
    for turn, words in enumerate(("w7 w12", "w9 w9 w20", "w15 w7 w16")):
        asked = prompt_ids(f"<|im_start|> user {words} <|im_end|> <|im_start|> assistant")
        ids = [*history, *asked]
        reference = autoregressive_generate(ids, target, max_gen_len=12)
        result = speculative_generate(
            ids, drafter, target, gamma=3, max_gen_len=12, prompt_cache=kept
        )
        assert result.token_ids == reference.token_ids, turn
        history = [*ids, *result.token_ids]


@pytest.mark.parametrize("name", ["same strings, other ids", "other words"])
def test_sampling_across_tokenizers_follows_the_targets_law(target, name) -> None:
    drafter, _ = translated(target, name, noise=0.2)
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    assert_speculative_sampling_is_exact(
        target, drafter, prompt_ids(), TopKProcessor(top_k=3), options
    )


def test_the_law_test_sees_a_draft_law_carried_to_the_wrong_ids(target) -> None:
    """Negative control: a translation that reports the drafter's law under
    the wrong target ids (shifted by one) makes the law test fail."""

    class Misplaced(TranslatedDrafter):
        def _target_law(self, probs: torch.Tensor) -> torch.Tensor:
            return torch.roll(super()._target_law(probs), 1, dims=-1)

    right, _ = translated(target, "other words", noise=0.2)
    drafter = Misplaced(right.inner, right.translation)
    options = {"eos_tokens_id": None, "vocab_size": VOCAB}
    with pytest.raises(AssertionError, match=r"^\(|allow"):
        assert_speculative_sampling_is_exact(
            target, drafter, prompt_ids(), TopKProcessor(top_k=3), options
        )


def test_too_few_shared_tokens_draft_nothing_when_sampling(target) -> None:
    drafter, match = translated(target, "characters")
    assert not match.samples
    generator = torch.Generator().manual_seed(0)
    result = speculative_generate(
        prompt_ids(), drafter, target, gamma=3, max_gen_len=8,
        logits_processor=TopKProcessor(top_k=3), generator=generator,
    )  # fmt: skip
    assert result.drafted == 0


def test_a_session_answers_with_a_drafter_of_another_tokenizer(target) -> None:
    """The REPL's session, several turns: the pair says the path and every
    answer is the target's."""
    other = reworded_tokenizer(VOCAB, seed=1, renamed=2)
    _, match = match_vocabularies(
        tiny_tokenizer(VOCAB), other, target_logits=VOCAB, drafter_logits=VOCAB
    )
    drafter_model = relabelled_copy(
        perturbed_copy(target, 0.3, seed=1), match.translation.drafter_of_target, VOCAB
    )
    pair = ModelPair.from_models(
        target, drafter_model, tiny_tokenizer(VOCAB), drafter_tokenizer=other
    )
    for kind in ("model", "hybrid"):
        session = ChatSession(
            pair, Settings(max_new_tokens=16, drafter_kind=kind, drafter_head=None)
        )
        drafted = 0
        for prompt in ("w7 w8 w9", "w12 w12 w20", "w9"):
            answer = session.answer(prompt)
            assert answer.refusal is None
            spec, alone = answer.runs["speculative"].result, answer.runs["target"].result
            assert spec.token_ids == alone.token_ids, (kind, prompt)
            drafted += spec.drafted
        assert drafted > 0, kind


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with no merges: every byte its own token, so a
    character of several bytes takes several tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_text_of_ids_decoded_piece_by_piece_is_the_whole_texts() -> None:
    codec = TokenizerCodec(_byte_tokenizer())
    text = "Grüße aus Köln — 東京 and 🚀 launch"
    ids = codec.encode(text)
    assert len(ids) > len(text)  # characters of several bytes
    of = TextOfIds(codec)
    for end in range(1, len(ids) + 1):
        got = of(ids[:end])
        whole = codec.decode(ids[:end])
        assert got == whole.rstrip("\ufffd"), end
    assert of(ids) == text
    assert of(ids[:5]) == codec.decode(ids[:5]).rstrip("\ufffd")  # not an extension: from the start


def _trained_byte_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE with merges learnt from a few sentences (GPT-2's way of
    splitting words, as most hub tokenizers do)."""
    from tokenizers import trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    sentences = [LONG_TEXT] * 3
    backend.train_from_iterator(sentences, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


LONG_TEXT = (
    "The river runs through the valley and the town keeps its old bridges. "
    "Every spring the water rises, and the people of the town watch the river "
    "from the bridges while the mills turn.  Two spaces here, and a line\n"
    "break there; numbers 1234 and 56 follow the words. " * 12
)


def test_ids_of_a_growing_text_are_the_whole_texts_encoding() -> None:
    """Encoded in settled pieces at word boundaries, a byte-level BPE gives the
    tokens of the whole text at every length, while encoding only the open end."""
    from specrepl.engine.drafters.translated import OPEN_CHARACTERS, IdsOfText

    codec = TokenizerCodec(_trained_byte_bpe())
    ids_of = IdsOfText(codec)
    encoded: list[int] = []
    original = codec.encode

    def counting(text: str) -> list[int]:
        encoded.append(len(text))
        return original(text)

    codec.encode = counting  # type: ignore[method-assign]
    for end in range(1, len(LONG_TEXT) + 1, 7):
        assert ids_of(LONG_TEXT[:end]) == original(LONG_TEXT[:end]), end
    assert len(LONG_TEXT) > 4 * OPEN_CHARACTERS
    assert max(encoded) < 2 * OPEN_CHARACTERS  # never the whole text again
    assert ids_of("Another text") == original("Another text")  # not an extension: anew
