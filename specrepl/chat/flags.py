"""The flags every entry point shares, and how they turn the config into the
application's config.

`python infer.py`, `--prompt`, `bench`, `soak` and `replay` take the same
model flags (`--config`, `--target`, `--drafter`, `--device`, dtypes,
quantization) and one flag per session setting (`--gamma`, `--drafter-kind`,
`--processor`, ...; each named by the setting's declaration, see
`settings.SettingNames`), before or after the subcommand's name: a subcommand
declares them again with "not given" as the default, so a value given before
it survives and one given after it wins, and `app_config` reads them all the
same way. `--gamma` takes what `/gamma` takes: `N` (fixed), or a policy with
an optional maximum (`auto`, `auto:8`).

Torch-free: the REPL's parser is built from it before any model library loads.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from specrepl.chat.config import AppConfig, load_config
from specrepl.chat.settings import (
    SETTING_NAMES,
    SettingError,
    SettingNames,
    Settings,
    parse_integer,
    parse_number,
    shown,
)
from specrepl.engine.gamma import POLICIES
from specrepl.models.specs import DTYPE_NAMES, QUANTIZE_NAMES, ModelSpec
from specrepl.store.paths import default_config_path

__all__ = [
    "NO_DRAFTER",
    "SETTING_FLAGS",
    "add_model_options",
    "add_setting_options",
    "app_config",
    "gamma_choice",
]

NO_DRAFTER = "none"


SETTING_FLAGS: tuple[SettingNames, ...] = tuple(SETTING_NAMES.values())
"""One flag per setting (`flag`; a switch sets `switch`), in the order Settings
declares them, which is the order `app_config` applies them in."""


def gamma_choice(text: str) -> tuple[str, int | None]:
    """`4` → ("fixed", 4); `auto` → ("auto", None): the current maximum; `auto:8` →
    ("auto", 8). ValueError for anything else (the range is checked by Settings)."""
    name, colon, number = str(text).strip().lower().partition(":")
    if not colon and parse_integer(name) is not None:
        return "fixed", parse_integer(name)
    if name not in POLICIES:
        raise ValueError(
            f"expected an integer or a policy ({', '.join(POLICIES)}) with an optional "
            f":N for its maximum, e.g. auto:8; got {shown(text)}"
        )
    if not colon:
        return name, None
    value = parse_integer(number)
    if value is None:
        raise ValueError(f"{shown(number)} after the colon is not an integer")
    return name, value


def _gamma_flag(text: str) -> tuple[str, int | None]:
    try:
        return gamma_choice(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _flag_type(kind: type) -> Callable[[str], Any]:
    """Numbers as the REPL reads them: plain ASCII decimals only (no `1_0`, no `٣`)."""
    if kind is int:
        parse: Callable[[str], Any] = parse_integer
    elif kind is float:
        parse = parse_number
    else:
        return str

    def convert(token: str) -> Any:
        value = parse(token)
        if value is None:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {noun}, got {shown(token)}")
        return value

    convert.__name__ = kind.__name__  # argparse names the type in its message
    return convert


def _unset(after_subcommand: bool) -> Any:
    """The default of a shared flag: None on the main parser; "not given" on a
    subcommand's, so that a value given before the subcommand survives."""
    return argparse.SUPPRESS if after_subcommand else None


def add_model_options(parser: argparse.ArgumentParser, *, after_subcommand: bool = False) -> None:
    """Which config to read and the flags that override its models."""
    unset = _unset(after_subcommand)
    group = parser.add_argument_group("models (override the config)")
    group.add_argument(
        "--config",
        metavar="PATH",
        default=unset,
        help=f"TOML config file (default: {default_config_path()})",
    )
    group.add_argument(
        "--target",
        metavar="SOURCE",
        default=unset,
        help='target model: "embedded", a .gguf file, a model directory or a hub id',
    )
    group.add_argument(
        "--drafter",
        metavar="SOURCE",
        default=unset,
        help=f'drafter model, as for --target; "{NO_DRAFTER}" loads no drafter',
    )
    group.add_argument("--device", default=unset, help="auto, cpu, cuda, cuda:N or mps")
    dtypes, quantizations = ", ".join(DTYPE_NAMES), ", ".join(QUANTIZE_NAMES)
    for role, prefix in (("target", ""), ("drafter", "drafter-")):
        group.add_argument(
            f"--{prefix}dtype",
            choices=DTYPE_NAMES,
            metavar="DTYPE",
            default=unset,
            help=f"the {role}'s dtype: {dtypes}",
        )
        group.add_argument(
            f"--{prefix}quantize",
            choices=QUANTIZE_NAMES,
            metavar="BITS",
            default=unset,
            help=f"the {role}'s quantization (bitsandbytes): {quantizations}",
        )
    for role, prefix in (("target", ""), ("drafter", "drafter-")):
        group.add_argument(
            f"--{prefix}device-map",
            metavar="MAP",
            default=unset,
            help=f"where the {role}'s parts go: auto, balanced, sequential, one device, or "
            "MODULE=DEVICE,... (DEVICE: cpu, cuda:N, mps, disk); default: whole on --device",
        )
        group.add_argument(
            f"--{prefix}max-memory",
            metavar="CAPS",
            default=unset,
            help=f"the {role}'s memory caps, e.g. cpu=200MB or cuda:0=2GiB,cpu=8GiB "
            "(implies --device-map auto; what does not fit is offloaded)",
        )
        group.add_argument(
            f"--{prefix}offload-folder",
            metavar="PATH",
            default=unset,
            help=f"where the {role}'s weights that fit nowhere are written (disk offload)",
        )
    group.add_argument(
        "--trust-remote-code",
        action="store_true",
        default=unset,
        help="allow models to run code from their repository (off unless asked for)",
    )


def add_setting_options(parser: argparse.ArgumentParser, *, after_subcommand: bool = False) -> None:
    """One flag per session setting; each overrides the config's value."""
    unset = _unset(after_subcommand)
    group = parser.add_argument_group("generation settings (override the config)")
    for flag in SETTING_FLAGS:
        bound = Settings.bound(flag.setting)
        help = Settings.help(flag.setting)
        if flag.switch is not None:
            group.add_argument(
                flag.flag,
                dest=flag.setting,
                action="store_const",
                const=flag.switch,
                default=unset,
                help=f"{help}: {'on' if flag.switch else 'off'}",
            )
            continue
        if flag.setting == "gamma":
            group.add_argument(
                flag.flag,
                dest=flag.setting,
                type=_gamma_flag,
                metavar="N|POLICY[:N]",
                default=unset,
                help=f"drafts per step: N fixed ({bound.describe()}), or a gamma policy "
                f"({', '.join(POLICIES)}) with an optional maximum, e.g. auto:8",
            )
            continue
        kind = bound.kind if bound.kind in (int, float) else str
        metavar = {int: "N", float: "X"}.get(kind, "NAME" if bound.choices else "TEXT")
        valid = "" if kind is str and not bound.choices else f" ({bound.describe()})"
        group.add_argument(
            flag.flag,
            dest=flag.setting,
            type=_flag_type(kind),
            metavar=metavar,
            default=unset,
            help=help + valid,
        )


_SPEC_FLAGS = ("dtype", "quantize", "device_map", "max_memory", "offload_folder")
"""The flags that change a model spec's fields (a drafter's with `drafter_` before)."""


def _model_spec(
    spec: ModelSpec | None, source: str | None, given: dict[str, Any], prefix: str
) -> ModelSpec | None:
    """`spec` with the flags' `source` and fields (`_SPEC_FLAGS`) given; ValueError
    naming the flag whose value is refused."""
    if source is not None:
        spec = ModelSpec(source) if spec is None else replace(spec, source=source)
    if spec is None:
        return None
    for key, value in given.items():
        if value is None:
            continue
        try:
            spec = replace(spec, **{key: value})
        except ValueError as error:
            raise ValueError(f"--{prefix}{key.replace('_', '-')}: {error}") from None
    return spec


def _spec_flags(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {key: getattr(args, prefix.replace("-", "_") + key, None) for key in _SPEC_FLAGS}


def _setting_changes(flag: SettingNames, value: Any) -> dict[str, Any]:
    """What one flag's value changes in the settings."""
    if flag.setting == "gamma":
        policy, gamma = value
        return {"gamma_policy": policy} | ({} if gamma is None else {"gamma": gamma})
    if Settings.bound(flag.setting).optional and str(value).lower() == "none":
        return {flag.setting: None}  # e.g. `--system-prompt none`: the template's own
    return {flag.setting: value}


def app_config(args: argparse.Namespace) -> AppConfig:
    """The config file with the command line's overrides applied (flags given
    before a subcommand or after it alike).

    Raises ConfigError for a bad file and SettingError or ValueError for a
    bad flag value, each naming what was wrong.
    """

    def given(name: str) -> Any:
        return getattr(args, name, None)

    config = load_config(given("config") or default_config_path())
    target = _model_spec(config.target, given("target"), _spec_flags(args, ""), "")
    assert target is not None
    drafter_source = given("drafter")
    if drafter_source is not None and drafter_source.lower() == NO_DRAFTER:
        drafter = None
    else:
        drafter = _model_spec(
            config.drafter, drafter_source, _spec_flags(args, "drafter-"), "drafter-"
        )
    settings = config.settings
    for flag in SETTING_FLAGS:  # in this order: `--gamma 6 --gamma-policy auto` is auto ≤ 6
        value = given(flag.setting)
        if value is None:
            continue
        try:
            settings = settings.updated(**_setting_changes(flag, value))
        except SettingError as error:
            raise SettingError(f"{flag.flag}: {error}") from None
    return replace(
        config,
        target=target,
        drafter=drafter,
        device=given("device") or config.device,
        trust_remote_code=bool(given("trust_remote_code") or config.trust_remote_code),
        settings=settings,
    )
