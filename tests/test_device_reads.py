"""The decoding loop reads back from the target's device once a step.

On a GPU every read of a tensor's values on the host (`.tolist()`, `int()`,
`bool()`, `.item()`) waits for the device's queue. The loop (`steps.py`,
`verification.py`, the processors, the clock, `generation.py`) makes one
such read a step: the verification's verdict. Counted on a CPU with
`specrepl.testing.HostReads`, which sees every read made by specrepl's own
lines (a negative control shows it sees them). A model drafter's own reads
are counted apart: the sequence once a step, and each draft it feeds back.
"""

from __future__ import annotations

import math

import pytest
import torch

from specrepl.engine.clock import Clock
from specrepl.engine.drafters.lookup import LookupDrafter
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.processors import MultinomialProcessor, UnusableLogitsError, usable_logits
from specrepl.engine.verification import greedy_verdict, sampling_verdict
from specrepl.testing import HostReads, perturbed_copy, tiny_llama

LOOP = (
    "engine/steps.py",
    "engine/verification.py",
    "engine/processors.py",
    "engine/clock.py",
    "engine/generation.py",
)
DRAFTERS = ("engine/drafters/",)
PROMPT = [1, 5, 9, 2, 5, 9, 2, 7, 3, 5, 9]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(32, seed=0)


def test_the_counter_sees_reads_and_the_verdict_makes_one() -> None:
    with HostReads() as counted:
        usable_logits(torch.tensor([[math.nan, 1.0], [0.0, 2.0]]))
    assert counted.made_in("engine/processors.py") >= 2  # the negative control
    logits = torch.randn(5, 32)
    drafts = torch.argmax(logits[:4], dim=-1)
    with HostReads() as counted:
        verdict = greedy_verdict(drafts, logits)
    assert (verdict.accepted, verdict.token) == (4, int(torch.argmax(logits[4])))
    assert verdict.drafts == drafts.tolist() and verdict.token_tensor.tolist() == [verdict.token]
    assert counted.total == 1
    probs = torch.softmax(torch.randn(5, 32), dim=-1)
    with HostReads() as counted:
        sampling_verdict(drafts, torch.softmax(torch.randn(4, 32), -1), probs)
    assert counted.total == 1


def test_the_target_alone_reads_once_a_step(target) -> None:
    with HostReads() as counted:
        result = autoregressive_generate(PROMPT, target, max_gen_len=24)
    assert result.steps == 24
    assert counted.made_in(*LOOP, outside=DRAFTERS) == result.steps


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("kind", ["lookup", "model"])
def test_a_speculative_step_reads_once_in_the_loop(target, kind: str, sampling: bool) -> None:
    drafter = LookupDrafter(3) if kind == "lookup" else ModelDrafter(perturbed_copy(target, 0.05))
    processor = MultinomialProcessor(1.0) if sampling else None
    generator = torch.Generator().manual_seed(0) if sampling else None
    events = []
    with HostReads() as counted:
        result = speculative_generate(
            PROMPT, drafter, target, gamma=4, max_gen_len=32,
            logits_processor=processor, generator=generator, on_step=events.append,
        )  # fmt: skip
    assert result.steps > 1 and result.drafted > 0
    assert counted.made_in(*LOOP, outside=DRAFTERS) == result.steps
    if kind == "model":  # the sequence once a step; each draft (sampling: its law's check too)
        own = counted.total - counted.made_in(*LOOP, outside=DRAFTERS)
        drafted = sum(len(step.drafts) for step in events)
        assert 0 < own <= result.steps + (2 if sampling else 1) * drafted


def test_a_clock_on_a_cpu_reads_the_host() -> None:
    clock = Clock(torch.device("cpu"))
    start = clock.resume()
    end = clock.pause()
    assert start.events == () and end.events == ()
    assert clock.seconds(start, end) == pytest.approx(end.host - start.host)
    assert clock.active == pytest.approx(end.host - start.host)


def test_the_one_pass_verdict_is_usable_logits_argmax() -> None:
    """The verdict takes each row's largest in one pass and resolves a row whose
    largest is not finite again: the same choices as `usable_logits`' argmax,
    whatever NaN and infinities the rows hold; a row with no finite logit is refused."""
    generator = torch.Generator().manual_seed(0)
    for case in range(300):
        logits = torch.randn(5, 40, generator=generator)
        for _ in range(case % 6):
            row, column = torch.randint(5, (1,), generator=generator), torch.randint(40, (1,))
            logits[row, column] = (math.nan, math.inf, -math.inf)[case % 3]
        drafts = torch.randint(40, (4,), generator=generator)
        if not torch.isfinite(logits).any(dim=-1).all():
            with pytest.raises(UnusableLogitsError):
                greedy_verdict(drafts, logits)
            continue
        choices = torch.argmax(usable_logits(logits), dim=-1).tolist()
        verdict = greedy_verdict(drafts, logits)
        accepted = next((i for i in range(4) if drafts[i] != choices[i]), 4)
        assert (verdict.accepted, verdict.token) == (accepted, choices[accepted]), case
        assert verdict.token_tensor.tolist() == [verdict.token]


def test_a_sampled_step_over_overflowed_logits_is_decided_again() -> None:
    """Logits with an infinity: the unread probabilities say they are not right,
    the verdict drawn from a stand-in is dropped, and the checked probabilities
    (the +inf takes its row's mass) decide."""
    processor = MultinomialProcessor(1.0)
    logits = torch.randn(5, 32)
    logits[2, 7] = math.inf
    probs, usable = processor.unread_probabilities(logits)
    assert not bool(usable)
    drafts, q = torch.tensor([1, 2, 3, 4]), torch.softmax(torch.randn(4, 32), dim=-1)
    assert sampling_verdict(drafts, q, probs, None, usable) is None
    checked = processor.probabilities(logits)
    assert checked[2, 7] == 1.0
    fine = torch.randn(5, 32)
    probs, usable = processor.unread_probabilities(fine)
    assert bool(usable)
    torch.testing.assert_close(probs, processor.probabilities(fine))
