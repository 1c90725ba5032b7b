"""The drafter interface: what every drafter is, and the helpers drafters share.

Every drafter is a `Drafter` (the interface, with what it needs declared) and
goes through the single verification loop in `generation.py`. A drafter
proposes up to k tokens for the current sequence, with the distributions q it
drew them from (or None for a deterministic drafter: a point mass), and is
told after each step how much of what it saw is still valid. `next_draft` and
`collect_draft` turn a drafter's logits into draft tokens and a `Draft`.

This module knows no kind of drafter and never calls the target.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["Draft", "Drafter", "collect_draft", "next_draft"]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens (k,) and, when the drafter samples, their laws q (k, vocab).

    `read_seconds` of the drafting went to reading `read_tokens` context
    tokens the drafter had not seen (the read that also gives the first
    draft's logits); a drafter that reads nothing leaves both at 0.
    `import_seconds` went to taking the target's keys and values for
    `imported_tokens` positions instead of reading them (a copy of the target
    in llama.cpp, `llamacpp_kv`)."""

    tokens: torch.Tensor
    probs: torch.Tensor | None
    read_seconds: float = 0.0
    read_tokens: int = 0
    import_seconds: float = 0.0
    imported_tokens: int = 0

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(ABC):
    """The interface the speculative loop drives, with what a drafter needs
    declared on it (the loop reads these, never probes for attributes).

    `name` names the drafter (and its one draft source); `width` is the number
    of logits the drafter's distributions cover (None: no such limit): the
    loop compares only that many of the target's. A drafter declares
    `uses_target_features` to get the target's final hidden states in
    `update` as `target_features` (they cost nothing to keep, but only a
    drafter that reads them gets them), and `uses_target_cache` to get the
    target's KV cache as `target_cache` (None when the target runs without
    one). Both default to False. `feature_layers` names earlier decoder layers
    whose outputs come in `target_features` before the final hidden state
    (EAGLE-3's fused features; default none).

    `end_tokens` are the tokens after which nothing a draft proposes can be
    kept (the generation's end tokens: the answer stops at one). The loop
    gives them with `stop_at` before `begin`; a drafter that reads its drafts
    as host integers anyway stops drafting after proposing one, so that no
    draft is paid for, or verified, past the end of the answer. The output
    does not depend on it (a shorter draft is verified as any other).

    Three hooks have defaults that do nothing special: `forget()`, called
    when a generation is interrupted or fails (a drafter that keeps state from
    one generation to the next, a chat, drops what may hold half a step);
    `features_held()`, for a drafter that reads the target's features: after
    `begin`, how many leading positions of the prompt it already holds
    features for (the target then re-uses at most that many from a kept
    cache, see `PromptCache`; default 0); and `offers(sequence, k)`: what it
    can propose now, as `Offer`s (one per draft source; a hybrid has two),
    with the context it would have to read first, so that the gamma policy
    can price each before choosing (default: one offer of k tokens). A
    drafter with several sources takes the chosen one in `propose_source`.
    """

    name: str = "drafter"
    width: int | None = None
    uses_target_features: bool = False
    feature_layers: tuple[int, ...] = ()
    uses_target_cache: bool = False
    end_tokens: frozenset[int] = frozenset()

    def stop_at(self, end_tokens: frozenset[int]) -> None:
        """Draft nothing past the first of `end_tokens` (see the class)."""
        self.end_tokens = frozenset(end_tokens)

    def through_end(self, tokens: torch.Tensor) -> int:
        """How many of `tokens` (proposed ids, read back once) come up to and
        with the first end token; all of them where none is among them."""
        if self.end_tokens:
            for index, token in enumerate(tokens.tolist()):
                if token in self.end_tokens:
                    return index + 1
        return int(tokens.shape[0])

    @abstractmethod
    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """Start a new generation for `prompt` (1-D token ids)."""

    @abstractmethod
    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        """Up to k tokens that may follow `sequence` (1-D ids, the whole context).

        A drafter with distributions stops early when its most likely next
        token has probability below `min_confidence`; others ignore it."""

    @abstractmethod
    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        """After verification: `sequence` is the new context; its first
        `valid_length` tokens are ones the drafter already saw unchanged.

        `target_logits` (rows, vocab), when given, are the target's raw logits
        for the last `rows` tokens of `sequence`: row i is the target's view of
        the token at position len(sequence) - rows + i, given the tokens before it.
        `target_features` (rows, hidden x (len(feature_layers) + 1)), given to
        a drafter that `uses_target_features`, are the outputs of its
        `feature_layers` and the target's final hidden states at the
        positions it computed this step that verification kept: row i is
        position valid_length - rows + i. `target_cache`, given to a drafter
        that `uses_target_cache`, holds the target's keys and values for the
        first `valid_length` tokens (read it during the call; it changes after)."""

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        """What the drafter can propose for `sequence`, at most k tokens a source."""
        return [Offer(self.name, k)]

    def propose_source(
        self,
        source: str,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        """`propose`, from the chosen `source` (one of `offers`' names); a
        drafter with one source has nothing to choose."""
        return self.propose(sequence, k, processor, generator, min_confidence)

    def forget(self) -> None:  # noqa: B027 (a hook: most drafters keep nothing to drop)
        """Drop what a failed or interrupted generation may have left half done."""

    def features_held(self) -> int:
        """Leading prompt positions whose target features the drafter holds."""
        return 0


def next_draft(
    logits: torch.Tensor,
    processor: LogitsProcessor,
    generator: torch.Generator | None,
    min_confidence: float,
    laws: list[torch.Tensor],
    *,
    token_ids: torch.Tensor | None = None,
    vocab_size: int = 0,
) -> torch.Tensor | None:
    """The next draft token (shape (1,)) from a drafter's logits: the argmax
    (greedy), or a sample from `processor`'s law over the vocabulary, which is
    appended to `laws` for the rejection test. None when the drafter's top
    probability is below `min_confidence` (the draft stops there).

    `logits` cover the whole vocabulary, or only `token_ids` (a head's
    subset: q is zero elsewhere, and only a sampled law is widened to
    `vocab_size`)."""
    if processor.is_greedy:
        if min_confidence > 0 and float(torch.softmax(logits, -1).max()) < min_confidence:
            return None
        index = torch.argmax(logits, dim=-1, keepdim=True)
        return index if token_ids is None else token_ids[index]
    if token_ids is not None:
        full = logits.new_full((vocab_size,), float("-inf"))
        full[token_ids] = logits
        logits = full
    probs = processor.probabilities(logits)
    if min_confidence > 0 and float(probs.max()) < min_confidence:
        return None
    laws.append(probs)
    return processor.sample(probs, generator).reshape(1)


def collect_draft(
    tokens: list[torch.Tensor], laws: list[torch.Tensor], sequence: torch.Tensor
) -> Draft:
    """The drafted tokens and their laws (none for greedy) on the sequence's device."""
    if not tokens:
        return Draft(sequence.new_empty(0), None)
    device = sequence.device
    return Draft(torch.cat(tokens).to(device), torch.stack(laws).to(device) if laws else None)
