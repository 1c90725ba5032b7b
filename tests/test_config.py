"""Config files: the shipped ones parse, and every kind of mistake names file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from specrepl.config import (
    ConfigError,
    ModelSpec,
    default_config_path,
    load_config,
)
from specrepl.settings import Settings

CONFIGS = default_config_path().parent
PRESETS = {
    "llama-3.2-3b-1b.toml": (
        "meta-llama/Llama-3.2-3B-Instruct",
        "meta-llama/Llama-3.2-1B-Instruct",
    ),
    "qwen2.5-7b-0.5b.toml": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    "smollm2-1.7b-135m.toml": (
        "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    return path


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_default_config_is_the_embedded_pair() -> None:
    config = load_config(default_config_path())
    assert config.path == default_config_path()
    assert config.target == ModelSpec("embedded")
    assert config.drafter == ModelSpec("embedded", dtype="bfloat16")
    assert config.device == "auto"
    assert config.trust_remote_code is False
    assert config.settings == Settings().updated(
        gamma=4, processor="greedy", max_new_tokens=128, chat=True
    )


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_parses(name: str) -> None:
    config = load_config(CONFIGS / name)
    target, drafter = PRESETS[name]
    assert config.target.source == target
    assert config.drafter is not None and config.drafter.source == drafter
    assert config.trust_remote_code is False


def test_minimal_config_has_no_drafter_and_default_settings(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[target]\nsource = "embedded"\n'))
    assert config.drafter is None
    assert config.settings == Settings()
    assert config.target.quantize is None


def test_quantize_and_relative_sources(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            '[target]\nsource = "./models/big"\nquantize = "4bit"\n'
            '[drafter]\nsource = "org/name"\nquantize = "8bit"\ndtype = "bf16"\n',
        )
    )
    assert config.target == ModelSpec(str((tmp_path / "models" / "big").resolve()), quantize="4bit")
    assert config.drafter == ModelSpec("org/name", dtype="bf16", quantize="8bit")


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.toml", "no such config file")


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    expect_error(write(tmp_path, '[target]\nsource = "embedded"\ngamma 4\n'), "line 3")


def test_unknown_key_suggests_the_nearest(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[generation]\ngama = 4\n')
    expect_error(path, "generation.gama", "'gamma'")


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'devices = "cpu"\n[target]\nsource = "x"\n')
    expect_error(path, "devices", "'device'")


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, 'trust_remote_code = "yes"\n[target]\nsource = "embedded"\n')
    expect_error(path, "trust_remote_code", "true or false")


def test_wrong_type_in_generation(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[generation]\nchat = "yes"\n')
    expect_error(path, "generation.chat", "on or off")


def test_impossible_value_names_the_range(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[generation]\ngamma = 0\n')
    expect_error(path, "generation.gamma", ">= 1", "<= 64")


def test_bad_dtype_quantize_and_device(tmp_path: Path) -> None:
    expect_error(
        write(tmp_path, '[target]\nsource = "embedded"\ndtype = "int8"\n'),
        "target.dtype",
        "bfloat16",
    )
    expect_error(
        write(tmp_path, '[target]\nsource = "e"\n[drafter]\nsource = "x"\nquantize = "2bit"\n'),
        "drafter.quantize",
        "8bit",
    )
    expect_error(
        write(tmp_path, 'device = "tpu"\n[target]\nsource = "embedded"\n'), "device", "cuda"
    )


def test_missing_target_or_source(tmp_path: Path) -> None:
    expect_error(write(tmp_path, "[generation]\ngamma = 4\n"), "target")
    expect_error(write(tmp_path, '[target]\ndtype = "auto"\n'), "target.source")


def test_table_expected(tmp_path: Path) -> None:
    expect_error(write(tmp_path, 'target = "embedded"\n'), "target", "table")


def test_unknown_drafter_kind(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[drafter]\nkind = "banana"\n')
    expect_error(path, "drafter.kind", "'model', 'ngram', 'lookup'")


def test_ngram_and_lookup_drafters_need_no_model(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[drafter]\nkind = "ngram"\norder = 5\n')
    config = load_config(path)
    assert config.drafter is None
    assert config.settings.drafter_kind == "ngram" and config.settings.ngram_order == 5
    path = write(
        tmp_path, '[target]\nsource = "embedded"\n[drafter]\nkind = "lookup"\nmax_ngram = 2\n'
    )
    assert load_config(path).settings.lookup_max_ngram == 2


def test_drafter_setting_out_of_range(tmp_path: Path) -> None:
    path = write(tmp_path, '[target]\nsource = "embedded"\n[drafter]\nkind = "ngram"\norder = 1\n')
    expect_error(path, "drafter.order", ">= 2")


def test_every_shipped_config_parses() -> None:
    configs = sorted((Path(__file__).parent.parent / "configs").glob("*.toml"))
    assert len(configs) >= 5
    for path in configs:
        load_config(path)


def test_model_spec_validates_itself() -> None:
    assert ModelSpec("x", quantize="none").quantize is None
    with pytest.raises(ValueError, match="dtype"):
        ModelSpec("x", dtype="int4")
    with pytest.raises(ValueError, match="quantize"):
        ModelSpec("x", quantize="3bit")
    with pytest.raises(ValueError, match="source"):
        ModelSpec(" ")
