"""The n-gram drafter: counts of k-grams from the prompt and everything generated.

It costs no model call and proposes deterministically (a point-mass q). It
knows nothing of the other kinds of drafter or of settings (its defaults are
`DrafterOptions`').
"""

from __future__ import annotations

import torch

from specrepl.engine.drafters.base import Draft, Drafter
from specrepl.engine.drafters.options import DrafterOptions
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.results import Offer

__all__ = ["NgramDrafter"]


class NgramDrafter(Drafter):
    """Counts of k-grams (k = 2..max_order) from the prompt and everything generated.

    Proposes, token after token, the most frequent continuation of the longest
    context it has seen, and stops when no context matches. Deterministic: q is
    a point mass, so speculative sampling stays lossless. `keep_between_prompts`
    keeps the counts from one generation to the next (a chat); otherwise every
    generation starts empty. With `top_k_filler` k > 1, every position the
    target verified also adds one count for each of the target's k most likely
    tokens there, so the table learns the target's alternatives and not only
    the one token it chose.
    """

    def __init__(
        self,
        max_order: int = DrafterOptions.order,
        *,
        keep_between_prompts: bool = DrafterOptions.keep,
        top_k_filler: int = DrafterOptions.filler,
    ) -> None:
        if max_order < 2:
            raise ValueError(f"max_order must be >= 2, got {max_order}")
        if top_k_filler < 1:
            raise ValueError(f"top_k_filler must be >= 1, got {top_k_filler}")
        self.name = "ngram"
        self.width = None
        self.uses_target_features = False
        self.max_order = max_order
        self.keep_between_prompts = keep_between_prompts
        self.top_k_filler = top_k_filler
        # context tuple -> {next token: count}; best continuation kept alongside
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.best: dict[tuple[int, ...], tuple[int, int]] = {}
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.counts.clear()
        self.best.clear()
        self.tokens = []

    def _count(self, end: int, token: int) -> None:
        """One more sighting of `token` after every context ending before `end`."""
        tokens = self.tokens
        for order in range(1, min(self.max_order - 1, end) + 1):
            context = tuple(tokens[end - order : end])
            followers = self.counts.setdefault(context, {})
            count = followers.get(token, 0) + 1
            followers[token] = count
            best = self.best.get(context)
            if best is None or count >= best[0]:
                self.best[context] = (count, token)

    def _add(self, new_tokens: list[int]) -> None:
        """Count the k-grams that end at each new token."""
        for token in new_tokens:
            self.tokens.append(token)
            self._count(len(self.tokens) - 1, token)

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        if not self.keep_between_prompts:
            self.reset()
        self.tokens = []
        self._add(prompt.tolist())

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        return [Offer(self.name, k)]

    def _continuation(self, tokens: list[int]) -> int | None:
        for order in range(min(self.max_order - 1, len(tokens)), 0, -1):
            best = self.best.get(tuple(tokens[-order:]))
            if best is not None:
                return best[1]
        return None

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        context = self.tokens[-(self.max_order - 1) :]
        drafts: list[int] = []
        for _ in range(k):
            token = self._continuation(context)
            if token is None:
                break
            drafts.append(token)
            if token in self.end_tokens:
                break  # nothing after the answer's end is kept
            context = (
                [*context[1:], token] if len(context) >= self.max_order - 1 else [*context, token]
            )
        return Draft(torch.tensor(drafts, dtype=torch.long, device=sequence.device), None)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        seen = len(self.tokens)
        if sequence.shape[0] > seen:
            self._add(sequence[seen:].tolist())
        if self.top_k_filler > 1 and target_logits is not None and target_logits.shape[0]:
            rows = target_logits.shape[0]
            k = min(self.top_k_filler, target_logits.shape[-1])
            likely = torch.topk(target_logits.float(), k, dim=-1).indices.tolist()
            first = len(self.tokens) - rows
            for row, candidates in enumerate(likely):
                for token in reversed(candidates):  # a tie goes to the latest: the likeliest
                    self._count(first + row, token)
