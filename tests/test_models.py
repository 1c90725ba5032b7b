"""Loading model pairs: devices, dtypes, end tokens, local directories, GGUF cache, errors,
and a released model loaded again.

Tests marked `embedded` load the real SmolLM2-135M pair offline (one GGUF
conversion per session, ~20 s, shared through `embedded_cache_dir`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
import torch
import transformers.dynamic_module_utils
from tokenizers import AddedToken
from transformers import GenerationConfig

from specrepl.engine.copy_attention import ATTENTION
from specrepl.engine.width_plan import WidthPlan
from specrepl.models import embedded
from specrepl.models import gguf as gguf_cache
from specrepl.models.compatibility import IncompatibleTokenizersError
from specrepl.models.devices import resolve_device, resolve_dtype
from specrepl.models.errors import ModelLoadError
from specrepl.models.loaded import LoadedModel
from specrepl.models.loading import load_pair
from specrepl.models.pair import ModelPair, find_end_tokens
from specrepl.models.specs import ModelSpec
from specrepl.models.tuning import allow_linear_forms, attend_in_cache_dtype
from specrepl.store import paths
from specrepl.testing import tiny_llama, tiny_tokenizer, visible_state

IM_END = 3  # id of <|im_end|> in specrepl.testing.tiny_tokenizer


def save_tiny(
    directory: Path, vocab_size: int = 32, *, seed: int = 0, tokenizer: bool = True
) -> Path:
    tiny_llama(vocab_size, seed=seed).save_pretrained(directory)
    if tokenizer:
        tiny_tokenizer(vocab_size).save_pretrained(directory)
    return directory


# -- ModelPair.from_models ---------------------------------------------------------------


def test_from_models_wraps_a_checked_pair() -> None:
    target, drafter = tiny_llama(32, seed=0), tiny_llama(40, seed=1).train()
    pair = ModelPair.from_models(target, drafter, tiny_tokenizer(32), drafter_name="small")
    assert pair.vocab_size == 32
    assert pair.eos_token_ids == [IM_END]
    assert pair.context_length == 256
    assert pair.device == torch.device("cpu")
    assert pair.drafter is not None and pair.drafter.name == "small"
    assert not pair.drafter.model.training
    assert pair.target.parameters == sum(p.numel() for p in target.parameters())
    assert pair.target.memory_bytes > 0 and pair.target.quantization is None
    line = pair.target.describe()
    assert "target" in line and "float32" in line and "K params" in line and "KiB" in line


def test_a_drafter_that_is_a_copy_of_the_target_is_named_so() -> None:
    from rich.console import Console

    from specrepl.app.render.repl import Renderer

    target = tiny_llama(32, seed=0)
    copy = tiny_llama(32, seed=0).to(torch.bfloat16)
    pair = ModelPair.from_models(target, copy, tiny_tokenizer(32))
    assert pair.drafter_is_copy
    assert not ModelPair.from_models(
        target, tiny_llama(32, seed=1), tiny_tokenizer(32)
    ).drafter_is_copy
    console = Console(record=True, width=200)
    Renderer(console).loaded(pair)
    assert "a copy of the target: takes its keys and values" in console.export_text()
    # once the runtime is chosen (at warm-up), the table says what drafts instead
    console = Console(record=True, width=200)
    Renderer(console).loaded(pair, None, "llama.cpp: a step costs 0.2 of torch's, measured")
    text = console.export_text()
    assert "drafts in llama.cpp: a step costs 0.2" in text and "takes its keys" not in text


def test_from_models_without_a_drafter() -> None:
    pair = ModelPair.from_models(tiny_llama(32), None, tiny_tokenizer(32))
    assert pair.drafter is None and pair.vocab_size == 32


def test_from_models_refuses_a_vocabulary_that_cannot_write_the_targets_text() -> None:
    with pytest.raises(IncompatibleTokenizersError, match="writes back only"):
        ModelPair.from_models(
            tiny_llama(32),
            tiny_llama(32, seed=1),
            tiny_tokenizer(32),
            drafter_tokenizer=tiny_tokenizer(32, word_prefix="v"),
        )


def test_from_models_refuses_logits_narrower_than_the_tokenizer() -> None:
    with pytest.raises(IncompatibleTokenizersError, match="24"):
        ModelPair.from_models(tiny_llama(32), tiny_llama(24), tiny_tokenizer(32))


def test_context_length_defaults_when_the_config_has_none() -> None:
    model = tiny_llama(32)
    del model.config.max_position_embeddings
    assert ModelPair.from_models(model, None, tiny_tokenizer(32)).context_length == 2048


# -- find_end_tokens ----------------------------------------------------------------------


def test_end_tokens_of_the_tiny_tokenizer() -> None:
    assert find_end_tokens(tiny_tokenizer(32)) == [IM_END]


def test_end_tokens_union_with_the_generation_config() -> None:
    tokenizer = tiny_tokenizer(32)
    assert find_end_tokens(tokenizer, GenerationConfig(eos_token_id=[IM_END, 9])) == [IM_END, 9]
    assert find_end_tokens(tokenizer, GenerationConfig(eos_token_id=5)) == [IM_END, 5]


def test_end_of_turn_token_is_found_from_the_chat_template() -> None:
    tokenizer = tiny_tokenizer(32)
    tokenizer.add_tokens([AddedToken("<|eot|>", special=True)])
    tokenizer.eos_token = "<s>"
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|eot|> "
        "{% endfor %}"
    )
    assert find_end_tokens(tokenizer) == [1, tokenizer.convert_tokens_to_ids("<|eot|>")]


def test_end_tokens_without_or_with_a_broken_chat_template() -> None:
    tokenizer = tiny_tokenizer(32)
    tokenizer.eos_token = "<s>"
    tokenizer.chat_template = None
    assert find_end_tokens(tokenizer) == [1]
    tokenizer.chat_template = "{{ raise_exception('no assistant turns') }}"
    assert find_end_tokens(tokenizer) == [1]


# -- devices and dtypes -------------------------------------------------------------------


def test_resolve_device() -> None:
    assert resolve_device("auto").type in {"cpu", "cuda", "mps"}
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    for name in ("banana", "meta", "cuda:99"):
        with pytest.raises(ModelLoadError, match=repr(name)):
            resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_resolve_device_cuda_without_cuda() -> None:
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        resolve_device("cuda")


def test_resolve_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("bf16", cpu) == resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("fp16", cpu) == resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype("fp32", cpu) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="bfloat16"):
        resolve_dtype("int8", cpu)


# -- local directories --------------------------------------------------------------------


def test_load_pair_from_directories(tmp_path: Path) -> None:
    target = save_tiny(tmp_path / "target")
    drafter = save_tiny(tmp_path / "drafter", 40, seed=1, tokenizer=False)
    messages: list[str] = []
    pair = load_pair(
        str(target), ModelSpec(str(drafter), dtype="bfloat16"), progress=messages.append
    )
    assert pair.drafter is not None and pair.drafter.dtype == torch.bfloat16
    assert pair.target.kind == pair.drafter.kind == "directory"
    assert pair.target.dtype == torch.float32 and not pair.target.model.training
    assert pair.vocab_size == 32 and pair.eos_token_ids == [IM_END]
    assert pair.device == torch.device("cpu") == pair.target.device
    assert any(m.startswith("loading target") for m in messages)
    assert any(m.startswith("loading drafter") for m in messages)


def test_identical_specs_share_one_model(tmp_path: Path) -> None:
    target = str(save_tiny(tmp_path / "target"))
    pair = load_pair(target, target)
    assert pair.drafter is pair.target


def test_drafter_directory_whose_vocabulary_cannot_write_the_targets_is_refused(
    tmp_path: Path,
) -> None:
    target = save_tiny(tmp_path / "target")
    other = save_tiny(tmp_path / "other", tokenizer=False)
    tiny_tokenizer(32, word_prefix="v").save_pretrained(other)  # none of the target's words
    with pytest.raises(IncompatibleTokenizersError, match=r"writes back only \d+%"):
        load_pair(str(target), str(other))


def test_drafter_directory_with_a_longer_vocabulary_drafts_by_ids(tmp_path: Path) -> None:
    """Every target token is among the drafter's 40: drafts are mapped id by id."""
    target = save_tiny(tmp_path / "target")
    other = save_tiny(tmp_path / "other", 40)
    pair = load_pair(str(target), str(other))
    assert pair.vocabulary is not None and pair.vocabulary.kind == "ids"
    assert pair.vocab_size == 32 and pair.translation is not None


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_bitsandbytes_quantized_drafter(tmp_path: Path, bits: str) -> None:
    pytest.importorskip("bitsandbytes")
    directory = str(save_tiny(tmp_path / "model"))
    pair = load_pair(directory, ModelSpec(directory, quantize=bits))
    assert pair.drafter is not None and pair.drafter.quantization == bits
    assert pair.drafter.parameters == pair.target.parameters
    assert bits in pair.drafter.describe()
    logits = pair.drafter.model(torch.tensor([[1, 7, 9]])).logits
    assert logits.shape == (1, 3, 32)


def test_target_directory_without_a_tokenizer(tmp_path: Path) -> None:
    directory = save_tiny(tmp_path / "model", tokenizer=False)
    with pytest.raises(ModelLoadError, match="no tokenizer"):
        load_pair(str(directory))


def test_remote_code_needs_the_flag(tmp_path: Path) -> None:
    directory = save_tiny(tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "specrepl-custom"  # unknown to transformers: only remote code has it
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModelForCausalLM": "modeling_custom.CustomModel",
    }
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="--trust-remote-code"):
        load_pair(str(directory))


# Repository code that leaves a mark when it runs: proof of whether it ran.
CUSTOM_MODEL_CODE = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM
class CustomConfig(LlamaConfig):
    model_type = "specrepl-custom"
class CustomModel(LlamaForCausalLM):
    config_class = CustomConfig
"""
CUSTOM_TOKENIZER_CODE = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PreTrainedTokenizerFast
class CustomTokenizer(PreTrainedTokenizerFast):
    pass
"""


@pytest.fixture
def modules_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """transformers' copy of repository code goes to tmp_path and is forgotten afterwards."""
    cache = tmp_path / "modules"
    monkeypatch.setattr(transformers.dynamic_module_utils, "HF_MODULES_CACHE", str(cache))
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [name for name in sys.modules if name.startswith("transformers_modules")]:
        monkeypatch.delitem(sys.modules, name)
    yield cache
    for name in [name for name in sys.modules if name.startswith("transformers_modules")]:
        del sys.modules[name]


def with_custom_code(directory: Path, part: str, *, model_type: str) -> Path:
    """Point the directory's model or tokenizer at code of its own; returns the marker path."""
    marker = directory.parent / f"{part}-code-ran"
    if part == "model":
        (directory / "modeling_custom.py").write_text(CUSTOM_MODEL_CODE.format(marker=str(marker)))
        (directory / "configuration_custom.py").write_text(
            CUSTOM_MODEL_CODE.format(marker=str(marker))
        )
        config = json.loads((directory / "config.json").read_text())
        config["model_type"] = model_type
        config["auto_map"] = {
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModelForCausalLM": "modeling_custom.CustomModel",
        }
        (directory / "config.json").write_text(json.dumps(config))
    else:
        code = CUSTOM_TOKENIZER_CODE.format(marker=str(marker))
        (directory / "tokenization_custom.py").write_text(code)
        config = json.loads((directory / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "CustomTokenizer"
        config["auto_map"] = {"AutoTokenizer": [None, "tokenization_custom.CustomTokenizer"]}
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return marker


@pytest.mark.parametrize("part", ["model", "tokenizer"])
def test_remote_code_is_refused_and_never_run(
    tmp_path: Path, modules_cache: Path, part: str
) -> None:
    directory = save_tiny(tmp_path / "custom")
    marker = with_custom_code(directory, part, model_type="specrepl-custom")
    with pytest.raises(ModelLoadError) as error:
        load_pair(str(directory))
    message = str(error.value)
    assert "--trust-remote-code" in message and "trust_remote_code = true" in message
    assert str(directory) in message and "\n" not in message
    assert not marker.exists()
    assert not list(modules_cache.rglob("*.py"))  # not even copied where it would be imported
    # the control: opted in, the same files do run, so the checks above can fail
    pair = load_pair(str(directory), trust_remote_code=True)
    assert marker.read_text() == "ran"
    assert type(pair.tokenizer if part == "tokenizer" else pair.target.model).__name__.startswith(
        "Custom"
    )


def test_a_known_architecture_ignores_the_repository_code(
    tmp_path: Path, modules_cache: Path
) -> None:
    """An auto_map next to a model type transformers knows: its own class, no remote code."""
    directory = save_tiny(tmp_path / "custom")
    marker = with_custom_code(directory, "model", model_type="llama")
    pair = load_pair(str(directory))
    assert type(pair.target.model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()


# -- releasing a model and loading it again ----------------------------------------------


def test_a_released_model_comes_back_with_the_same_weights_and_width_plan(tmp_path: Path) -> None:
    target = save_tiny(tmp_path / "target")
    drafter = save_tiny(tmp_path / "drafter", seed=1, tokenizer=False)
    loaded = load_pair(str(target), ModelSpec(str(drafter), dtype="bfloat16")).drafter
    assert loaded is not None and loaded.releasable and loaded.resident
    first = loaded.model
    ids = torch.tensor([[1, 7, 9, 12]])
    with torch.no_grad():
        expected = first(ids).logits
    weights = {name: tensor.clone() for name, tensor in first.state_dict().items()}
    as_loaded = visible_state(first)
    plan = WidthPlan({1: 1.0, 2: 3.0, 3: 2.0}, {1: 1, 2: 3, 3: 3}, frozenset({3}))
    allow_linear_forms(first, loaded.tuning)  # as if timed: pad 2 rows to 3, weight first at 3
    loaded.tuning.plan = plan
    assert attend_in_cache_dtype(first, loaded.tuning)
    gone = weakref.ref(first)
    del first
    assert loaded.release() and not loaded.resident
    assert gone() is None  # nothing else held it: out of memory
    assert loaded.tuning.plan == plan and loaded.reloads == 0
    assert loaded.release()  # released already: nothing to do
    again = loaded.model
    assert loaded.resident and loaded.reloads == 1 and loaded.model is again
    assert not again.training and again.dtype == torch.bfloat16
    assert loaded.tuning.plan == plan and loaded.tuning.weight_first == {3}
    assert loaded.tuning.linear_forms and loaded.tuning.attention == ATTENTION
    assert visible_state(again) == as_loaded  # the stock model, as loaded
    state = again.state_dict()
    assert state.keys() == weights.keys()
    assert all(torch.equal(state[name], tensor) for name, tensor in weights.items())
    with torch.no_grad():
        assert torch.equal(again(ids).logits, expected)


def test_a_released_model_still_held_elsewhere_is_taken_back_not_loaded_twice(
    tmp_path: Path,
) -> None:
    target = save_tiny(tmp_path / "target")
    drafter = save_tiny(tmp_path / "drafter", seed=1, tokenizer=False)
    loaded = load_pair(str(target), str(drafter)).drafter
    assert loaded is not None
    kept = loaded.model  # as a drafter built on it, in another session, holds it
    assert loaded.release() and not loaded.resident
    assert loaded.model is kept and loaded.resident and loaded.reloads == 0
    del kept
    assert loaded.release()
    assert loaded.model is not None and loaded.reloads == 1  # nothing held it: loaded again


def test_a_released_model_whose_files_are_gone_says_so(tmp_path: Path) -> None:
    target = save_tiny(tmp_path / "target")
    drafter = save_tiny(tmp_path / "drafter", seed=1, tokenizer=False)
    loaded = load_pair(str(target), str(drafter)).drafter
    assert loaded is not None and loaded.release()
    shutil.rmtree(drafter)
    with pytest.raises(ModelLoadError, match="drafter"):
        loaded.model  # noqa: B018
    assert not loaded.resident


def test_a_model_wrapped_in_memory_is_never_released() -> None:
    target, drafter = tiny_llama(32, seed=0), tiny_llama(32, seed=1)
    pair = ModelPair.from_models(target, drafter, tiny_tokenizer(32))
    assert pair.drafter is not None and not pair.drafter.releasable
    assert not pair.drafter.release()
    assert pair.drafter.resident and pair.drafter.model is drafter


# -- sources that cannot be loaded --------------------------------------------------------


def test_hub_id_offline_points_to_the_embedded_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as error:
        load_pair("specrepl-tests/no-such-model")
    message = str(error.value)
    assert "could not reach" in message and "--target embedded" in message
    assert "\n" not in message
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("https://huggingface.co/org/name", "is a URL: give a hub id (org/name), a model"),
        ("hf://org/name", "is a URL"),
        ("x" * 300, "cannot use 'xxxxxxxx"),
        ("~specrepl-no-such-user/model", "cannot use '~specrepl-no-such-user/model' as a"),
        ("bad id!", "could not load the target bad id!"),
        ("a/b/c", "no such model directory: a/b/c"),
    ],
)
def test_sources_that_are_no_model(source: str, expected: str) -> None:
    with pytest.raises(ModelLoadError) as error:
        load_pair(source)
    message = str(error.value)
    assert expected in message and "\n" not in message and len(message) < 300


def test_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        load_pair(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelLoadError, match="no such model directory"):
        load_pair(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_pair(str(tmp_path / "empty"))


def test_embedded_without_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "EMBEDDED_PACKAGE", "specrepl_no_such_package")
    with pytest.raises(ModelLoadError, match=re.escape(embedded.EMBEDDED_INSTALL)):
        load_pair("embedded")


def test_broken_gguf_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(ModelLoadError, match="could not convert"):
        load_pair(str(broken))
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []


# -- the GGUF cache -----------------------------------------------------------------------


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert paths.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("SPECREPL_CACHE_DIR")
    assert paths.cache_root() == tmp_path / "xdg" / "specrepl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert paths.cache_root() == Path.home() / ".cache" / "specrepl"


def test_fingerprint_follows_the_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"x" * 1000)
    b.write_bytes(b"x" * 1000)
    assert paths.fingerprint(a) == paths.fingerprint(b)
    b.write_bytes(b"x" * 999 + b"y")
    assert paths.fingerprint(a) != paths.fingerprint(b)


def test_interrupted_conversion_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(100))

    def interrupted(gguf_path: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_cache, "_convert", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gguf_cache.converted_copy(source)
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []

    def finished(gguf_path: Path, out: Path) -> None:
        _fake_conversion(out)

    monkeypatch.setattr(gguf_cache, "_convert", finished)
    told: list[str] = []
    first = gguf_cache.converted_copy(source, progress=told.append)
    again = gguf_cache.converted_copy(source, progress=told.append)
    assert not first.from_cache and again.from_cache
    assert first.directory == again.directory and len(told) == 1


def _fake_conversion(out: Path) -> None:
    """What a conversion leaves: weights, a config, and a marker listing them."""
    from safetensors.torch import save_file

    save_file({"weight": torch.arange(300, dtype=torch.float32)}, str(out / "model.safetensors"))
    (out / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")
    gguf_cache._write_marker(out, {"source": "model.gguf", "size": 104})


def _zero_tail(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-16:] = bytes(16)
    path.write_bytes(bytes(data))


def _old_marker(directory: Path) -> None:
    (directory / gguf_cache.MARKER).write_text('{"format": 1, "source": "model.gguf"}')


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "no readable header"),
        (
            lambda d: (d / "model.safetensors").write_bytes(
                (d / "model.safetensors").read_bytes()[:-100]
            ),
            "its header describes",
        ),
        (lambda d: _zero_tail(d / "model.safetensors"), "is not what was written"),
        (lambda d: (d / "config.json").write_text("{}"), "config.json is 2 bytes"),
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / gguf_cache.MARKER).write_text("{not json"), "not readable JSON"),
        (lambda d: (d / gguf_cache.MARKER).unlink(), "marker file is missing"),
    ],
    ids=[
        "zero-filled",
        "truncated",
        "tail-zeroed",
        "rewritten",
        "deleted",
        "bad-marker",
        "no-marker",
    ],
)
def test_a_damaged_copy_is_converted_again_with_a_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage, said: str
) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(100))
    conversions: list[Path] = []

    def convert(gguf_path: Path, out: Path) -> None:
        conversions.append(out)
        _fake_conversion(out)

    monkeypatch.setattr(gguf_cache, "_convert", convert)
    first = gguf_cache.converted_copy(source)
    assert gguf_cache.check_copy(first.directory) is None
    damage(first.directory)
    told: list[str] = []
    again = gguf_cache.converted_copy(source, progress=told.append)
    assert not again.from_cache and len(conversions) == 2
    assert len(told) == 1 and "is damaged" in told[0] and said in told[0], told
    assert str(first.directory) in told[0]
    assert gguf_cache.check_copy(again.directory) is None
    assert gguf_cache.converted_copy(source).from_cache  # whole again: no third conversion


def test_a_copy_from_before_the_file_list_is_checked_and_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setattr(gguf_cache, "_convert", lambda gguf_path, out: _fake_conversion(out))
    directory = gguf_cache.converted_copy(source).directory
    _old_marker(directory)
    assert gguf_cache.converted_copy(source).from_cache  # whole by its header: kept
    marker = json.loads((directory / gguf_cache.MARKER).read_text())
    assert set(marker["files"]) == {"config.json", "model.safetensors"}
    _old_marker(directory)
    (directory / "model.safetensors").write_bytes(b"cut")
    assert not gguf_cache.converted_copy(source).from_cache  # cut short: converted again


@pytest.mark.embedded
def test_a_damaged_embedded_copy_is_rebuilt_and_answers_as_before(
    embedded_pair: ModelPair, embedded_cache_dir: str, tmp_path: Path, monkeypatch
) -> None:
    import shutil

    from specrepl.engine.generation import autoregressive_generate

    cache = tmp_path / "cache"
    shutil.copytree(Path(embedded_cache_dir) / "gguf", cache / "gguf")
    monkeypatch.setenv("SPECREPL_CACHE_DIR", str(cache))
    (copy,) = (cache / "gguf").glob("SmolLM2-135M-Instruct.Q4_1-*")
    ids = embedded_pair.tokenizer("The capital of France is").input_ids
    expected = autoregressive_generate(ids, embedded_pair.target.model, max_gen_len=12)

    def answer(pair: ModelPair) -> list[int]:
        return autoregressive_generate(ids, pair.target.model, max_gen_len=12).token_ids

    # cut short, as by a full disk or a killed copy: the check sees it
    with (copy / "model.safetensors").open("r+b") as weights:
        weights.truncate(100 * 2**20)
    told: list[str] = []
    healed = load_pair("embedded", progress=told.append)
    assert any("is damaged" in line and "model.safetensors" in line for line in told), told
    assert answer(healed) == expected.token_ids
    del healed

    # whole by the check but not loadable: the load fails once and converts again
    (copy / "config.json").write_text('{"model_type": "no-such-architecture"}', encoding="utf-8")
    marker = json.loads((copy / gguf_cache.MARKER).read_text(encoding="utf-8"))
    gguf_cache._write_marker(copy, {k: marker[k] for k in ("source", "size")})
    told.clear()
    healed = load_pair("embedded", progress=told.append)
    assert any("does not load" in line for line in told), told
    assert answer(healed) == expected.token_ids
    assert gguf_cache.check_copy(copy) is None


# -- the embedded pair --------------------------------------------------------------------


@pytest.mark.embedded
def test_embedded_pair(embedded_pair: ModelPair, embedded_cache_dir: str) -> None:
    pair = embedded_pair
    assert len(pair.tokenizer) == pair.vocab_size == 49152
    assert 2 in pair.eos_token_ids
    assert pair.context_length == 8192
    assert pair.target.kind == "embedded" and pair.target.dtype == torch.float32
    assert pair.drafter is not None and pair.drafter.dtype == torch.bfloat16
    assert pair.drafter.from_cache  # the target's conversion served the drafter
    assert "134.5M params" in pair.target.describe()
    copies = list((Path(embedded_cache_dir) / "gguf").glob("SmolLM2-135M-Instruct.Q4_1-*"))
    assert len(copies) == 1  # converted once for both models
    ids = pair.tokenizer("Hello", return_tensors="pt").input_ids
    with torch.no_grad():
        assert pair.target.model(ids).logits.shape[-1] == 49152


@pytest.mark.embedded
def test_a_released_embedded_drafter_comes_back_from_the_converted_copy() -> None:
    pair = load_pair("embedded", ModelSpec("embedded", dtype="bfloat16"))  # its own: released
    drafter = pair.drafter
    assert drafter is not None and drafter.releasable and pair.drafter_is_copy
    ids = pair.tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = drafter.model(ids).logits
    assert drafter.release() and not drafter.resident
    start = time.perf_counter()
    again = drafter.model
    elapsed = time.perf_counter() - start
    assert drafter.reloads == 1 and again.dtype == torch.bfloat16
    assert elapsed < 5, f"loading the converted copy again took {elapsed:.1f} s"
    with torch.no_grad():
        assert torch.equal(again(ids).logits, expected)
    assert pair.drafter_is_copy  # as computed at load


@pytest.mark.embedded
def test_embedded_second_load_reads_the_cache(embedded_pair: ModelPair) -> None:
    assert os.environ.get("SPECREPL_CACHE_DIR")
    start = time.perf_counter()
    again = load_pair("embedded")
    elapsed = time.perf_counter() - start
    assert again.target.from_cache
    assert again.drafter is None
    assert elapsed < 5, f"a cached load took {elapsed:.1f} s"
    assert isinstance(again.target, LoadedModel)
