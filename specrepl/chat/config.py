"""Config files: which models to load, where, and the session's starting settings.

A config is a TOML file, read as data with `tomllib` and never executed. Every
key is checked: a missing file, a syntax error, an unknown key, a value of the
wrong type or out of range each raise one `ConfigError` that names the file,
the key and what was expected. The `[generation]` table holds the fields of
`specrepl.chat.settings.Settings` and is validated by `Settings` itself; the
`[drafter]` table holds the model drafter and the drafter's options under their
short names (`order`, `filler`, ...: those `/drafter_kind` takes), with the
older spellings each setting declares (`top_k_filler`) still read.

This module knows nothing about torch, transformers or the terminal: model
sources and dtypes stay strings here (`specrepl.models.specs.ModelSpec`) and
the loader (`specrepl.models.loading`) resolves them.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specrepl.chat.settings import (
    DRAFTER_KINDS,
    DRAFTER_SETTINGS,
    SETTING_NAMES,
    SettingError,
    Settings,
    shown,
)
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.models.placing import parse_device_map, parse_max_memory
from specrepl.models.specs import DTYPE_NAMES, QUANTIZE_NAMES, ModelSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["AppConfig", "ConfigError", "load_config"]

DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")

_TOP_KEYS = ("device", "trust_remote_code", "target", "drafter", "generation")
_MODEL_KEYS = ("source", "dtype", "quantize", "device_map", "max_memory", "offload_folder")
# [drafter] names the drafter's options as /drafter_kind does (DRAFTER_SETTINGS)
_DRAFTER_KEYS = tuple(dict.fromkeys(("kind", *_MODEL_KEYS, *DRAFTER_SETTINGS)))
_OLD_DRAFTER_KEYS = tuple(key for names in SETTING_NAMES.values() for key in names.old_drafter_keys)


class ConfigError(ValueError):
    """A config file could not be read or holds a value that is not allowed."""


@dataclass(frozen=True)
class AppConfig:
    """Everything a session starts from: the model pair, the device and the settings."""

    target: ModelSpec
    drafter: ModelSpec | None = None
    device: str = "auto"
    trust_remote_code: bool = False
    settings: Settings = field(default_factory=Settings)
    path: Path | None = None


def load_config(path: str | Path) -> AppConfig:
    """Read and validate one config file; raise ConfigError on any problem."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir() and not path.is_file():
        # a device or a pipe could be read forever
        raise ConfigError(f"{path}: not a regular file, expected a .toml file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a .toml file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the file ({exc})") from None
    try:
        data = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer with too many digits
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    return _Reader(path).app_config(data)


@dataclass(frozen=True)
class _Reader:
    """Turns the parsed TOML of one file into an AppConfig, naming the file in errors."""

    path: Path

    def error(
        self, key: str, expected: str, value: Any = None, *, show_value: bool = True
    ) -> ConfigError:
        got = f", got {shown(value)}" if show_value else ""
        return ConfigError(f"{self.path}: {key}: expected {expected}{got}")

    def check_keys(
        self,
        table: Mapping[str, Any],
        known: Iterable[str],
        prefix: str,
        also_accepted: Iterable[str] = (),
    ) -> None:
        """Refuse a key that is neither `known` nor `also_accepted` (an old spelling,
        read but not suggested), naming the closest known one."""
        known = tuple(known)
        for key in table:
            if key in known or key in also_accepted:
                continue
            name = key if key.isprintable() and len(key) <= 40 else shown(key)
            where = f"{prefix}.{name}" if prefix else name
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{self.path}: {where}: unknown key; {hint}known keys: {', '.join(known)}"
            )

    def table(self, data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, f"a table ([{key}])", value)
        return value

    def string(self, table: Mapping[str, Any], key: str, where: str, default: str) -> str:
        value = table.get(key, default)
        if not isinstance(value, str):
            raise self.error(where, "a string", value)
        return value

    def app_config(self, data: Mapping[str, Any]) -> AppConfig:
        self.check_keys(data, _TOP_KEYS, "")
        device = self.string(data, "device", "device", "auto")
        if not DEVICE_PATTERN.fullmatch(device):
            raise self.error("device", "one of auto, cpu, cuda, cuda:N, mps", device)
        trust_remote_code = data.get("trust_remote_code", False)
        if not isinstance(trust_remote_code, bool):
            raise self.error("trust_remote_code", "true or false", trust_remote_code)
        target_table = self.table(data, "target")
        if target_table is None:
            raise self.error(
                "target",
                'a [target] table with a source, e.g. source = "embedded"',
                show_value=False,
            )
        self.check_keys(target_table, _MODEL_KEYS, "target")
        target = self.model_spec(target_table, "target")
        drafter_table = self.table(data, "drafter")
        drafter = None
        drafter_settings: dict[str, Any] = {}
        if drafter_table is not None:
            self.check_keys(drafter_table, _DRAFTER_KEYS, "drafter", _OLD_DRAFTER_KEYS)
            kind = self.string(drafter_table, "kind", "drafter.kind", "model")
            if kind not in DRAFTER_KINDS:
                raise self.error(
                    "drafter.kind", "one of " + ", ".join(map(repr, DRAFTER_KINDS)), kind
                )
            # an n-gram or lookup drafter needs no model, but may name one to switch to
            options = DrafterOptions(kind=kind, head=drafter_table.get("head"))
            if options.needs_model or "source" in drafter_table:
                drafter = self.model_spec(drafter_table, "drafter")
            else:
                for key in _MODEL_KEYS:
                    if key in drafter_table:  # would be ignored: say so rather than guess
                        raise self.error(
                            f"drafter.{key}",
                            f"no {key} without drafter.source (the {kind} drafter loads no model)",
                            drafter_table[key],
                        )
            drafter_settings["drafter_kind"] = ("drafter.kind", kind)
            for setting in DRAFTER_SETTINGS.values():
                key = self.spelling(drafter_table, setting)
                if key is not None:
                    drafter_settings[setting] = (f"drafter.{key}", drafter_table[key])
        settings = self.settings(self.table(data, "generation") or {})
        for setting, (where, value) in drafter_settings.items():
            try:
                settings = settings.updated(**{setting: value})
            except SettingError:
                raise self.error(where, Settings.bound(setting).describe(), value) from None
        return AppConfig(
            target=target,
            drafter=drafter,
            device=device,
            trust_remote_code=trust_remote_code,
            settings=settings,
            path=self.path,
        )

    def spelling(self, drafter_table: Mapping[str, Any], setting: str) -> str | None:
        """The key that gives the drafter option `setting` in `drafter_table`: its
        short name or an older spelling; None when neither is there."""
        names = SETTING_NAMES[setting]
        keys = [key for key in (names.drafter, *names.old_drafter_keys) if key in drafter_table]
        if len(keys) > 1:
            raise self.error(
                f"drafter.{keys[1]}",
                f"one of {' and '.join(keys)}, not both (two spellings of one setting)",
                show_value=False,
            )
        return keys[0] if keys else None

    def model_spec(self, table: Mapping[str, Any], section: str) -> ModelSpec:
        if "source" not in table:
            raise self.error(
                f"{section}.source",
                'a model source: "embedded", a .gguf file, a directory or a hub id',
                show_value=False,
            )
        source = self.string(table, "source", f"{section}.source", "")
        if not source.strip():
            raise self.error(f"{section}.source", "a non-empty string", source)
        dtype = self.string(table, "dtype", f"{section}.dtype", "auto")
        if dtype not in DTYPE_NAMES:
            raise self.error(f"{section}.dtype", "one of " + ", ".join(DTYPE_NAMES), dtype)
        quantize = self.string(table, "quantize", f"{section}.quantize", "none")
        if quantize not in QUANTIZE_NAMES:
            raise self.error(f"{section}.quantize", "one of " + ", ".join(QUANTIZE_NAMES), quantize)
        try:
            location = self.source_path(source.strip())
        except RuntimeError:  # `~name` of an unknown user, or a loop of symbolic links
            raise self.error(
                f"{section}.source", "a path this machine can resolve", source
            ) from None
        placing = self.placing(table, section)
        try:
            return ModelSpec(source=location, dtype=dtype, quantize=quantize, **placing)
        except ValueError as error:  # quantized and placed at once
            raise ConfigError(f"{self.path}: [{section}]: {error}") from None

    def placing(self, table: Mapping[str, Any], section: str) -> dict[str, Any]:
        """The model's device map, memory caps and offload folder, each checked
        (`models.placing`); a relative folder is relative to the config file."""
        placing: dict[str, Any] = {}
        for key, parse in (("device_map", parse_device_map), ("max_memory", parse_max_memory)):
            if key in table:
                try:
                    placing[key] = parse(table[key])
                except ValueError as error:
                    raise ConfigError(f"{self.path}: {section}.{key}: {error}") from None
        if "offload_folder" in table:
            folder = self.string(table, "offload_folder", f"{section}.offload_folder", "")
            if not folder.strip():
                raise self.error(f"{section}.offload_folder", "a non-empty path", folder)
            placing["offload_folder"] = self.source_path(folder.strip())
        return placing

    def source_path(self, source: str) -> str:
        """Explicitly relative paths ("./x", "../x") are relative to the config file."""
        if source.startswith(("./", "../", ".\\", "..\\")):
            return str((self.path.parent / source).resolve())
        if source.startswith("~"):
            return str(Path(source).expanduser())
        return source

    def settings(self, table: Mapping[str, Any]) -> Settings:
        self.check_keys(table, Settings.names(), "generation")
        settings = Settings()
        for key, value in table.items():
            try:
                settings = settings.updated(**{key: value})
            except SettingError:
                expected = Settings.bound(key).describe()
                raise self.error(f"generation.{key}", expected, value) from None
        return settings
