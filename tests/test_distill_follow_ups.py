"""Follow-ups in a draft head's data: second turns of a chat, answered by the target."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepl.models.pair import ModelPair
from specrepl.testing import tiny_llama, tiny_tokenizer
from specrepl.train import accumulate, follow_ups
from specrepl.train.accumulate import AnswerRecipe, accumulate_answers
from specrepl.train.distill import open_data
from specrepl.train.follow_ups import FOLLOW_UP_OPENERS, Answered, follow_up_prompts
from specrepl.train.prompts import user_turn_prefix


@pytest.fixture()
def pair() -> ModelPair:
    return ModelPair.from_models(tiny_llama(32, seed=4), None, tiny_tokenizer(32))


def encode_chat_for(pair: ModelPair):
    def encode_chat(messages) -> list[int]:
        return pair.tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, return_dict=False
        )

    return encode_chat


def answered(
    pair: ModelPair, count: int, *, ended: bool = True, length: int = 20
) -> list[Answered]:
    end = pair.eos_token_ids[0]
    return [
        Answered(f"w{7 + i} w8 w9", [10 + (i + j) % 20 for j in range(length)] + [end], ended)
        for i in range(count)
    ]


def follow(pair: ModelPair, turns: list[Answered], wanted: int = 4, *, seed: int = 3, **options):
    return follow_up_prompts(
        pair.target.model,
        pair.tokenizer,
        turns,
        wanted,
        seed=seed,
        encode_chat=encode_chat_for(pair),
        end_tokens=pair.eos_token_ids,
        **options,
    )


def test_follow_ups_continue_the_conversation(monkeypatch, pair) -> None:
    seen_prefixes: list[str] = []

    def written(model, tokenizer, prefixes, openers, **kwargs):
        seen_prefixes.extend(prefixes)
        assert all(opener in FOLLOW_UP_OPENERS for opener in openers)
        return ["w20 w21 w22", None, *(["w23 w24 w25"] * (len(prefixes) - 2))]

    monkeypatch.setattr(follow_ups, "continue_user_turns", written)
    turns = answered(pair, 6)
    prompts = follow(pair, turns)
    assert len(prompts) == 3  # one message was unusable
    for prefix in seen_prefixes:  # the conversation, up to the next user message
        question = next(t.question for t in turns if t.question in prefix)
        assert prefix.count("user") == 2 and "assistant" in prefix and question
    text = pair.tokenizer.decode(prompts[0])
    assert text.count("user") == 2 and "w20 w21 w22" in text
    assert text.rstrip().endswith("assistant")  # the writer answers next
    again = follow(pair, turns)
    assert again == prompts  # drawn with the shard's seed


def test_only_answers_that_ended_and_hold_enough_are_followed_up(pair) -> None:
    assert follow(pair, answered(pair, 4, ended=False)) == []
    assert follow(pair, answered(pair, 4, length=5)) == []
    assert follow(pair, answered(pair, 4), wanted=0) == []


def test_the_writer_writes_the_follow_ups_itself(pair) -> None:
    """The real sampling path on the tiny target: what it returns is a
    conversation with a third, new message."""
    prompts = follow(pair, answered(pair, 8), 8, seed=1, max_tokens=12)
    assert len(prompts) <= 8
    for prompt in prompts:
        assert pair.tokenizer.decode(prompt).count("user") == 2
    first = user_turn_prefix(pair.tokenizer)
    assert first.count("user") == 1 and first.rstrip().endswith("user")
    second = user_turn_prefix(pair.tokenizer, [{"role": "user", "content": "w9 w10 w11"}])
    assert second.startswith(first) and second.count("user") == 2 and "w9 w10 w11" in second


def test_shards_hold_and_record_their_follow_ups(monkeypatch, pair, tmp_path: Path) -> None:
    """A share of a shard's prompts follow up its own first turns: fewer first
    turns are written, the follow-ups are answered and counted."""
    given: list[list[Answered]] = []

    def follow_each(writer, tokenizer, turns, wanted, *, encode_chat, **kwargs):
        given.append(list(turns))
        return [
            encode_chat(
                [
                    {"role": "user", "content": t.question},
                    {"role": "assistant", "content": "w9 w9"},
                    {"role": "user", "content": f"w{10 + i} w11 w12"},
                ]
            )
            for i, t in enumerate(turns[:wanted])
        ]

    monkeypatch.setattr(accumulate, "follow_up_prompts", follow_each)
    data = open_data(pair, tmp_path / "data")

    def encode(text: str) -> list[int]:
        return encode_chat_for(pair)([{"role": "user", "content": text}])

    recipe = AnswerRecipe(
        max_new_tokens=6, shard_records=8, answer_batch=4, prompt_batch=8, follow_up_share=0.25
    )
    accumulate_answers(
        pair.target.model,
        pair.tokenizer,
        data,
        token_budget=1,
        recipe=recipe,
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=0,
        encode_chat=encode_chat_for(pair),
    )
    (turns,) = given
    assert len(turns) == 6  # the first turns: 8 less the 2 follow-ups wanted
    data = open_data(pair, tmp_path / "data")
    (shard,) = data.shards
    assert shard.records == 8 and shard.recipe["follow_up_prompts"] == 2
    assert "FOLLOW_UP_OPENERS" in shard.recipe["follow_ups"]
    start = pair.tokenizer.convert_tokens_to_ids("<|im_start|>")  # a message's first token
    second_turns = [r for r in data.records() if list(r.ids[: r.prompt_length]).count(start) == 4]
    assert len(second_turns) == 2
    for record in second_turns:  # answered after the conversation
        assert len(record.ids) > record.prompt_length
    # without a conversation encoder, no follow-ups: every prompt a first turn
    accumulate_answers(
        pair.target.model,
        pair.tokenizer,
        data,
        token_budget=data.summary().answer_tokens + 1,
        recipe=recipe,
        encode=encode,
        end_tokens=pair.eos_token_ids,
        pad_id=0,
    )
    assert "follow_up_prompts" not in open_data(pair, tmp_path / "data").shards[-1].recipe
