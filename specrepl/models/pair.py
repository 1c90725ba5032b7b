"""A loaded model pair: a target, an optional drafter and the target's tokenizer.

`ModelPair` checks that the models fit together before any generation: one
device, and vocabularies the drafts can be carried across (`vocabularies.py`:
one tokenizer, or a translation between two), and finds every token that
ends an answer. Loading the models is `loading.py`'s; wrapping models built
in memory (`ModelPair.from_models`) runs the same checks.

This module knows nothing about decoding, settings or the terminal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from specrepl.engine.drafters.model import is_copy_of
from specrepl.engine.drafters.translated import Translation
from specrepl.engine.forward import context_length
from specrepl.models.loaded import LoadedModel
from specrepl.models.tuning import choose_copy_attention, choose_grouped_attention
from specrepl.models.vocabularies import VocabularyMatch, match_vocabularies

__all__ = ["DEFAULT_CONTEXT_LENGTH", "ModelPair", "find_end_tokens"]

DEFAULT_CONTEXT_LENGTH = 2048
_END_MARKER = "specrepl end-of-turn probe 7f3a"


@dataclass
class ModelPair:
    """A target, an optional drafter and the one tokenizer both decode with.

    `vocab_size` is the width both generators slice logits to: the length of
    the target's tokenizer, which the target's logits cover. `vocabulary`
    says how the drafter's vocabulary relates to it (`vocabularies.py`: one
    tokenizer, the same strings under other ids, or different tokenizers with
    the translation between them; None without a drafter model). A drafter
    loaded from the same spec as the target is the target's `LoadedModel`
    itself, so both roles share one model and one tuning.
    """

    target: LoadedModel
    drafter: LoadedModel | None
    tokenizer: PreTrainedTokenizerBase
    vocab_size: int
    eos_token_ids: list[int]
    context_length: int
    device: torch.device
    drafter_is_copy: bool = False
    """The drafter holds the target's own weights (in another precision), so it
    takes the target's keys and values instead of reading prompts
    (`drafters.model.is_copy_of`). Its passes may then attend in the
    target's dtype (recorded in `drafter.tuning`)."""
    vocabulary: VocabularyMatch | None = None
    """How the drafter model's vocabulary relates to the target's."""
    drafter_tokenizer: PreTrainedTokenizerBase | None = None
    """The drafter model's own tokenizer where it is not the target's."""

    @property
    def translation(self) -> Translation | None:
        """The translation between the drafter's ids and the target's (None:
        one tokenizer, or no drafter model)."""
        return None if self.vocabulary is None else self.vocabulary.translation

    def generation_options(self, *, use_cache: bool, seed: int | None = None) -> dict[str, Any]:
        """The keyword arguments every generator call on this pair shares: its
        end tokens, the vocabulary width, the cache switch and, given a `seed`,
        a sampling generator seeded on the pair's device."""
        options: dict[str, Any] = {
            "eos_tokens_id": self.eos_token_ids,
            "use_cache": use_cache,
            "vocab_size": self.vocab_size,
        }
        if seed is not None:
            options["generator"] = torch.Generator(device=self.device).manual_seed(seed)
        return options

    @classmethod
    def from_models(
        cls,
        target_model: PreTrainedModel,
        drafter_model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        *,
        drafter_tokenizer: PreTrainedTokenizerBase | None = None,
        target_name: str = "target",
        drafter_name: str = "drafter",
    ) -> ModelPair:
        """Wrap models already built in memory; runs the same checks as `load_pair`.

        Raises IncompatibleTokenizersError when either model's logits do not
        cover its tokenizer or the drafter's tokenizer cannot write the
        target's text (`vocabularies.match_vocabularies`), ValueError when the two
        models are on different devices.
        """
        target = LoadedModel.wrap(target_model, name=target_name, kind="memory")
        drafter = None
        if drafter_model is target_model:  # one model, one tuning (as `load_pair` shares it)
            drafter = target
        elif drafter_model is not None:
            drafter = LoadedModel.wrap(drafter_model, name=drafter_name, kind="memory")
        return cls.assemble(target, drafter, tokenizer, drafter_tokenizer)

    @classmethod
    def assemble(
        cls,
        target: LoadedModel,
        drafter: LoadedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        drafter_tokenizer: PreTrainedTokenizerBase | None,
    ) -> ModelPair:
        """The pair of two loaded models, checked (see `from_models`). A drafter
        that is a copy of the target chooses here, on a CPU, the attention it
        drafts with (`tuning.choose_copy_attention`), and each model with grouped
        key/value heads whether it keeps them grouped in passes of several
        tokens (`tuning.choose_grouped_attention`), both timed. A model that is
        split or offloaded (`LoadedModel.offloaded`) is not tuned. The pair's
        device is where the target's inputs go; a drafter must be there too."""
        if drafter is not None and not _same_device(drafter.device, target.device):
            raise ValueError(
                f"the target is on {target.device} and the drafter on {drafter.device}: "
                "both models must be on one device"
            )
        vocab_size, vocabulary = match_vocabularies(
            tokenizer,
            drafter_tokenizer,
            target_logits=target.logits_width,
            drafter_logits=None if drafter is None else drafter.logits_width,
        )
        shared = vocabulary is None or vocabulary.kind == "one"
        copy = shared and drafter is not None and is_copy_of(drafter.model, target.model)
        if copy and drafter is not None:
            choose_copy_attention(drafter.model, drafter.tuning, target.dtype)
        if not target.offloaded:
            choose_grouped_attention(target.model, target.tuning)
        if drafter is not None and drafter is not target and not drafter.offloaded:
            choose_grouped_attention(drafter.model, drafter.tuning)
        return cls(
            target=target,
            drafter=drafter,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            eos_token_ids=find_end_tokens(tokenizer, target.model.generation_config),
            context_length=context_length(target.model) or DEFAULT_CONTEXT_LENGTH,
            device=target.device,
            drafter_is_copy=copy,
            vocabulary=vocabulary,
            drafter_tokenizer=None if shared else drafter_tokenizer,
        )


def _same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` are one device (a placed model names the index)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def find_end_tokens(
    tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None = None
) -> list[int]:
    """Every id that ends an answer, in order of discovery, without repeats.

    The tokenizer's eos, the generation config's eos (an int or a list) and the
    chat template's end-of-turn token, found by rendering a short exchange and
    taking the first added or special token after the assistant's text.
    """
    found: list[int] = []
    found += _ids(tokenizer.eos_token_id)
    if generation_config is not None:
        found += _ids(getattr(generation_config, "eos_token_id", None))
    end_of_turn = _end_of_turn_token(tokenizer)
    if end_of_turn is not None:
        found.append(end_of_turn)
    return list(dict.fromkeys(found))


def _end_of_turn_token(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The first added or special token the chat template puts after an assistant turn."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": _END_MARKER},
    ]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # a template may refuse this exchange; then there is nothing to learn
        return None
    if not isinstance(rendered, str) or _END_MARKER not in rendered:
        return None
    after = rendered[rendered.rindex(_END_MARKER) + len(_END_MARKER) :]
    candidates = _token_strings(tokenizer)
    best: tuple[int, int, str] | None = None
    for token in candidates:
        position = after.find(token)
        if position >= 0 and (best is None or (position, -len(token)) < best[:2]):
            best = (position, -len(token), token)
    if best is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(best[2])
    return token_id if isinstance(token_id, int) else None


def _token_strings(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The strings of the tokenizer's added and special tokens."""
    strings = {str(token) for token in tokenizer.all_special_tokens}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    strings.update(str(token) for token in decoder.values())
    return {s for s in strings if s}


def _ids(value: int | Iterable[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(v) for v in value if v is not None]
