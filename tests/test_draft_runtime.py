"""The draft runtimes the one model drafter runs over: torch (cached or not) and llama.cpp.

Each must hold exactly what it was fed, give after a feed the logits a fresh
read of the same tokens gives, and after a cut hold the prefix and go on from
there as if it had read only that: the model drafter's view of what is held,
its windows and its handovers rest on these alone.
"""

from __future__ import annotations

import pytest
import torch

from specrepl.engine.drafters.draft_runtime import DraftRuntime, TorchDraftRuntime
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.testing import perturbed_copy, tiny_llama

CPU = torch.device("cpu")


def logits_after(runtime: DraftRuntime, tokens: list[int], vocab: int) -> torch.Tensor:
    """The runtime's logits after reading `tokens` from nothing."""
    runtime.forget()
    runtime.feed(tokens)
    return runtime.last_logits(vocab, CPU).float()


def check_runtime(runtime: DraftRuntime, tokens: list[int], vocab: int, atol: float) -> None:
    runtime.forget()
    assert runtime.held() == []
    runtime.feed(tokens[:5])
    runtime.feed(tokens[5:7])
    runtime.feed(tokens[7:8])
    assert runtime.held() == tokens[:8]
    stepped = runtime.last_logits(vocab, CPU).float()
    assert stepped.shape == (vocab,)
    whole = logits_after(runtime, tokens[:8], vocab)
    assert torch.allclose(stepped, whole, atol=atol)
    assert not torch.allclose(whole, logits_after(runtime, tokens[:7], vocab), atol=atol)

    runtime.forget()
    runtime.feed(tokens[:8])
    runtime.cut(3)
    assert runtime.held() == tokens[:3]
    runtime.cut(5)  # a cut never lengthens
    assert runtime.held() == tokens[:3]
    runtime.feed(tokens[9:11])
    assert runtime.held() == tokens[:3] + tokens[9:11]
    after_cut = runtime.last_logits(vocab, CPU).float()
    assert torch.allclose(
        after_cut, logits_after(runtime, tokens[:3] + tokens[9:11], vocab), atol=atol
    )


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_torch_draft_runtime_holds_what_it_was_fed_and_cuts_to_a_prefix(use_cache) -> None:
    model = tiny_llama(32, seed=3)
    tokens = torch.randint(0, 32, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    check_runtime(TorchDraftRuntime(model, use_cache=use_cache), tokens, 32, atol=1e-5)


def test_a_llamacpp_draft_runtime_holds_what_it_was_fed_and_cuts_to_a_prefix(llama) -> None:
    from specrepl.engine.drafters.llamacpp import LlamaCppDraftRuntime

    runtime = LlamaCppDraftRuntime(llama)
    tokens = torch.randint(100, 20000, (12,), generator=torch.Generator().manual_seed(0)).tolist()
    try:
        check_runtime(runtime, tokens, runtime.width, atol=1e-2)
    finally:
        runtime.forget()


def test_the_model_drafter_over_a_given_torch_runtime_is_the_one_built_from_the_model() -> None:
    """`ModelDrafter(model)` is the drafter over `TorchDraftRuntime(model)`:
    the same drafts, step by step, and the target's output."""
    target = tiny_llama(32, seed=0)
    model = perturbed_copy(target, 0.2, seed=1)
    prompt = [1, 5, 9, 2, 7, 3]
    results = [
        speculative_generate(prompt, drafter, target, gamma=4, max_gen_len=24)
        for drafter in (ModelDrafter(model), ModelDrafter(TorchDraftRuntime(model)))
    ]
    assert results[0].token_ids == results[1].token_ids
    assert results[0].token_ids == autoregressive_generate(prompt, target, max_gen_len=24).token_ids
    assert results[0].drafted == results[1].drafted and results[0].accepted == results[1].accepted
