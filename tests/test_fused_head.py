"""Heads that read earlier layers of the target besides its final hidden state
(EAGLE-3's fused features): the engine gives the drafter the same features
training reads, the unrolled training passes are what drafting sees, the files
keep the layers, and a head whose layers the target lacks is refused.

Greedy equality and the sampling law for fused heads are in test_drafters.py
and test_sampling.py with the other drafters. Tiny random targets only.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from specrepl.engine.drafters.draft_head import DraftHead, HeadCache, HeadConfig
from specrepl.engine.drafters.head import HeadDrafter
from specrepl.engine.drafters.head_store import (
    HeadLoadError,
    load_head,
    save_head,
    target_fingerprint,
)
from specrepl.engine.forward import forward_pass
from specrepl.engine.generation import speculative_generate
from specrepl.testing import tiny_head, tiny_llama
from specrepl.train.data import target_features
from specrepl.train.options import add_arguments, options_from_args

HIDDEN = 32


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return tiny_llama(32, seed=4, num_layers=4)


def test_the_engine_gives_the_features_training_reads(target) -> None:
    """What a drafter receives while generating is what its training was fed."""
    ids = torch.tensor([1, 17, 4, 30, 8, 9, 12])
    _, engine = forward_pass(target, ids, None, 1, 32, features=True, feature_layers=(1, 3))
    trained_on = target_features(target, [ids], pad_id=0, feature_layers=(1, 3))[0]
    assert engine.shape == (7, 3 * HIDDEN) and trained_on.shape == (6, 3 * HIDDEN)
    assert torch.allclose(engine[:6].to(torch.bfloat16).float(), trained_on.float(), atol=1e-2)
    _, final = forward_pass(target, ids, None, 1, 32, features=True)
    assert torch.equal(engine[:, -HIDDEN:], final)  # the final hidden state comes last


def test_unrolled_passes_of_a_fused_head_match_drafting_step_by_step(target) -> None:
    torch.manual_seed(0)
    head = DraftHead.for_target(target, torch.arange(20), fused_layers=(1, 2)).eval()
    features, tokens = torch.randn(1, 10, 3 * HIDDEN), torch.randint(0, 32, (1, 10))
    positions = torch.arange(10)[None]
    with torch.no_grad():
        passes = head.unrolled(features, tokens, 3)
        cache = HeadCache()
        head.step(head.fused(features[:, :7]), tokens[:, :7], positions[:, :7], cache)
        second = head.step(passes[0][:, 6:7], tokens[:, 7:8], positions[:, 7:8], cache)
        third = head.step(second, tokens[:, 8:9], positions[:, 8:9], cache)
    assert torch.allclose(passes[0], head.step(head.fused(features), tokens, positions), atol=1e-5)
    assert torch.allclose(second, passes[1][:, 7:8], atol=1e-5)
    assert torch.allclose(third, passes[2][:, 8:9], atol=1e-5)


def test_the_fused_features_matter(target) -> None:
    """The earlier layers' slots change the head's output (they are not ignored)."""
    torch.manual_seed(0)
    head = DraftHead.for_target(target, torch.arange(20), fused_layers=(2,)).eval()
    features, tokens = torch.randn(1, 5, 2 * HIDDEN), torch.randint(0, 32, (1, 5))
    changed = features.clone()
    changed[..., :HIDDEN] += 1.0
    positions = torch.arange(5)[None]
    with torch.no_grad():
        a = head.step(head.fused(features), tokens, positions)
        b = head.step(head.fused(changed), tokens, positions)
    assert not torch.allclose(a, b, atol=1e-4)


def test_a_saved_fused_head_loads_with_its_layers_and_drafts_the_same(target, tmp_path) -> None:
    head = tiny_head(target, draft_vocab=24, tokens=18_000, fused_layers=(1, 2))
    save_head(
        head, tmp_path, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    loaded, _ = load_head(tmp_path, target)
    assert loaded.config.fused_layers == (1, 2)
    drafts_a: list[tuple[int, ...]] = []
    drafts_b: list[tuple[int, ...]] = []
    prompt = [1, 17, 4, 30, 8]
    for drafter, sink in (
        (HeadDrafter(head.to(torch.bfloat16).float()), drafts_a),
        (HeadDrafter(loaded), drafts_b),
    ):
        speculative_generate(
            prompt,
            drafter,
            target,
            gamma=3,
            max_gen_len=20,
            on_step=lambda e, s=sink: s.append(e.drafts),
        )
    assert drafts_a == drafts_b


def test_a_head_fusing_layers_the_target_lacks_is_refused(target, tmp_path) -> None:
    head = DraftHead.for_target(target, torch.arange(20), fused_layers=(3,))
    save_head(
        head, tmp_path, {"target": {"name": "tiny", "fingerprint": target_fingerprint(target)}}
    )
    shallow = tiny_llama(32, seed=4, num_layers=2)
    with pytest.raises(HeadLoadError, match="does not fit this target"):
        load_head(tmp_path, shallow, check_fingerprint=False)
    with pytest.raises(ValueError, match="from 1 to 3"):
        HeadConfig.for_target(target, 20, fused_layers=(4,))
    with pytest.raises(ValueError, match="increasing order"):
        HeadConfig.for_target(target, 20, fused_layers=(2, 1))


def test_distill_reads_fuse_layers_and_refuses_a_bad_list(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    args = parser.parse_args(
        ["--out", str(tmp_path), "--fuse-layers", "2,15", "--head-layers", "2"]
    )
    options = options_from_args(args, tmp_path)
    assert options.train.fused_layers == (2, 15) and options.train.layers == 2
    assert (
        options_from_args(
            parser.parse_args(["--out", "x", "--fuse-layers", "none"]), tmp_path
        ).train.fused_layers
        == ()
    )
    with pytest.raises(argparse.ArgumentError, match="numbers separated by commas"):
        parser.parse_args(["--out", "x", "--fuse-layers", "two"])
    with pytest.raises(ValueError, match="--head-layers must be at least 1"):
        options_from_args(parser.parse_args(["--out", "x", "--head-layers", "0"]), tmp_path)
