"""A greedy difference weighed by the target (`engine/near_ties.py`): a
bfloat16 near-tie is said as one, not as an alarm; a difference the target
does not explain stays "DIFFERS" in red; the session asks the target where
the speculative run parts from it, and says the verdict in the summary and
the one-shot JSON.

Tiny seeded models built in code: a bfloat16 target with two output rows
made equal (an exact tie), and a float32 target whose top choice leads by
far."""

from __future__ import annotations

import pytest
import torch

from specrepl.app.render.answer import match_line
from specrepl.chat.answers import Answer, Run
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.generation import autoregressive_generate
from specrepl.engine.near_ties import check_difference, dtype_step, weigh_difference
from specrepl.engine.output_match import TieCheck, compare_outputs
from specrepl.engine.results import GenerationResult
from specrepl.engine.runtime import TorchModel
from specrepl.models.pair import ModelPair
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

VOCAB = 32
PROMPT = [1, 17, 4, 30, 8, 8, 2, 11]


def tied_target(dtype: torch.dtype) -> tuple[torch.nn.Module, int, int]:
    """A target whose greedy choice after PROMPT ties exactly with another
    token (their output rows equal): returns it, its choice and the other."""
    model = tiny_llama(VOCAB, seed=0).to(dtype)
    choice = autoregressive_generate(PROMPT, model, max_gen_len=1).token_ids[0]
    other = (choice + 5) % VOCAB
    with torch.no_grad():
        model.lm_head.weight[other] = model.lm_head.weight[choice]
    # argmax keeps the first of equal logits: the target now chooses the lower id
    return model, min(choice, other), max(choice, other)


def test_the_dtype_step_is_one_unit_in_the_last_place() -> None:
    assert dtype_step(torch.bfloat16, 45.0) == 0.25
    assert dtype_step(torch.bfloat16, -3.0) == 2**-6
    assert dtype_step(torch.float32, 1.0) == torch.finfo(torch.float32).eps


def test_an_exact_tie_in_bfloat16_is_a_near_tie() -> None:
    model, choice, other = tied_target(torch.bfloat16)
    runnable = TorchModel(model)
    assert autoregressive_generate(PROMPT, runnable, max_gen_len=1).token_ids == [choice]
    check = check_difference(runnable, PROMPT, choice, other, VOCAB, position=0)
    assert check.near_tie and check.dtype == "bfloat16"
    assert check.margin == 0.0 and check.rounding > 0


def test_a_choice_that_leads_by_far_is_no_near_tie() -> None:
    model = tiny_llama(VOCAB, seed=0)
    runnable = TorchModel(model)
    logits = model(torch.tensor([PROMPT])).logits[0, -1]
    choice, last = int(logits.argmax()), int(logits.argmin())
    check = check_difference(runnable, PROMPT, choice, last, VOCAB, position=7)
    assert not check.near_tie and check.dtype == "float32"
    assert check.margin > 1.0 and check.rounding < 1e-4 and check.position == 7


def test_the_verdict_says_a_near_tie_plainly_and_a_bug_loudly() -> None:
    tie = TieCheck(position=4, margin=0.25, rounding=0.25, dtype="bfloat16", near_tie=True)
    match = compare_outputs([5, 6, 7, 8, 9], [5, 6, 7, 8, 10], greedy=True, tie=tie)
    assert match.near_tie and not match.alarming
    assert match.describe() == (
        "differs at token 4: a bfloat16 near-tie, margin 0.25 (rounding 0.25)"
    )
    assert match.to_dict()["near_tie"]["margin"] == 0.25
    assert match_line(match).style == "yellow"
    bug = TieCheck(position=4, margin=3.0, rounding=0.001, dtype="float32", near_tie=False)
    loud = compare_outputs([5, 6, 7, 8, 9], [5, 6, 7, 8, 10], greedy=True, tie=bug)
    assert loud.alarming and loud.describe().startswith("DIFFERS at token 4 (margin 3")
    assert "not a near-tie" in loud.describe()
    assert match_line(loud).style == "bold red"
    # a check made at another position is not this difference's
    elsewhere = compare_outputs([5, 6, 9], [5, 6, 10], greedy=True, tie=tie)
    assert elsewhere.tie is None and elsewhere.alarming
    assert compare_outputs([5, 6], [5, 6], greedy=True, tie=tie).describe() == "identical"


def test_the_first_difference_is_weighed_at_its_position() -> None:
    model, choice, other = tied_target(torch.bfloat16)
    runnable = TorchModel(model)
    own = autoregressive_generate(PROMPT[:-3], runnable, max_gen_len=6).token_ids
    prompt = PROMPT[:-3]
    # the target's own text up to the prompt's end, then the tied pair
    target_tokens = [*PROMPT[-3:], choice, *own[:2]]
    other_tokens = [*PROMPT[-3:], other, *own[:2]]
    check = weigh_difference(runnable, prompt, target_tokens, other_tokens, VOCAB)
    assert check is not None and check.position == 3 and check.near_tie
    assert weigh_difference(runnable, prompt, own, own, VOCAB) is None
    assert weigh_difference(runnable, prompt, own, own[:3], VOCAB) is None  # stopped early


def _run(generator: str, tokens: list[int]) -> Run:
    result = GenerationResult(kind="speculative", prompt_tokens=0, token_ids=tokens)
    return Run(generator=generator, result=result, text="")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_session_asks_its_target_where_the_runs_part(dtype) -> None:
    """The session's weighing (`ChatTarget.weigh_difference`), given an answer
    whose speculative tokens take the tied token (bfloat16: a near-tie) or a
    far-behind one (float32: a bug)."""
    model, choice, other = tied_target(dtype)
    if dtype == torch.float32:
        logits = model(torch.tensor([PROMPT])).logits[0, -1]
        other = int(logits.argmin())
    pair = ModelPair.from_models(model, perturbed_copy(model, 0.3, seed=2), tiny_tokenizer(VOCAB))
    session = ChatSession(pair, Settings(drafter_kind="lookup", target_runtime="torch"))
    answer = Answer(prompt="w9", mode="raw", settings=session.settings)
    answer.runs["speculative"] = _run("speculative", [other, 9, 9])
    answer.runs["target"] = _run("target", [choice, 9, 9])
    answer.tie = session.target.weigh_difference(answer, PROMPT)
    match = answer.output_match
    assert match.first_difference == 0 and match.tie is answer.tie
    assert match.near_tie is (dtype == torch.bfloat16)
    assert match.alarming is (dtype == torch.float32)
    assert answer.to_dict()["speculative_vs_target"]["near_tie"]["dtype"] == str(dtype)[6:]
    answer.runs["speculative"] = _run("speculative", [choice, 9, 9])
    assert session.target.weigh_difference(answer, PROMPT) is None  # nothing to weigh


def test_a_bfloat16_chat_says_every_difference_it_finds(pair) -> None:
    """Real answers of a bfloat16 target: a run that parts from the target
    alone is weighed by the target (and, with these weights, never found to
    be a bug); identical answers are not weighed."""
    model = tiny_llama(VOCAB, seed=4).to(torch.bfloat16)
    bf16 = ModelPair.from_models(model, perturbed_copy(model, 0.3, seed=2), tiny_tokenizer(VOCAB))
    session = ChatSession(bf16, Settings(drafter_kind="model", max_new_tokens=24, chat=False))
    for prompt in ("w7 w8 w9", "w10 w11", "w12 w13 w14 w15", "w9 w9 w9"):
        answer = session.answer(prompt)
        match = answer.output_match
        assert match is not None and answer.refusal is None
        if match.identical:
            assert answer.tie is None
        else:
            assert answer.tie is not None and not match.alarming, match.describe()
