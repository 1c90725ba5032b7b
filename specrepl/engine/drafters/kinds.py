"""Drafters: whatever proposes the tokens that the target then verifies.

Every drafter is a `Drafter` (the interface, with what it needs declared) and
goes through the single verification loop in `generation.py`. A drafter
proposes up to k tokens for the current sequence, with the distributions q it
drew them from (or None for a deterministic drafter: a point mass), and is
told after each step how much of what it saw is still valid. This module never calls the target.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.copy_attention import attend_in_cache_dtype, measure_attention
from specrepl.engine.devices import synchronize
from specrepl.engine.drafters.draft_head import DraftHead, HeadCache, target_fingerprint
from specrepl.engine.drafters.options import DRAFTER_KINDS, DrafterOptions
from specrepl.engine.forward import context_length, forward_logits, logits_width, model_device
from specrepl.engine.kv_cache import (
    cached_length,
    can_copy_positions,
    copy_positions,
    new_cache,
    rollback_to,
)
from specrepl.engine.processors import LogitsProcessor
from specrepl.engine.prompt_cache import PromptCache, common_prefix
from specrepl.engine.results import Offer


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
    one). Both default to False.

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
    uses_target_cache: bool = False

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
        `target_features` (rows, hidden), given to a drafter that
        `uses_target_features`, are the target's final hidden states at the
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


def is_copy_of(model: PreTrainedModel, target: PreTrainedModel) -> bool:
    """Whether `model` holds the target's own weights (in any precision: the
    same fingerprint) on one device, so that it can take the target's keys and
    values (see `ModelDrafter`'s `copy_of_target`)."""
    devices = set(getattr(model, "hf_device_map", {}).values())
    return len(devices) <= 1 and target_fingerprint(model) == target_fingerprint(target)


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


class ModelDrafter(Drafter):
    """A small causal LM that shares the target's tokenizer (or a cheaper copy of the target).

    `copy_of_target` (a copy of the target's own weights, e.g. in bfloat16,
    see `is_copy_of`; with the cache on and no window): after every
    verification the drafter takes the target's keys and values for the
    positions it has not read, cast to its own precision, instead of
    computing them. It never reads a prompt (a cheaper copy may still read a
    long one slower than the target: bfloat16 on a CPU without bfloat16
    arithmetic) nor catches up on tokens it did not draft; in exchange it
    drafts nothing before the target's first pass of a generation. Without a
    target cache (the target runs uncached) it reads for itself.

    On a CPU, a copy in a narrower dtype than the target's may keep the
    target's keys and values uncast and attend in their dtype
    (`copy_attention.py`): at the first copy it times one query over a
    512-token context both ways on this machine (once, ~20 ms) and keeps
    the cheaper; `cache_dtype` forces a choice (the model's own dtype: always
    cast).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        use_cache: bool = True,
        name: str = "model",
        window: int | None = None,
        keep_between_prompts: bool = False,
        copy_of_target: bool = False,
        cache_dtype: torch.dtype | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 or None, got {window}")
        self.model = model
        self.name = name
        self.uses_target_features = False
        self.uses_target_cache = copy_of_target and use_cache and window is None
        self._seeded = False  # this generation takes the target's cache (set by `begin`)
        self.use_cache = use_cache
        self.window = window
        self.device = model_device(model)
        self.width = logits_width(model)
        self.context = context_length(model)
        self.vocab_size = self.width
        self.keep_between_prompts = keep_between_prompts
        self.cache: DynamicCache | None = None
        self.offset = 0
        self._kept = PromptCache()  # the cache between generations, with keep_between_prompts
        self.cache_dtype = cache_dtype
        """The dtype the target's keys and values are kept in (None: not decided yet)."""
        if cache_dtype is not None and cache_dtype != model.dtype:
            self._attend_in(cache_dtype)

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """A `window` lets the drafter read only the prompt's last `window`
        tokens: a long prompt then costs the drafter a short prefill (the
        target still reads all of it, so the output does not change).

        With `keep_between_prompts` (and no window), the cache of the last
        generation is cropped to what the new prompt shares with it."""
        self.vocab_size = vocab_size
        self.offset = 0 if self.window is None else max(0, prompt.shape[0] - self.window)
        if not self.use_cache:
            self.cache = None
        elif self.keep_between_prompts and self.window is None:
            self.cache, _ = self._kept.take(self.model, prompt.tolist())
        else:
            self.cache = new_cache(self.model)
        self._seeded = (
            self.uses_target_cache and self.cache is not None and can_copy_positions(self.cache)
        )

    def forget(self) -> None:
        self.cache = None
        self._kept.drop()

    def _room(self, sequence: torch.Tensor, k: int) -> int:
        """How many of k drafts the drafter can give for `sequence` now."""
        seen = sequence.shape[0] - self.offset
        if self._seeded and seen - cached_length(self.cache) > 1:
            # tokens the target has not read yet: it will, and hand over their keys and values
            return 0
        if self.context is not None:
            # the drafter reads the sequence plus k - 1 of its own drafts
            k = min(k, self.context - seen + 1)
        return max(k, 0)

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        seen = sequence.shape[0] - self.offset
        return [Offer(self.name, self._room(sequence, k), seen - cached_length(self.cache))]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        k = self._room(sequence, k)
        if k <= 0:
            return Draft(sequence.new_empty(0), None)
        context = sequence[self.offset :].to(self.device)
        unread = context.shape[0] - cached_length(self.cache)
        tokens: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        read_seconds = 0.0
        for index in range(k):
            started = time.perf_counter()
            logits = forward_logits(self.model, context, self.cache, 1, self.vocab_size)[0]
            if index == 0:  # the read of what the drafter had not seen
                synchronize(self.device)
                read_seconds = time.perf_counter() - started
            token = next_draft(logits, processor, generator, min_confidence, laws)
            if token is None:
                break
            tokens.append(token)
            context = torch.cat((context, token))
        return replace(
            collect_draft(tokens, laws, sequence), read_seconds=read_seconds, read_tokens=unread
        )

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        rollback_to(self.cache, min(cached_length(self.cache), valid_length - self.offset))
        if self._seeded:
            if target_cache is None or self.cache is None or not can_copy_positions(target_cache):
                self._seeded = False  # read for itself for the rest of this generation
            else:
                copy_positions(
                    target_cache,
                    self.cache,
                    valid_length,
                    dtype=self._copied_dtype(target_cache),
                    device=self.device,
                )
        if self.keep_between_prompts and self.cache is not None and self.window is None:
            self._kept.keep(self.model, self.cache, sequence)

    def _copied_dtype(self, target_cache: DynamicCache) -> torch.dtype:
        """The dtype to keep the target's keys and values in: the copy's own, or
        (decided once, by measurement on a CPU) the target's, attended as such."""
        source = target_cache.layers[0].keys.dtype
        own = self.model.dtype
        if self.cache_dtype is None:
            self.cache_dtype = own
            if source != own and self.device.type == "cpu":
                costs = measure_attention(self.model, source)
                if costs and costs[source] < costs[own]:
                    self._attend_in(source)
        return self.cache_dtype if self.cache_dtype == source else own

    def _attend_in(self, dtype: torch.dtype) -> None:
        """Keep the copied keys and values in `dtype` and attend in it, if the
        model's attention can (else keep casting them to the model's dtype)."""
        self.cache_dtype = dtype if attend_in_cache_dtype(self.model) else self.model.dtype


class HeadDrafter(Drafter):
    """A trained draft head (`draft_head.py`) that drafts from the target's features.

    It reads the target's final hidden state at every position the target
    verified, so it has nothing to propose before the target's first pass
    (the first step of a generation is the target's alone). Its cache holds
    the positions read with the target's own features; draft positions, read
    with the head's guesses, are dropped after every verification and read
    again with the target's features. q is the head's distribution over its
    draft vocabulary, zero elsewhere.
    """

    def __init__(
        self, head: DraftHead, *, name: str = "head", keep_between_prompts: bool = False
    ) -> None:
        self.head = head
        self.name = name
        self.width = None
        self.uses_target_features = True
        self.keep_between_prompts = keep_between_prompts
        self.vocab_size = 0
        self.cache = HeadCache()
        self.real = 0  # positions in the cache read with the target's features
        self.pending: torch.Tensor | None = None  # features not yet read, from position `real`
        self._seen: torch.Tensor | None = None  # the sequence those positions belong to

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        """With `keep_between_prompts`, what the last generation read is cropped
        to what the new prompt shares with it; else the head starts empty."""
        self.vocab_size = vocab_size
        held = 0
        if self.keep_between_prompts and self._seen is not None:
            held = min(common_prefix(self._seen, prompt.tolist()), self.features_held())
        if held == 0:
            self.cache = HeadCache()
            self.real = 0
        elif held < self.real:
            self.real = held
            self.cache.rollback_to(held)
        if self.pending is not None and held > self.real:
            self.pending = self.pending[: held - self.real]
        else:
            self.pending = None
        self._seen = None

    def features_held(self) -> int:
        """Leading positions of the sequence the head has the target's features for."""
        return self.real + (0 if self.pending is None else self.pending.shape[0])

    def forget(self) -> None:
        self.cache = HeadCache()
        self.real, self.pending, self._seen = 0, None, None

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        ready = self.pending is not None and self.features_held() == sequence.shape[0] - 1
        return [Offer(self.name, k if ready else 0)]

    @torch.no_grad()
    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        if self.pending is None or k <= 0 or self.features_held() != sequence.shape[0] - 1:
            # nothing to draft from before the target's first pass of a generation
            return Draft(sequence.new_empty(0), None)
        head = self.head
        device = head.token_ids.device
        features = self.pending.to(device=device, dtype=head.output_rows.dtype)
        count = features.shape[0]
        tokens = sequence[self.real + 1 : self.real + 1 + count].to(device)
        positions = torch.arange(self.real, self.real + count, device=device)
        hidden = head.step(features[None], tokens[None], positions[None], self.cache)[:, -1:]
        self.real += count
        self.pending = None
        drafted: list[torch.Tensor] = []
        laws: list[torch.Tensor] = []
        position = self.real
        for index in range(k):
            token = next_draft(
                head.logits(hidden[0, 0]).float(),
                processor,
                generator,
                min_confidence,
                laws,
                token_ids=head.token_ids,
                vocab_size=self.vocab_size,
            )
            if token is None:
                break
            token = token.to(device)
            drafted.append(token)
            if index + 1 < k:
                hidden = head.step(
                    hidden, token[None], torch.tensor([[position]], device=device), self.cache
                )
                position += 1
        return collect_draft(drafted, laws, sequence)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        if target_features is None:
            raise ValueError("the head drafter needs the target's features after every step")
        start = valid_length - target_features.shape[0]
        known = self.real + (0 if self.pending is None else self.pending.shape[0])
        if start > known:
            raise RuntimeError(
                f"the head drafter has features up to position {known} but was given "
                f"features from {start}: a step was not reported to it"
            )
        if start < self.real:  # the target recomputed positions the head has read
            self.real = start
        self.cache.rollback_to(self.real)
        kept = None if self.pending is None else self.pending[: start - self.real]
        fresh = target_features.detach()
        self.pending = fresh if kept is None or kept.shape[0] == 0 else torch.cat((kept, fresh))
        if self.pending.shape[0] == 0:
            self.pending = None
        self._seen = sequence


def as_drafter(drafter: Drafter | PreTrainedModel, *, use_cache: bool = True) -> Drafter:
    """Wrap a bare model as a ModelDrafter; pass Drafter objects through."""
    if isinstance(drafter, PreTrainedModel):
        return ModelDrafter(drafter, use_cache=use_cache)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(
        f"a drafter must be a transformers causal LM or a Drafter, got {type(drafter).__name__}"
    )


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


class LookupDrafter(Drafter):
    """Prompt lookup decoding: find the last n tokens earlier in the context and
    propose what followed them there (n from max_ngram down to min_ngram).

    Deterministic (a point-mass q); costs no model call.
    """

    def __init__(self, max_ngram: int = DrafterOptions.max_ngram, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.name = "lookup"
        self.width = None
        self.uses_target_features = False
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        pass

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        draft = self.propose(sequence, k, None, None)  # type: ignore[arg-type]
        return [Offer(self.name, len(draft), tokens=tuple(draft.tokens.tolist()))]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        length = sequence.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            suffix = sequence[length - n :]
            # windows that start before the suffix itself and are followed by a token
            windows = sequence[: length - 1].unfold(0, n, 1)
            hits = (windows == suffix).all(dim=1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                return Draft(sequence[start : start + k], None)
        return Draft(sequence.new_empty(0), None)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
    ) -> None:
        pass


class HybridDrafter(Drafter):
    """Prompt lookup where it pays, a model (or a draft head) elsewhere.

    Copying from the context costs no model call and is often right when the
    answer quotes its prompt (summaries, extraction, code edits); elsewhere the
    model drafter is better informed. The hybrid does not choose by itself:
    it offers both sources each step (`offers`: the lookup candidate, from a
    match of at least `min_match` tokens, with its tokens; the model with the
    context it would have to read first), and the gamma policy picks the one
    it expects to give the most tokens per second from what each source's
    drafts have measured (`gamma.StepEstimates`; the lookup candidate is
    scored against the target's tokens even on steps that used the model).
    The model drafter catches up on the tokens it did not draft through its
    cache. `propose` without a source takes the lookup candidate when there
    is one.
    """

    def __init__(
        self, model: Drafter, lookup: LookupDrafter, *, min_match: int = DrafterOptions.min_match
    ) -> None:
        self.model = model
        self.lookup = LookupDrafter(lookup.max_ngram, max(min_match, lookup.min_ngram))
        self.name = "hybrid"
        self.width = model.width
        self.uses_target_features = model.uses_target_features
        self.uses_target_cache = model.uses_target_cache
        self.last_source = "none"
        self._candidate: tuple[torch.Tensor, Draft] | None = None  # lookup's, for one sequence

    def begin(self, prompt: torch.Tensor, vocab_size: int) -> None:
        self.model.begin(prompt, vocab_size)
        self.lookup.begin(prompt, vocab_size)
        self.last_source = "none"
        self._candidate = None

    def features_held(self) -> int:
        return self.model.features_held()

    def forget(self) -> None:
        self.model.forget()

    def _lookup(self, sequence: torch.Tensor, k: int) -> Draft:
        """Lookup's candidate for `sequence` (found once per step)."""
        if self._candidate is not None and self._candidate[0] is sequence:
            return Draft(self._candidate[1].tokens[:k], None)
        draft = self.lookup.propose(sequence, k, None, None)  # type: ignore[arg-type]
        self._candidate = (sequence, draft)
        return draft

    def offers(self, sequence: torch.Tensor, k: int) -> list[Offer]:
        candidate = self._lookup(sequence, k)
        found = [Offer("lookup", len(candidate), tokens=tuple(candidate.tokens.tolist()))]
        # the model first: lookup's candidate is scored on every step whichever is used,
        # the model's drafts only when it drafts
        return [*self.model.offers(sequence, k), *(found if len(candidate) else [])]

    def propose(
        self,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
        *,
        source: str | None = None,
    ) -> Draft:
        candidate = self._lookup(sequence, k)
        if len(candidate) and source in (None, "lookup"):
            self.last_source = "lookup"
            return candidate
        self.last_source = "model"
        return self.model.propose(sequence, k, processor, generator, min_confidence)

    def propose_source(
        self,
        source: str,
        sequence: torch.Tensor,
        k: int,
        processor: LogitsProcessor,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
    ) -> Draft:
        return self.propose(sequence, k, processor, generator, min_confidence, source=source)

    def update(
        self,
        sequence: torch.Tensor,
        valid_length: int,
        target_logits: torch.Tensor | None = None,
        target_features: torch.Tensor | None = None,
        target_cache: DynamicCache | None = None,
    ) -> None:
        self._candidate = None
        extra = {"target_cache": target_cache} if self.uses_target_cache else {}
        self.model.update(sequence, valid_length, target_logits, target_features, **extra)


def build_drafter(
    options: DrafterOptions,
    model: PreTrainedModel | None,
    *,
    head: DraftHead | None = None,
    use_cache: bool = True,
    keep_between_prompts: bool = False,
    copy_of_target: bool = False,
    model_runtime: Drafter | None = None,
) -> Drafter:
    """The drafter `options` describe; `model` is the drafter model, needed by
    the `model` kind and by `hybrid` without a head; `head` the loaded draft
    head, needed by the `head` kind and by `hybrid` with one.
    `model_runtime`: a drafter that runs the drafter model elsewhere (the
    llama.cpp drafter, see `llamacpp_drafter.choose_runtime`), used in place
    of a torch `ModelDrafter` over `model`.
    `keep_between_prompts`: a model or head drafter keeps its cache from one
    generation to the next (a chat). `copy_of_target`: `model` is a copy of the
    target (`is_copy_of`; a loaded pair knows it as `drafter_is_copy`), so the
    model drafter takes the target's keys and values instead of reading for
    itself. Raises ValueError for an unknown kind or
    a missing model or head."""
    if options.kind == "ngram":
        return NgramDrafter(
            options.order, keep_between_prompts=options.keep, top_k_filler=options.filler
        )
    if options.kind == "lookup":
        return LookupDrafter(options.max_ngram)
    if options.kind not in DRAFTER_KINDS:
        raise ValueError(
            f"unknown drafter kind {options.kind!r}; choose one of: {', '.join(DRAFTER_KINDS)}"
        )
    inner: Drafter
    if options.needs_head:
        if head is None:
            raise ValueError(f"the {options.kind} drafter needs a draft head, and none is loaded")
        inner = HeadDrafter(head, keep_between_prompts=keep_between_prompts)
    elif model_runtime is not None:
        inner = model_runtime
    else:
        if model is None:
            raise ValueError(
                f"the {options.kind} drafter needs a drafter model, and none is loaded"
            )
        inner = ModelDrafter(
            model,
            use_cache=use_cache,
            window=options.window or None,
            keep_between_prompts=keep_between_prompts,
            copy_of_target=copy_of_target,
        )
    if options.kind == "hybrid":
        return HybridDrafter(inner, LookupDrafter(options.max_ngram), min_match=options.min_match)
    return inner
