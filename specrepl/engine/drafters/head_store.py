"""Draft heads on disk: a head directory written, found, checked against its target and loaded.

A head directory stores only what was trained (`head.safetensors`) and a
description (`head.json`) that names the target by a fingerprint of its
weights (`target_fingerprint`), so a head is never used with another target.
The network itself is in `draft_head.py`. This module knows nothing about
generation loops, drafting policy or files other than a head directory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specrepl.engine.drafters.draft_head import DraftHead, HeadConfig, check_fused_layers
from specrepl.engine.drafters.options import names_auto_head
from specrepl.engine.placement import weights
from specrepl.store.atomic import write_atomically, write_text_atomically
from specrepl.store.paths import EMBEDDED_HEADS_DIR, kept_heads_dir

__all__ = [
    "HEAD_FORMAT",
    "HeadLoadError",
    "find_head_for",
    "load_head",
    "locate_head",
    "read_description",
    "resolve_head",
    "save_head",
    "target_fingerprint",
]

HEAD_FORMAT = 1
WEIGHTS_FILE = "head.safetensors"
DESCRIPTION_FILE = "head.json"


class HeadLoadError(RuntimeError):
    """A head directory cannot be used: missing, damaged, or made for another target."""


def target_fingerprint(target: PreTrainedModel) -> str:
    """A short hash of the target's architecture and weights.

    Every parameter contributes its name, shape and an evenly spaced sample of
    its values rounded to bfloat16, so the same weights loaded in float32 or
    bfloat16 give the same fingerprint and other weights almost surely do not.
    """
    digest = hashlib.sha256()
    config = target.config.get_text_config()
    for name in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        digest.update(f"{name}={getattr(config, name, None)};".encode())
    with torch.no_grad():
        for name, parameter in weights(target):  # an offloaded one brought in module by module
            flat = parameter.detach().reshape(-1)
            step = max(1, flat.numel() // 4096)
            sample = flat[::step][:4096].to(torch.bfloat16).view(torch.int16).cpu()
            digest.update(f"{name}:{tuple(parameter.shape)};".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


EMBEDDED_HEAD = EMBEDDED_HEADS_DIR / "smollm2-135m-instruct"


def resolve_head(name: str) -> Path:
    """A head's directory: "embedded" is the head shipped for the embedded
    model; anything else is a path (`~` expanded)."""
    if name.strip().lower() == "embedded":
        return EMBEDDED_HEAD
    return Path(name).expanduser()


def locate_head(name: str, target: PreTrainedModel) -> Path:
    """The directory of the head `name` names for `target`: "auto" finds one
    trained for it (`find_head_for`; HeadLoadError, saying where it looked, when
    there is none); any other name is `resolve_head`'s."""
    if not names_auto_head(name):
        return resolve_head(name)
    found = find_head_for(target)
    if found is None:
        where = " and ".join(str(root) for root in head_directories())
        raise HeadLoadError(
            f"no draft head trained for this target in {where}: train one with `python infer.py"
            f" distill --out {kept_heads_dir() / 'NAME'}`, or name a head directory"
        )
    return found


def head_directories() -> tuple[Path, ...]:
    """Where a head named "auto" is looked for: the heads shipped with specrepl,
    then the ones the user keeps (`paths.kept_heads_dir`)."""
    return (EMBEDDED_HEADS_DIR, kept_heads_dir())


def find_head_for(target: PreTrainedModel, fingerprint: str | None = None) -> Path | None:
    """The first head directory in `head_directories` trained for `target` (by its
    `target_fingerprint`, given or computed), or None. A directory that cannot be
    read is passed over."""
    wanted = fingerprint or target_fingerprint(target)
    for root in head_directories():
        try:
            candidates = sorted(path for path in root.iterdir() if path.is_dir())
        except OSError:
            continue
        for directory in candidates:
            try:
                description = read_description(directory)
            except HeadLoadError:
                continue
            if description.get("target", {}).get("fingerprint") == wanted:
                return directory
    return None


def save_head(head: DraftHead, directory: Path, description: dict[str, Any]) -> None:
    """Write `head.safetensors` (bfloat16 weights, the token ids) and `head.json`,
    each through a temporary file, so a reader never sees half of one."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: value.detach().to(torch.bfloat16).contiguous()
        for name, value in head.state_dict().items()
    }
    tensors["token_ids"] = head.token_ids.to(torch.int32).contiguous()
    full = {"format": HEAD_FORMAT, "config": asdict(head.config), **description}
    write_atomically(directory / WEIGHTS_FILE, lambda file: save_file(tensors, str(file)))
    write_text_atomically(directory / DESCRIPTION_FILE, json.dumps(full, indent=2) + "\n")


def read_description(directory: Path) -> dict[str, Any]:
    """A head directory's `head.json`; HeadLoadError if it is missing or damaged."""
    path = Path(directory) / DESCRIPTION_FILE
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HeadLoadError(
            f"no draft head at {directory} (it has no {DESCRIPTION_FILE})"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HeadLoadError(f"the draft head's {path} cannot be read: {exc}") from None
    if not isinstance(description, dict) or description.get("format") != HEAD_FORMAT:
        raise HeadLoadError(
            f"{path} is not a draft head of format {HEAD_FORMAT} (made by another version?)"
        )
    return description


def load_head(
    directory: Path, target: PreTrainedModel, *, check_fingerprint: bool = True
) -> tuple[DraftHead, dict[str, Any]]:
    """The head in `directory`, bound to `target`'s embedding and output rows, in
    the target's dtype and on its device. Refused (HeadLoadError) when the head
    was trained for another target, naming both."""
    directory = Path(directory)
    description = read_description(directory)
    trained_for = description.get("target", {})
    if check_fingerprint:
        fingerprint = target_fingerprint(target)
        if trained_for.get("fingerprint") != fingerprint:
            raise HeadLoadError(
                f"the draft head at {directory} was trained for "
                f"{trained_for.get('name', 'another model')} (fingerprint "
                f"{trained_for.get('fingerprint')}), not for this target (fingerprint "
                f"{fingerprint}): train one with `python infer.py distill`"
            )
    try:
        tensors = load_file(str(directory / WEIGHTS_FILE))
        config = HeadConfig(**description["config"])
    except (OSError, KeyError, TypeError, ValueError, SafetensorError) as exc:
        raise HeadLoadError(
            f"the draft head's weights in {directory} cannot be read: {exc}"
        ) from None
    try:
        check_fused_layers(
            config.fused_layers, int(target.config.get_text_config().num_hidden_layers)
        )
    except ValueError as exc:
        raise HeadLoadError(
            f"the draft head in {directory} does not fit this target: {exc}"
        ) from None
    token_ids = tensors.pop("token_ids").long()
    dtype = next(target.parameters()).dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    embedding = target.get_input_embeddings().weight.detach()
    output = target.get_output_embeddings().weight.detach()
    head = DraftHead(config, embedding, output[token_ids.to(output.device)], token_ids)
    try:
        head.load_state_dict({name: value.float() for name, value in tensors.items()})
    except RuntimeError as exc:
        raise HeadLoadError(
            f"the draft head in {directory} does not match its own config: {exc}"
        ) from None
    device = embedding.device
    return head.to(device=device, dtype=dtype).eval(), description
