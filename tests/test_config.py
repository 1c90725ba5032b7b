"""Config files: the shipped ones parse, every kind of mistake names file and key,
and every setting is read under the names its declaration gives it."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from specrepl.chat.config import ConfigError, load_config
from specrepl.chat.settings import DRAFTER_SETTINGS, SETTING_NAMES, Settings
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.models.specs import ModelSpec
from specrepl.store.paths import default_config_path

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
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
        gamma=16,
        drafter_kind="hybrid",
        drafter_head="auto",
        processor="greedy",
        max_new_tokens=128,
        chat=True,
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
    configs = [default_config_path(), *sorted(CONFIGS.glob("*.toml"))]
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


TARGET = '[target]\nsource = "embedded"\n'
DRAFTER_KEYS = ("kind", "order", "keep", "filler", "max_ngram", "window", "head", "runtime")
"""The drafter's options as README documents them for [drafter] and /drafter_kind."""


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        # unknown keys, at the top and in each table
        (TARGET + 'sorce = "x"\n', "target.sorce", "did you mean 'source'?"),
        (TARGET + "[target.extra]\nx = 1\n", "target.extra", "known keys: source, dtype"),
        (TARGET + '[drafter]\nkind = "ngram"\nordr = 3\n', "drafter.ordr", "'order'"),
        (TARGET + "[generation]\ntemprature = 0.5\n", "generation.temprature", "'temperature'"),
        (TARGET + "[generation]\nfiller = 3\n", "generation.filler", "'ngram_filler'"),
        (TARGET + '[drafter]\nkind = "ngram"\nfiler = 3\n', "drafter.filer", "'filler'?"),
        (TARGET + "[drafter]\nngram_filler = 3\n", "drafter.ngram_filler", "'filler'?"),
        (
            TARGET + '[drafter]\nkind = "ngram"\ntop_k_filler = 0\n',
            "drafter.top_k_filler",  # an old spelling's mistake names the key as written
            "expected an integer >= 1 and <= 64, got 0",
        ),
        ("trust_remote = true\n" + TARGET, "trust_remote", "'trust_remote_code'"),
        # wrong types
        ("[target]\nsource = 5\n", "target.source", "expected a string, got 5"),
        (TARGET.replace('"embedded"', '["embedded"]'), "target.source", "expected a string"),
        (TARGET + "dtype = 16\n", "target.dtype", "expected a string, got 16"),
        ("device = 0\n" + TARGET, "device", "expected a string, got 0"),
        (TARGET + "[drafter]\nkind = 1\n", "drafter.kind", "expected a string, got 1"),
        (TARGET + '[drafter]\nkind = "ngram"\norder = "x"\n', "drafter.order", "an integer >= 2"),
        (
            TARGET + '[drafter]\nkind = "ngram"\nkeep_between_prompts = "yes"\n',
            "drafter.keep_between_prompts",
            "expected on or off, got 'yes'",
        ),
        ("generation = 5\n" + TARGET, "generation", "expected a table ([generation]), got 5"),
        (TARGET + '[generation]\ngamma = "4"\n', "generation.gamma", "an integer >= 1"),
        (TARGET + "[generation]\ngamma = true\n", "generation.gamma", "got True"),
        (TARGET + "[generation]\ngamma = 2.5\n", "generation.gamma", "got 2.5"),
        (TARGET + "[generation]\nseed = [1]\n", "generation.seed", "an integer >= 0"),
        (TARGET + '[generation]\ntemperature = "hot"\n', "generation.temperature", "a number > 0"),
        (TARGET + "[generation]\nsystem_prompt = 5\n", "generation.system_prompt", "text"),
        (TARGET + "[generation]\nchat = 1\n", "generation.chat", "expected on or off, got 1"),
        # impossible values
        (TARGET + "[generation]\ngamma = 65\n", "generation.gamma", "<= 64, got 65"),
        (TARGET + "[generation]\ntemperature = -1.0\n", "generation.temperature", "> 0 and"),
        (TARGET + "[generation]\ntemperature = 0\n", "generation.temperature", "> 0 and"),
        (TARGET + "[generation]\ntemperature = nan\n", "generation.temperature", "got nan"),
        (TARGET + "[generation]\ntemperature = inf\n", "generation.temperature", "got inf"),
        (
            TARGET + "[generation]\ntemperature = 1" + "0" * 400 + "\n",
            "generation.temperature",
            "got an integer of about 401 digits",
        ),
        (TARGET + "[generation]\ntop_p = 0.0\n", "generation.top_p", "a number > 0 and <= 1"),
        (TARGET + "[generation]\ntop_p = 1.5\n", "generation.top_p", "a number > 0 and <= 1"),
        (TARGET + "[generation]\ntop_k = 0\n", "generation.top_k", "an integer >= 1"),
        (TARGET + "[generation]\nmax_new_tokens = 0\n", "generation.max_new_tokens", ">= 1"),
        (TARGET + "[generation]\nseed = -1\n", "generation.seed", "an integer >= 0"),
        (TARGET + "[generation]\nconfidence = 1.0\n", "generation.confidence", "<= 0.99"),
        (TARGET + '[generation]\nprocessor = "beam"\n', "generation.processor", "one of greedy"),
        (
            TARGET + '[generation]\ngamma_policy = "sometimes"\n',
            "generation.gamma_policy",
            "one of fixed",
        ),
        (TARGET + '[drafter]\nkind = "lookup"\nmax_ngram = 0\n', "drafter.max_ngram", ">= 1"),
        (TARGET + '[drafter]\nkind = "Model"\n', "drafter.kind", "one of 'model'"),
        ('[target]\nsource = ""\n', "target.source", "a non-empty string, got ''"),
        ('[target]\nsource = "   "\n', "target.source", "a non-empty string"),
        (
            '[target]\nsource = "~specrepl-no-such-user/model"\n',
            "target.source",
            "a path this machine can resolve",
        ),
        ('device = "cuda:x"\n' + TARGET, "device", "one of auto, cpu, cuda, cuda:N, mps"),
        (TARGET + "[target.quantize]\nbits = 4\n", "target.quantize", "expected a string"),
        (
            TARGET + '[drafter]\nkind = "ngram"\ndtype = "int8"\n',
            "drafter.dtype",
            "no dtype without drafter.source",
        ),
        (
            TARGET + '[drafter]\nkind = "lookup"\nquantize = "4bit"\n',
            "drafter.quantize",
            "no quantize without drafter.source",
        ),
    ],
)
def test_every_mistake_names_file_key_and_expectation(
    tmp_path: Path, text: str, key: str, expected: str
) -> None:
    message = expect_error(write(tmp_path, text), f": {key}: ", expected)
    assert "\n" not in message and len(message) < len(str(tmp_path)) + 500


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('[target]\nsource = "embedded\n', "not valid TOML: Illegal character '\\n' (at line 2"),
        ('[target]\nsource = "a"\nsource = "b"\n', "not valid TOML: Cannot overwrite a value"),
        ("[target\n", "not valid TOML: Expected ']' at the end of a table declaration"),
        ("seed = " + "9" * 5000 + "\n", "not valid TOML: Exceeds the limit"),
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", "arrays or tables nested too deeply"),
        (b"\xff\xfe[target]\n", "cannot read the file"),
    ],
)
def test_unreadable_files_name_the_file_and_the_problem(
    tmp_path: Path, content: str | bytes, expected: str
) -> None:
    path = tmp_path / "bad.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    message = expect_error(path, expected)
    assert "\n" not in message and len(message) < len(str(path)) + 300


def test_a_directory_or_a_device_is_no_config(tmp_path: Path) -> None:
    expect_error(tmp_path, "is a directory, expected a .toml file")
    devnull = Path("/dev/null")
    if devnull.exists():  # read to the end it is empty; refused before that as no file
        expect_error(devnull, "not a regular file, expected a .toml file")


def toml_table(name: str, values: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(
        f"{key} = {json.dumps(value)}\n" for key, value in values.items()
    )


def test_every_setting_is_read_from_the_generation_table(
    tmp_path: Path, every_setting_changed: Settings
) -> None:
    text = TARGET + toml_table("generation", every_setting_changed.as_dict())
    assert load_config(write(tmp_path, text)).settings == every_setting_changed


def test_every_drafter_option_is_read_from_the_drafter_table_by_its_short_name(
    tmp_path: Path, every_setting_changed: Settings
) -> None:
    assert tuple(DRAFTER_SETTINGS) == DRAFTER_KEYS
    values = {name: getattr(every_setting_changed, s) for name, s in DRAFTER_SETTINGS.items()}
    settings = load_config(write(tmp_path, TARGET + toml_table("drafter", values))).settings
    assert {name: getattr(settings, s) for name, s in DRAFTER_SETTINGS.items()} == values


@pytest.mark.parametrize(
    ("old", "new", "value"), [("top_k_filler", "filler", 4), ("keep_between_prompts", "keep", True)]
)
def test_old_drafter_keys_still_give_the_same_setting(
    tmp_path: Path, old: str, new: str, value: Any
) -> None:
    def settings(**drafter: Any) -> Settings:
        text = TARGET + toml_table("drafter", {"kind": "ngram", **drafter})
        return load_config(write(tmp_path, text)).settings

    assert settings(**{old: value}) == settings(**{new: value}) != settings()
    with pytest.raises(ConfigError, match=f"drafter.{old}: expected one of {new} and {old}, not"):
        settings(**{new: value, old: value})


def test_drafter_options_are_the_drafter_settings_under_their_short_names(
    every_setting_changed: Settings,
) -> None:
    assert every_setting_changed.drafter_options() == DrafterOptions(
        kind="ngram",
        order=5,
        keep=True,
        filler=4,
        max_ngram=2,
        window=16,
        head="embedded",
        runtime="torch",
    )
    assert set(DRAFTER_SETTINGS) <= {field.name for field in fields(DrafterOptions)}


def test_each_setting_has_one_name_that_its_flag_and_drafter_name_are_made_of() -> None:
    """A flag is the setting's name with dashes (a switch that turns a setting off:
    `--no-` and that name); a drafter option's short name ends its setting's name."""
    irregular = {"use_cache": "--no-cache"}  # documented before the names were one
    for names in SETTING_NAMES.values():
        dashed = names.setting.replace("_", "-")
        regular = f"--no-{dashed}" if names.switch is False else f"--{dashed}"
        assert names.flag == irregular.get(names.setting, regular)
        assert names.drafter is None or names.setting.endswith("_" + names.drafter)
        for key in names.old_drafter_keys:  # an old key names its setting only
            assert key not in DRAFTER_SETTINGS and key not in SETTING_NAMES
