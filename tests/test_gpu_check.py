"""`scripts/gpu_check.py` in its CPU mode (tiny shapes), so that the GPU check
cannot rot between the sessions that are lent a GPU: every part runs, the
runs it compares give the same tokens in float32, the oracle's drafts are all
accepted, and a run that parts from the reference is located and priced."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from specrepl.engine.generation import autoregressive_generate
from specrepl.engine.runtime import TorchModel

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


@pytest.fixture(scope="module")
def report(gpu_check, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "check.json"
    assert gpu_check.main(["--cpu", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_part_runs_on_the_cpu(report: dict, gpu_check) -> None:
    parts = report["parts"]
    shapes = list(gpu_check.CPU_SHAPES)
    expected = {"cuda_tests", "model_drafter", "static_drafter"} | {
        f"{part}/{shape}"
        for part in ("pass_widths", "target_alone", "oracle", "static_compiled", "static_runtime")
        for shape in shapes
    }
    assert set(parts) == expected
    assert not [name for name, part in parts.items() if "failed" in part]
    assert "skipped" in parts["cuda_tests"]
    assert report["mode"].startswith("cpu")
    assert report["machine"]["cpu"]
    for shape in shapes:
        widths = parts[f"pass_widths/{shape}"]["ms_by_width"]
        assert sorted(map(int, widths)) == list(range(1, 18))
        assert all(value > 0 for value in widths.values())


def test_the_compared_runs_give_the_same_tokens(report: dict, gpu_check) -> None:
    for shape in gpu_check.CPU_SHAPES:
        alone = report["parts"][f"target_alone/{shape}"]
        assert alone["same_tokens_as_generate"]
        assert len(alone["tokens"]) == alone["new_tokens"]
        assert report["parts"][f"static_compiled/{shape}"]["same_tokens_as_specrepl_target"]
        for gamma, row in report["parts"][f"oracle/{shape}"]["by_gamma"].items():
            if gamma.isdigit():
                assert row["same_text"] and row["acceptance"] == 1.0, (shape, gamma)
                assert row["first_difference"] is None
                assert row["tokens_per_step"] > 1.0
    drafted = report["parts"]["model_drafter"]
    assert drafted["same_text_as_target"]
    assert drafted["drafted"] > 0 and drafted["ms_per_draft"] > 0
    on_static = report["parts"]["static_drafter"]
    assert on_static["same_text_as_static_target"]
    assert on_static["drafted"] > 0 and on_static["draft_cost_over_target_step"] > 0


def test_a_run_that_parts_is_located_and_priced(gpu_check) -> None:
    model = gpu_check.build_llama(
        gpu_check.CPU_SHAPES["tiny-draft"], torch.device("cpu"), torch.float32, seed=0
    )
    prompt = [5, 6, 7]
    reference = autoregressive_generate(prompt, TorchModel(model), max_gen_len=8).token_ids
    wrong = [*reference[:3], (reference[3] + 1) % 512, *reference[4:]]
    found = gpu_check.first_difference(model, prompt, reference, wrong)
    assert found["position"] == 3
    assert found["reference_is_argmax"]
    assert found["reference_minus_run_logit"] > 0
    assert gpu_check.first_difference(model, prompt, reference, reference) is None


def test_only_the_asked_parts_run_and_unknown_parts_are_refused(gpu_check, tmp_path) -> None:
    out = tmp_path / "some.json"
    assert (
        gpu_check.main(["--cpu", "--out", str(out), "--parts", "oracle", "--new-tokens", "6"]) == 0
    )
    assert {name.split("/")[0] for name in json.loads(out.read_text())["parts"]} == {"oracle"}
    with pytest.raises(SystemExit):
        gpu_check.main(["--cpu", "--out", str(out), "--parts", "oracle,warp"])
