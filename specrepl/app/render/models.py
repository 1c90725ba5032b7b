"""The loaded models as a table: what start-up shows and `/models` shows again.

It reads a loaded `ModelPair` and a draft head's description; it never loads
or changes a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.text import Text

from specrepl.app.render.formatting import DASH, format_bytes, plain_table, short_count

if TYPE_CHECKING:
    from specrepl.models.loaded import LoadedModel
    from specrepl.models.pair import ModelPair

__all__ = ["models_table"]


def models_table(
    pair: ModelPair,
    head: dict[str, Any] | None = None,
    runtime: str | None = None,
    target_runtime: str | None = None,
) -> RenderableType:
    """The target and the drafter (name, dtype, quantization, size, memory, load time),
    the draft head if one drafts (`head`: its head.json plus "path", and "chosen":
    why a hybrid drafts with it rather than the model), what runs the
    drafter model (`runtime`) and the target (`target_runtime`), and the
    device, vocabulary, context and end tokens; where the drafter has a
    tokenizer of its own, how drafts cross between the two."""
    table = plain_table()
    table.add_column("", style="bold")
    table.add_column("model")
    table.add_column("dtype")
    table.add_column("quant.")
    table.add_column("params", justify="right")
    table.add_column("memory", justify="right")
    table.add_column("loaded in", justify="right")
    roles: list[tuple[str, LoadedModel | None]] = [
        ("target", pair.target),
        ("drafter", pair.drafter),
    ]
    for role, model in roles:
        if model is None:
            why = "the draft head drafts" if head else "speculative decoding is off"
            table.add_row(role, Text(f"none ({why})", style="dim"))
            continue
        cached = " (cache)" if model.from_cache else ""
        name = Text(model.name)
        if model.kind != model.name:
            name.append(f" ({model.kind})", style="dim")
        if role == "target" and target_runtime is not None:
            name.append(f" (runs in {target_runtime})", style="dim")
        elif role == "drafter" and runtime is not None:
            name.append(f" (drafts in {runtime})", style="dim")
        elif role == "drafter" and head is not None:
            name.append(" (the draft head drafts instead; this one: /drafter_gen)", style="dim")
        elif role == "drafter" and pair.drafter_is_copy:
            name.append(" (a copy of the target: takes its keys and values)", style="dim")
        table.add_row(
            role,
            name,
            str(model.dtype).removeprefix("torch."),
            model.quantization or DASH,
            short_count(model.parameters),
            format_bytes(model.memory_bytes),
            f"{model.load_seconds:.1f} s{cached}",
        )
        if model.offloaded:  # split or offloaded: where each part lives
            table.add_row(
                "",
                Text(f"placed: {model.describe_placement()}", style="dim").append(
                    " (accelerate brings offloaded weights in for each pass; not tuned)"
                ),
            )
    if head is not None:
        agreement = " ".join(f"{a:.2f}" for a in head.get("held_back_agreement", []))
        chosen = f"; {head['chosen']}" if head.get("chosen") else ""
        table.add_row(
            "draft head",
            Text(head["path"]).append(
                f" ({head.get('draft_vocab')} tokens; for {head['target'].get('name')};"
                f" held-back agreement {agreement or 'not measured'}{chosen})",
                style="dim",
            ),
            head.get("dtype", DASH),
            DASH,
            short_count(int(head.get("parameters", 0))),
            DASH,
            DASH,
        )
    footer = Text(
        f"device {pair.device} · vocabulary {pair.vocab_size} · "
        f"context {pair.context_length} · end tokens {pair.eos_token_ids}",
        style="dim",
    )
    if pair.vocabulary is not None and pair.vocabulary.kind != "one":
        footer.append(f"\ntokenizers: {pair.vocabulary.describe()}")
    return Group(table, footer)
