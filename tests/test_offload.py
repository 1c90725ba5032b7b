"""Targets split or offloaded through transformers and accelerate (`device_map`,
`max_memory`, `offload_folder`): the same tokens as the resident target, and
every refusal said in words before any weight is loaded.

The models are tiny Llamas saved as directories here; a cap of a few hundred
kilobytes puts most of their layers on disk, as a cap of a few hundred
megabytes does to the embedded model.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

from specrepl.app.render.models import models_table
from specrepl.chat.config import ConfigError, load_config
from specrepl.chat.draft_choice import choice_key
from specrepl.chat.flags import add_model_options, app_config
from specrepl.chat.session import ChatSession
from specrepl.chat.settings import Settings
from specrepl.engine.drafters.model import ModelDrafter
from specrepl.engine.generation import autoregressive_generate, speculative_generate
from specrepl.engine.llamacpp import LlamaCppUnavailable
from specrepl.engine.placement import describe_placement, run_devices
from specrepl.engine.target_choice import choose_target_runtime
from specrepl.models import loading
from specrepl.models.errors import ModelLoadError
from specrepl.models.loading import load_pair
from specrepl.models.specs import ModelSpec
from specrepl.models.width_plans import tune_pair_widths
from specrepl.testing import perturbed_copy, tiny_llama, tiny_tokenizer

PROMPTS = ([1, 2, 9, 10, 11], [2, 5, 6, 7, 8, 20, 21, 22], [1, 30, 12])
DISK_CAP = "cpu=200000"
"""Room for the tiny target's embeddings only: every layer after them goes to disk."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny target (four layers) and a drafter that often agrees with it, as directories."""
    root = tmp_path_factory.mktemp("offload-models")
    target = tiny_llama(32, seed=4, hidden_size=64, num_layers=4)
    paths = {"target": root / "target", "drafter": root / "drafter"}
    target.save_pretrained(paths["target"])
    perturbed_copy(target, 0.05, seed=2).save_pretrained(paths["drafter"])
    for path in paths.values():
        tiny_tokenizer(32).save_pretrained(path)
    return paths


@pytest.fixture(scope="module")
def resident(saved: dict[str, Path]) -> Any:
    return load_pair(str(saved["target"]), str(saved["drafter"]))


def _greedy(model: Any, prompt: list[int]) -> list[int]:
    return autoregressive_generate(prompt, model, max_gen_len=40).token_ids


def test_the_models_table_says_where_each_part_lives(saved: dict[str, Path]) -> None:
    pair = load_pair(ModelSpec(str(saved["target"]), max_memory=DISK_CAP), str(saved["drafter"]))
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(models_table(pair))
    shown = console.export_text()
    assert shown.count("placed: model.embed_tokens") == 1 and "disk" in shown


def test_a_target_capped_to_disk_decodes_as_the_resident_one(
    saved: dict[str, Path], resident: Any, tmp_path: Path
) -> None:
    spec = ModelSpec(str(saved["target"]), max_memory=DISK_CAP, offload_folder=str(tmp_path))
    pair = load_pair(spec, str(saved["drafter"]))
    target = pair.target
    assert target.offloaded and target.placement is not None
    assert target.placement["model.embed_tokens"] == "cpu"
    assert "disk" in target.placement.values()
    assert target.device == torch.device("cpu")
    assert run_devices(target.model) == (torch.device("cpu"),)
    assert "disk" in target.describe()
    for prompt in PROMPTS:
        assert _greedy(target.model, prompt) == _greedy(resident.target.model, prompt)


def test_a_device_map_that_splits_the_layers_decodes_as_the_resident_one(
    saved: dict[str, Path], resident: Any, tmp_path: Path
) -> None:
    modules = "model.embed_tokens=cpu,model.layers.0=cpu,model.layers.1=disk,model.layers.2=cpu"
    rest = ",model.layers.3=disk,model.norm=cpu,model.rotary_emb=cpu,lm_head=disk"
    spec = ModelSpec(str(saved["target"]), device_map=modules + rest, offload_folder=str(tmp_path))
    pair = load_pair(spec, str(saved["drafter"]))
    assert pair.target.placement is not None
    assert pair.target.placement["model.layers.1"] == "disk"
    assert pair.target.placement["model.layers.2"] == "cpu"
    for prompt in PROMPTS:
        assert _greedy(pair.target.model, prompt) == _greedy(resident.target.model, prompt)


@pytest.mark.parametrize("gamma", [1, 4, 16])
def test_speculative_greedy_over_an_offloaded_target_equals_its_greedy(
    saved: dict[str, Path], resident: Any, gamma: int
) -> None:
    pair = load_pair(ModelSpec(str(saved["target"]), max_memory=DISK_CAP), str(saved["drafter"]))
    assert pair.drafter is not None and not pair.drafter.offloaded
    for prompt in PROMPTS:
        expected = _greedy(resident.target.model, prompt)
        result = speculative_generate(
            prompt, pair.drafter.model, pair.target.model, gamma=gamma, max_gen_len=40
        )
        assert result.token_ids == expected
        assert result.accepted > 0


def test_a_copy_of_an_offloaded_target_takes_its_keys_and_values(
    saved: dict[str, Path], resident: Any
) -> None:
    """The copy is recognised from the offloaded weights (read module by module)."""
    target = ModelSpec(str(saved["target"]), max_memory=DISK_CAP)
    pair = load_pair(target, ModelSpec(str(saved["target"]), dtype="bfloat16"))
    assert pair.drafter_is_copy
    for prompt in PROMPTS:
        drafter = ModelDrafter(pair.drafter.model, copy_of_target=True)
        result = speculative_generate(prompt, drafter, pair.target.model, gamma=4, max_gen_len=40)
        assert result.token_ids == _greedy(resident.target.model, prompt)
        assert result.imported_tokens > 0


def test_a_chat_over_an_offloaded_target_answers_as_over_the_resident_one(
    saved: dict[str, Path], resident: Any
) -> None:
    """The REPL's session, warm-up included, over two turns that keep the caches."""
    placed = load_pair(ModelSpec(str(saved["target"]), max_memory=DISK_CAP), str(saved["drafter"]))
    answers: dict[str, list[list[int]]] = {}
    for name, pair in (("resident", resident), ("offloaded", placed)):
        session = ChatSession(pair, Settings(max_new_tokens=12, drafter_kind="model"))
        session.warm_up()
        answers[name] = []
        for prompt in ("w7 w8 w9", "w10 w11 w12 w13"):
            answer = session.answer(prompt)
            speculative = answer.runs["speculative"].result.token_ids
            assert speculative == answer.runs["target"].result.token_ids
            answers[name].append(speculative)
        if name == "offloaded":
            assert "device map" in (session.target.summary(session.settings) or "")
    assert answers["offloaded"] == answers["resident"]


def test_a_draft_source_chosen_for_the_resident_target_is_not_taken_for_an_offloaded_one(
    saved: dict[str, Path], resident: Any, tmp_path: Path
) -> None:
    placed = load_pair(ModelSpec(str(saved["target"]), max_memory=DISK_CAP), str(saved["drafter"]))
    keys = {choice_key(pair, Settings(), tmp_path, "torch") for pair in (resident, placed)}
    assert len(keys) == 2


def test_an_offloaded_target_is_not_tuned_and_runs_in_torch(saved: dict[str, Path]) -> None:
    pair = load_pair(ModelSpec(str(saved["target"]), max_memory=DISK_CAP), str(saved["drafter"]))
    plans = tune_pair_widths(pair, 4)
    assert "target" not in plans and "drafter" in plans
    assert pair.target.tuning.plan is None and not pair.target.tuning.linear_forms
    choice = choose_target_runtime(
        "auto", pair.target.model, pair.target.tuning, None, context_length=256
    )
    assert choice.runtime == "torch" and "device map" in choice.reason
    with pytest.raises(LlamaCppUnavailable, match="loads the whole file"):
        choose_target_runtime(
            "llamacpp", pair.target.model, pair.target.tuning, None, context_length=256
        )


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every model transformers is asked to load (the call goes through)."""
    calls: list[str] = []
    real = loading.AutoModelForCausalLM.from_pretrained

    def counted(files: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(str(files))
        return real(files, *args, **kwargs)

    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", counted)
    return calls


def test_a_cap_too_small_for_the_first_layer_is_refused_before_loading(
    saved: dict[str, Path], loads: list[str]
) -> None:
    with pytest.raises(ModelLoadError, match=r"no room for the target's first layer"):
        load_pair(ModelSpec(str(saved["target"]), max_memory="cpu=10KB"), str(saved["drafter"]))
    assert loads == []


def test_a_cap_too_small_for_the_drafter_is_refused_before_loading_it(
    saved: dict[str, Path], loads: list[str]
) -> None:
    with pytest.raises(ModelLoadError, match=r"the drafter does not fit whole on one device"):
        load_pair(str(saved["target"]), ModelSpec(str(saved["drafter"]), max_memory=DISK_CAP))
    assert loads == [str(saved["target"])]  # the target alone, once


def test_an_offload_folder_that_cannot_be_written_is_refused(
    saved: dict[str, Path], loads: list[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    spec = ModelSpec(str(saved["target"]), max_memory=DISK_CAP, offload_folder=str(blocker / "x"))
    with pytest.raises(ModelLoadError, match=r"offload folder .* cannot be written"):
        load_pair(spec, str(saved["drafter"]))
    assert loads == []


@pytest.mark.skipif(torch.cuda.device_count() > 3, reason="this machine has a cuda:3")
@pytest.mark.parametrize(
    "placing",
    [
        {"device_map": "cuda:3"},
        {"max_memory": "cuda:3=1GB,cpu=1GB"},
        {"device_map": "lm_head=cuda:3,=cpu"},
    ],
)
def test_a_device_this_machine_lacks_is_refused(
    saved: dict[str, Path], loads: list[str], placing: dict[str, str]
) -> None:
    with pytest.raises(ModelLoadError, match=r"names cuda:3"):
        load_pair(ModelSpec(str(saved["target"]), **placing), str(saved["drafter"]))
    assert loads == []


def test_a_module_map_that_leaves_a_weight_out_is_refused(
    saved: dict[str, Path], loads: list[str]
) -> None:
    with pytest.raises(ModelLoadError, match=r"gives lm_head.weight no device"):
        load_pair(ModelSpec(str(saved["target"]), device_map="model=cpu"), str(saved["drafter"]))
    assert loads == []


def test_config_keys_and_flags_name_each_model_s_placement(tmp_path: Path) -> None:
    config = tmp_path / "placed.toml"
    config.write_text(
        '[target]\nsource = "embedded"\nmax_memory = { cpu = "200MB" }\n'
        'offload_folder = "./offload"\n'
        '[drafter]\nkind = "model"\nsource = "embedded"\ndevice_map = "cpu"\n',
        encoding="utf-8",
    )
    loaded = load_config(config)
    assert loaded.target.device_map == "auto"
    assert loaded.target.max_memory == (("cpu", 200_000_000),)
    assert loaded.target.offload_folder == str((tmp_path / "offload").resolve())
    assert loaded.drafter is not None and loaded.drafter.device_map == (("", "cpu"),)
    parser = argparse.ArgumentParser()
    add_model_options(parser)
    args = parser.parse_args(
        ["--config", str(config), "--max-memory", "cpu=1GiB", "--drafter-device-map", "auto"]
    )
    flagged = app_config(args)
    assert flagged.target.max_memory == (("cpu", 2**30),)
    assert flagged.drafter is not None and flagged.drafter.device_map == "auto"
    with pytest.raises(ValueError, match=r"--max-memory: expected a device"):
        app_config(parser.parse_args(["--config", str(config), "--max-memory", "tpu=1GB"]))


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('max_memory = { cpu = "lots" }', r"target.max_memory: expected a memory size"),
        ('device_map = "gpu"', r"target.device_map: a device map is one of auto"),
        ('device_map = { lm_head = "disk" }', r"not all on disk"),
        ('offload_folder = ""', r"target.offload_folder: expected a non-empty path"),
        ('quantize = "4bit"\nmax_memory = "cpu=1GB"', r"not supported"),
    ],
)
def test_a_bad_placement_in_a_config_is_refused_naming_the_key(
    tmp_path: Path, line: str, said: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'[target]\nsource = "embedded"\n{line}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=said):
        load_config(config)


def test_the_placement_is_described_in_ranges() -> None:
    placed = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.layers.2": "disk",
        "model.layers.3": "disk",
        "model.norm": "disk",
        "lm_head": "disk",
    }
    assert describe_placement(placed) == (
        "model.embed_tokens, model.layers.0-1 cpu · model.layers.2-3, model.norm, lm_head disk"
    )
