"""A chat keeps its caches from turn to turn, and every turn still gives exactly
the tokens of a fresh session that reads the whole history again."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from specrepl.app.commands.registry import REGISTRY
from specrepl.chat.answers import Answer
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.models.pair import ModelPair
from specrepl.testing import interrupt_on_call

USER_TURNS = [
    f"w{4 + turn % 20} w{5 + (3 * turn) % 20} w{6 + (7 * turn) % 20}" for turn in range(10)
]


def tokens(answer: Answer) -> dict[str, list[int]]:
    return {name: list(run.result.token_ids) for name, run in answer.runs.items()}


def recomputed(pair: ModelPair, kept: ChatSession, prompt: str) -> Answer:
    """The answer of a fresh session with the same settings and history: no cache kept."""
    fresh = ChatSession(pair, kept.settings)
    fresh.history = [dict(message) for message in kept.history]
    return fresh.answer(prompt)


def chat(
    pair: ModelPair, session: ChatSession, between: dict[int, str] | None = None
) -> list[Answer]:
    """Ten turns; before turn i the command `between[i]` runs. Each turn is checked
    against a fresh session's answer to the same history."""
    answers = []
    for turn, prompt in enumerate(USER_TURNS):
        if between and turn in between:
            REGISTRY.dispatch(session, between[turn])
        expected = recomputed(pair, session, prompt)
        answer = session.answer(prompt)
        assert answer.refusal is None, answer.refusal
        assert tokens(answer) == tokens(expected), (turn, between)
        answers.append(answer)
    return answers


@pytest.mark.parametrize("kind", ["model", "hybrid", "ngram", "lookup"])
def test_ten_turns_with_kept_caches_equal_a_recomputed_chat(pair: ModelPair, kind: str) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8, drafter_kind=kind, drafter_gen=True))
    answers = chat(pair, session)
    for previous, answer in itertools.pairwise(answers):
        for name, run in answer.runs.items():
            result = run.result
            if name == "drafter":  # its cache holds its own answer, not the one kept in the chat
                assert result.reused_prompt_tokens >= previous.prompt_tokens - 1, result
            else:
                assert result.reused_prompt_tokens > result.prompt_tokens // 2, (name, result)
    assert all(held > 0 for held in session.kept_caches().values())


def test_commands_between_turns_drop_what_they_invalidate(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    between = {
        2: "/gamma 2",  # keeps the caches
        3: "/reset",
        5: "/system w30 w31",
        6: "/drafter_kind lookup",
        7: "/cache off",
        8: "/cache on",
        9: "/gamma auto 6",
    }
    answers = chat(pair, session, between)

    def reused(turn: int, generator: str = "speculative") -> int:
        return answers[turn].runs[generator].result.reused_prompt_tokens

    assert reused(2) > 0 and reused(2, "target") > 0
    assert reused(3) == 0 and reused(3, "target") == 0  # after /reset
    assert reused(5) == 0 and reused(5, "target") == 0  # after /system
    assert reused(6) == 0 and reused(6, "target") > 0  # another drafter: its run starts afresh
    assert reused(7) == 0 and reused(8) == 0  # /cache off, then on again
    assert reused(9) > 0


def test_an_interrupted_turn_leaves_no_cache_behind(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=8))
    for prompt in USER_TURNS[:4]:
        session.answer(prompt)
    with interrupt_on_call(pair.target.model, 2):
        interrupted = session.answer(USER_TURNS[4])
    assert interrupted.interrupted and len(session.history) == 8
    assert session.kept_caches()["speculative"] == 0
    for prompt in USER_TURNS[4:7]:  # turn 5 asked again, then the chat goes on
        expected = recomputed(pair, session, prompt)
        assert tokens(session.answer(prompt)) == tokens(expected)


def test_sampling_at_a_fixed_seed_with_kept_caches(pair: ModelPair) -> None:
    settings = Settings(max_new_tokens=8, processor="multinomial", temperature=1.0, seed=7, gamma=3)
    answers = chat(pair, ChatSession(pair, settings.updated(gamma_policy="fixed")))
    assert answers[-1].runs["speculative"].result.reused_prompt_tokens > 0


def test_a_chat_longer_than_the_context_drops_its_oldest_turns(pair: ModelPair) -> None:
    session = ChatSession(pair, Settings(max_new_tokens=24))
    dropped_at = None
    for turn in range(40):
        prompt = " ".join(f"w{4 + (turn + i) % 20}" for i in range(6))
        answer = session.answer(prompt)
        assert answer.refusal is None, answer.refusal
        if answer.notices:
            dropped_at = turn
            assert "oldest" in answer.notices[-1] and "/reset" in answer.notices[-1]
            assert answer.prompt_tokens + 24 <= 256
            break
    assert dropped_at is not None
    expected: dict[str, Any] = tokens(recomputed(pair, session, "w9 w10"))
    following = session.answer("w9 w10")
    assert tokens(following) == expected
    # the drop freed a quarter of the context: the next turn drops nothing and
    # extends what the caches hold instead of reading the whole chat again
    assert following.notices == []
    for run in following.runs.values():
        assert run.result.reused_prompt_tokens > following.prompt_tokens // 2


def test_config_and_the_summary_show_what_the_caches_kept(pair: ModelPair) -> None:
    import io

    from rich.console import Console

    from specrepl.app.render.repl import Renderer

    session = ChatSession(pair, Settings(max_new_tokens=6))
    console = Console(file=io.StringIO(), width=160, record=True)
    renderer = Renderer(console)
    renderer.show(REGISTRY.dispatch(session, "/config"))
    assert "No cache is kept from the last turn" in console.export_text()
    session.answer(USER_TURNS[0])
    second = session.answer(USER_TURNS[1])
    renderer.show(REGISTRY.dispatch(session, "/config"))
    renderer.answer(second)
    text = console.export_text()
    held = session.kept_caches()
    assert f"speculative {held['speculative']}" in text and f"target {held['target']}" in text
    result = second.runs["target"].result
    fed = result.prompt_tokens - result.reused_prompt_tokens
    assert f"{fed}/{result.prompt_tokens}" in text and fed < result.prompt_tokens
