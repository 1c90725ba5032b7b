"""Drafting with a model whose tokenizer is not the target's.

A drafter model from another family reads and writes its own token ids. A
`TranslatedDrafter` puts such a drafter (any `Drafter` over the drafter's
ids, usually a `ModelDrafter`) in front of the target:

- the context: the target's ids are turned into the drafter's, either id by
  id (`Translation.by_ids`: the same token strings under other ids) or
  through text (the target's ids decoded, the text encoded with the
  drafter's tokenizer). The drafter keeps its own ids; each step the context
  is translated again and the drafter keeps what it holds of it, so that a
  verification that kept part of a draft, cut a drafter token in two or
  corrected the last one brings it back in step by itself.
- greedy drafts (and any drafter that proposes without a distribution): the
  drafter's tokens are decoded to text and the text encoded with the
  target's tokenizer after the context's last token (the target's draft may
  be longer or shorter than the drafter's; it is cut to the k asked for).
- sampled drafts: the drafter draws only among the tokens whose strings both
  vocabularies hold (`Translation.shared`), its law renormalised over them,
  and each drawn token becomes the target's id for the same string; the law
  is carried over column by column. The rejection step is then the usual one,
  so the target's law is kept exactly.

The target's output never depends on the drafts: verification decides. This
module knows nothing of tokenizer libraries (it is given two `TextCodec`s),
of models or of settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch
from transformers import DynamicCache

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["IdsOfText", "TextCodec", "TextOfIds", "TranslatedDrafter", "Translation"]

REPLACEMENT = "\ufffd"
"""What a decoder writes for bytes that do not yet make a whole character."""

ANCHOR_TOKENS = 4
"""Tokens before a stretch decoded with it, so that the stretch's first token
decodes as it does inside the text (a leading space kept, whole characters)."""

OPEN_CHARACTERS = 512
"""`IdsOfText` encodes at most about this many characters again each step
(the text after its last settled word boundary)."""

SETTLED_DISTANCE = 64
"""Characters from the text's end that are never settled (a draft or a
correction may still change how they are split)."""


class TextCodec(Protocol):
    """One model's tokenizer as the translation needs it."""

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, with no special tokens added around it."""
        ...

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens written out, spaces as they are."""
        ...


@dataclass(frozen=True)
class Translation:
    """How a drafter's ids relate to the target's.

    `target_of_drafter[d]` is the target's id of the drafter's token `d` (the
    same string), or -1 where the target has no such token;
    `drafter_of_target` the other way. `by_ids`: every target token has a
    drafter token of the same string, so contexts are translated id by id and
    not through text (the same vocabulary under other ids). `samples`: enough
    tokens are shared for sampled drafts among them to pay (else the drafter
    proposes nothing when sampling)."""

    target: TextCodec
    drafter: TextCodec
    target_of_drafter: torch.Tensor
    drafter_of_target: torch.Tensor
    by_ids: bool = False
    samples: bool = True

    @property
    def shared(self) -> torch.Tensor:
        """The drafter's ids of the tokens both vocabularies hold."""
        return torch.nonzero(self.target_of_drafter >= 0).flatten()


class TextOfIds:
    """The text of a growing list of a tokenizer's ids, decoded once.

    Each call decodes only the ids after those already decoded (with a few
    before them, so that the first decodes as it does in place); ids whose
    text ends inside a character are decoded again when more follow. A list
    that is not an extension of the last one is decoded from its start."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._ids: list[int] = []  # settled: their text ends on a whole character
        self._text = ""

    def __call__(self, ids: list[int]) -> str:
        settled = len(self._ids)
        if ids[:settled] != self._ids:
            self._ids, self._text, settled = [], "", 0
        tail = ids[settled:]
        if not tail:
            return self._text
        anchor = self._ids[-ANCHOR_TOKENS:]
        before = self._codec.decode(anchor) if anchor else ""
        both = self._codec.decode(anchor + tail)
        added = both[len(before) :] if both.startswith(before) else self._codec.decode(tail)
        if not added.endswith(REPLACEMENT):
            self._ids, self._text = list(ids), self._text + added
            return self._text
        return self._text + added.rstrip(REPLACEMENT)


class IdsOfText:
    """A tokenizer's ids of a growing text, without encoding all of it each time.

    The text is encoded as settled pieces and an open end: once the open end
    is longer than `OPEN_CHARACTERS`, its part up to a word boundary (a space
    after a non-space) at least `SETTLED_DISTANCE` characters before the end
    is encoded once and kept. A text that does not start with the settled
    pieces starts over. Encoding the pieces apart gives the tokens of the
    whole text wherever the tokenizer splits words at that boundary (byte-level
    BPE does); elsewhere the drafter reads a seam spelled differently, which
    changes its drafts, never the output."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self._text = ""
        self._ids: list[int] = []

    def __call__(self, text: str) -> list[int]:
        if not text.startswith(self._text):
            self._text, self._ids = "", []
        start = len(self._text)
        if len(text) - start > OPEN_CHARACTERS:
            boundary = _word_boundary(text, start, len(text) - SETTLED_DISTANCE)
            if boundary > start:
                self._ids = self._ids + self._codec.encode(text[start:boundary])
                self._text = text[:boundary]
        return self._ids + (
            self._codec.encode(text[len(self._text) :]) if len(text) > len(self._text) else []
        )


def _word_boundary(text: str, start: int, end: int) -> int:
    """The last position in start+1..end where a space follows a non-space
    (`start` where there is none)."""
    position = end
    while position > start + 1:
        position = text.rfind(" ", start + 1, position)
        if position <= start:
            return start
        if not text[position - 1].isspace():
            return position
    return start


class TranslatedDrafter(Drafter):
    """`inner`, a drafter over the drafter model's ids, drafting for the target
    (see the module docstring). `inner` must propose with distributions over
    its own vocabulary (or none, greedy) and honour `allowed` where it has it
    (`ModelDrafter`): a sampled draft from it is drawn only among the shared
    tokens. The target's keys, values and features are not the drafter's
    (another vocabulary is another model): it asks for neither."""

    uses_target_features = False
    uses_target_cache = False

    def __init__(
        self, inner: Drafter, translation: Translation, *, target_width: int | None = None
    ) -> None:
        if inner.uses_target_cache or inner.uses_target_features:
            raise ValueError(
                "a drafter with another tokenizer cannot read the target's keys, values or features"
            )
        self.inner = inner
        self.translation = translation
        self.name = inner.name
        if target_width is None:
            target_width = int(translation.drafter_of_target.shape[0])
        self.width = target_width
        self.vocab_size = target_width
        self._inner_width = inner.width or int(translation.target_of_drafter.shape[0])
        self._target_text = TextOfIds(translation.target)
        self._drafter_ids = IdsOfText(translation.drafter)
        self._context: tuple[list[int], list[int]] = ([], [])  # target ids, drafter ids
        self._proposed: list[int] = []  # the drafter's context and its last draft
        self._shared = translation.shared

    # -- the context -----------------------------------------------------------

    def drafter_ids(self, ids: list[int]) -> list[int]:
        """The drafter's ids for the target's `ids` (the last translation kept)."""
        if ids == self._context[0]:
            return self._context[1]
        if self.translation.by_ids:
            mapped = self.translation.drafter_of_target[torch.tensor(ids, dtype=torch.long)]
            translated = mapped.tolist()
        else:
            translated = self._drafter_ids(self._target_text(ids))
        self._context = (list(ids), translated)
        return translated

    def _inner_sequence(self, sequence: torch.Tensor) -> torch.Tensor:
        ids = self.drafter_ids(sequence.tolist())
        return torch.tensor(ids, dtype=torch.long, device=sequence.device)

    # -- the Drafter interface -----------------------------------------------

    def stop_at(self, end_tokens: frozenset[int]) -> None:
        """The target's end tokens here; the drafter's tokens of the same
        strings to `inner`, so that it stops drafting at the answer's end."""
        super().stop_at(end_tokens)
        mapped = self.translation.drafter_of_target
        inner_ends = {int(mapped[t]) for t in end_tokens if 0 <= t < mapped.shape[0]}
        self.inner.stop_at(frozenset(t for t in inner_ends if t >= 0))

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.vocab_size = min(vocab_size, self.width)
        self.inner.begin(self._inner_sequence(prompt), self._inner_width)

    def forget(self) -> None:
        self.inner.forget()
        self._context = ([], [])
        self._proposed = []

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        return self.inner.offers(self._inner_sequence(sequence), k)

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        if not processor.is_greedy and not self.translation.samples:
            return Draft(sequence.new_empty(0), None)
        inner_sequence = self._inner_sequence(sequence)
        if not processor.is_greedy or self.translation.by_ids:
            return self._token_for_token(
                inner_sequence, sequence, k, processor, generator, min_confidence
            )
        draft = self.inner.propose(inner_sequence, k, processor, generator, min_confidence)
        context, drafted = inner_sequence.tolist(), draft.tokens.tolist()
        self._proposed = context + drafted
        tokens = self._through_text(context, drafted, sequence, k)
        return replace(draft, tokens=tokens[: self.through_end(tokens)], probs=None)

    def _token_for_token(
        self,
        inner_sequence: torch.Tensor,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float,
    ) -> Draft:
        """A draft among the shared tokens, each mapped to the target's id of
        the same string, with its law carried over column by column."""
        # sampled drafts only among shared tokens, so that the law given is the one drawn from
        allowed = None if processor.is_greedy else self._shared
        previous = getattr(self.inner, "allowed", None)
        self._set_allowed(allowed)
        try:
            draft = self.inner.propose(inner_sequence, k, processor, generator, min_confidence)
        finally:
            self._set_allowed(previous)
        self._proposed = inner_sequence.tolist() + draft.tokens.tolist()
        mapped = self.translation.target_of_drafter.to(draft.tokens.device)[draft.tokens]
        if bool((mapped < 0).any()):  # a greedy draft by ids may end on an unshared token
            first = int(torch.nonzero(mapped < 0)[0])
            mapped = mapped[:first]
            draft = replace(draft, probs=None if draft.probs is None else draft.probs[:first])
        kept = self.through_end(mapped)
        probs = None
        if draft.probs is not None:
            probs = self._target_law(draft.probs[:kept])
        return replace(draft, tokens=mapped[:kept].to(sequence.device), probs=probs)

    def _set_allowed(self, allowed: torch.Tensor | None) -> None:
        if not hasattr(self.inner, "allowed"):
            raise ValueError(
                f"the {self.inner.name} drafter cannot draft among a set of tokens, "
                "which sampling with another tokenizer needs"
            )
        self.inner.allowed = allowed  # type: ignore[attr-defined]

    def _target_law(self, probs: torch.Tensor) -> torch.Tensor:
        """Laws over the drafter's ids (rows) as laws over the target's."""
        columns = self._shared.to(probs.device)
        source = self.translation.target_of_drafter.to(probs.device)
        law = probs.new_zeros((probs.shape[0], self.vocab_size))
        targets = source[columns]
        inside = targets < self.vocab_size
        law[:, targets[inside]] = probs[:, columns[inside]]
        return law

    def _through_text(
        self, context: list[int], drafted: list[int], sequence: torch.Tensor, k: int
    ) -> torch.Tensor:
        """The target's ids for the drafter's `drafted` tokens after `context`:
        their text, encoded by the target's tokenizer after the sequence's last
        token; at most `k` (none where the text cannot be placed there)."""
        empty = sequence.new_empty(0)
        if not drafted:
            return empty
        drafter = self.translation.drafter
        anchor = context[-ANCHOR_TOKENS:]
        before = drafter.decode(anchor)
        both = drafter.decode(anchor + drafted)
        if not both.startswith(before):
            return empty
        text = both[len(before) :].rstrip(REPLACEMENT)
        if not text:
            return empty
        ids = self._target_continuation(sequence.tolist(), text)[:k]
        return torch.tensor(ids, dtype=sequence.dtype, device=sequence.device)

    def _target_continuation(self, ids: list[int], text: str) -> list[int]:
        """Target ids that continue `ids` with `text`: encoded after the last
        token's text where that token comes back unchanged, else encoded
        alone where the two decode to the text they should."""
        codec = self.translation.target
        last = ids[-1:]
        last_text = codec.decode(last)
        together = codec.encode(last_text + text)
        if together[: len(last)] == last:
            return together[len(last) :]
        alone = codec.encode(text)
        if alone and codec.decode(last + alone) == last_text + text:
            return alone
        return []

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        now = self.drafter_ids(sequence.tolist())
        same = 0
        for mine, theirs in zip(self._proposed, now, strict=False):
            if mine != theirs:
                break
            same += 1
        self.inner.update(torch.tensor(now, dtype=torch.long, device=sequence.device), same)
