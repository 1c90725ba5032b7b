"""What a running generator streams: its answer's text as it grows, and each step's pieces.

`TextStream` turns the token ids a run appends into text deltas for a front
end to print; `step_pieces` decodes one speculative step's tokens one by one
for the debug view. Both only decode with the tokenizer: this module knows
nothing of models, settings or the terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specrepl.chat.answers import StepPieces

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from specrepl.engine.results import StepEvent

__all__ = ["TextStream", "step_pieces"]


class TextStream:
    """Turns a growing list of token ids into text deltas.

    Decodes from a window start that moves past each completed line, holds
    back text that ends in an incomplete character, and never re-emits text.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0
        self.emitted = 0

    def push(self, ids: tuple[int, ...]) -> str:
        self.ids.extend(ids)
        window = self.tokenizer.decode(self.ids[self.start :], skip_special_tokens=True)
        if window.endswith("\ufffd"):
            return ""
        delta = window[self.emitted :]
        if window.endswith("\n"):
            self.start, self.emitted = len(self.ids), 0
        else:
            self.emitted = len(window)
        return delta


def step_pieces(tokenizer: PreTrainedTokenizerBase, step: StepEvent) -> StepPieces:
    """The step's accepted drafts, its rejected draft and the target's own token, decoded."""

    def piece(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    appended = step.appended
    if len(appended) <= step.accepted:  # cut at an end token: the rest never counted
        return StepPieces(tuple(piece(token) for token in appended), None, None)
    rejected = step.rejected
    return StepPieces(
        accepted=tuple(piece(token) for token in appended[: step.accepted]),
        rejected=None if rejected is None else piece(rejected),
        target=piece(appended[step.accepted]),
    )
