"""Which drafter to build: the kinds users can name and the options of each.

Plain data without torch, so that settings, config files and the REPL's first
screen can name and check drafters before any model library is imported;
`builder.build_drafter` turns these options into a drafter. The fields are
named as `/drafter_kind` and a config file's `[drafter]` table name them
(`settings.DRAFTER_SETTINGS`), so `Settings.drafter_options` needs no table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AUTO_HEAD", "DRAFTER_KINDS", "DRAFTER_RUNTIMES", "DrafterOptions", "names_auto_head"]

DRAFTER_KINDS = ("model", "ngram", "lookup", "hybrid", "head")

DRAFTER_RUNTIMES = ("auto", "torch", "llamacpp", "static")
"""What runs the drafter model (`runtime.choose_runtime`): "auto"
measures the candidates (on a CPU llama.cpp where it can run the model's
GGUF file; on a GPU the static runtime, compiled) against eager torch and
keeps the cheapest; "torch", "llamacpp" and "static" (torch over a static
cache, compiled on a GPU) force one."""


AUTO_HEAD = "auto"
"""The head named "auto": a draft head trained for the target, found among the
heads shipped with specrepl and those the user keeps (`head_store.find_head_for`).
The `head` kind drafts with it; `hybrid` drafts with it instead of the drafter
model only where it measured faster on this machine (`chat.draft_choice`)."""


def names_auto_head(name: str | None) -> bool:
    """Whether a head name is `AUTO_HEAD` (any case, spaces around it ignored)."""
    return name is not None and name.strip().lower() == AUTO_HEAD


@dataclass(frozen=True)
class DrafterOptions:
    """Everything that says which drafter to build (see `builder.build_drafter`).

    The defaults here are the only ones: the settings of the same names
    (`Settings.ngram_order` and the rest) and the drafters' own constructors
    take theirs from this class."""

    kind: str = "model"
    order: int = 3
    """The longest n-gram the n-gram drafter counts."""
    keep: bool = False
    """The n-gram drafter keeps its counts from one prompt to the next."""
    filler: int = 1
    """The n-gram drafter also counts the target's top `filler` tokens (1: off)."""
    max_ngram: int = 3
    """The longest suffix prompt lookup searches for."""
    window: int = 0
    """The model drafter reads the prompt's last `window` tokens (0: all)."""
    runtime: str = "auto"
    """What runs the drafter model: one of DRAFTER_RUNTIMES."""
    min_match: int = 2
    head: str | None = None
    """A draft head directory (or "embedded", or `AUTO_HEAD`): the `head` kind
    drafts with it, and `hybrid` uses it instead of the drafter model."""

    @property
    def head_is_auto(self) -> bool:
        """The head is `AUTO_HEAD`: for `hybrid`, whether it drafts with a head or
        the model is still to be chosen by timing (`chooses_head`)."""
        return names_auto_head(self.head)

    @property
    def chooses_head(self) -> bool:
        """A hybrid whose head is `AUTO_HEAD`: a head or the drafter model, by timing."""
        return self.kind == "hybrid" and self.head_is_auto

    @property
    def needs_model(self) -> bool:
        """Whether the drafter model drafts (a hybrid that still chooses may: it is
        timed against the head, so it counts as needing the model until then)."""
        return self.kind == "model" or (
            self.kind == "hybrid" and (self.head is None or self.head_is_auto)
        )

    @property
    def needs_head(self) -> bool:
        """Whether a draft head drafts (not yet known for a hybrid that still chooses)."""
        return self.kind == "head" or (
            self.kind == "hybrid" and self.head is not None and not self.head_is_auto
        )
