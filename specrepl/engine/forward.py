"""One forward pass of a causal LM over the part of a sequence it has not cached.

Both generators and the model drafter call `forward_logits`; it is the only
place that calls a model. A caller passes the model's `Tuning` (its width
plan, linear forms and attention), which the pass reads and never changes;
the model takes that tuning for the length of the call only
(`Tuning.running`) and is the stock model again after it, also after an
error or an interrupt. It knows nothing about drafting or acceptance.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from specrepl.engine.kv_cache import cached_length, rollback_to
from specrepl.engine.placement import input_device
from specrepl.engine.tuning import Tuning


def logits_width(model: PreTrainedModel) -> int:
    """Number of logits the model emits per position (its padded vocabulary)."""
    head = model.get_output_embeddings()
    width = getattr(head, "out_features", None)  # also right for packed 4-bit weights
    if isinstance(width, int):
        return width
    weight = getattr(head, "weight", None)
    if weight is not None and weight.dim() == 2:
        return int(weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def context_length(model: PreTrainedModel) -> int | None:
    """The model's maximum number of positions, when its config states one."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_device(model: PreTrainedModel) -> torch.device:
    """Where the model's input ids go (`placement.input_device`: the input
    embeddings' device, also for a model split over devices or offloaded)."""
    return input_device(model)


def forward_logits(
    model: PreTrainedModel,
    sequence: torch.Tensor,
    cache: DynamicCache | None,
    keep: int,
    vocab_size: int,
    *,
    tuning: Tuning | None = None,
) -> torch.Tensor:
    """Float logits of the last `keep` positions of `sequence`, shape (keep, vocab_size)
    (see `forward_pass`)."""
    return forward_pass(model, sequence, cache, keep, vocab_size, tuning=tuning)[0]


@torch.no_grad()
def forward_pass(
    model: PreTrainedModel,
    sequence: torch.Tensor,
    cache: DynamicCache | None,
    keep: int,
    vocab_size: int,
    *,
    features: bool = False,
    feature_layers: tuple[int, ...] = (),
    tuning: Tuning | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits of the last `keep` positions of `sequence`, shape (keep, vocab_size),
    and, when `features` is set, the model's final hidden states (the input of
    its output layer) at every position fed, shape (fed, hidden); else None.
    With `feature_layers` the outputs of those decoder layers come first:
    (fed, hidden x (len(feature_layers) + 1)).

    With a cache, only the tokens it does not hold yet are fed (positions come
    from the cache's length); without one the whole sequence is recomputed.
    Logits beyond `vocab_size` (padding rows of the output layer) are dropped.
    A model whose `tuning` has a width plan (`widths.py`) is fed extra copies
    of the last token when a wider pass is cheaper; they never reach the cache
    or the result. Its linear layers multiply in the form the plan measured
    cheapest for the width fed (`linear_forms.py`), and it attends with the
    tuning's attention. Without a tuning, every pass is fed as it is, in the
    stock form.
    """
    tuning = Tuning() if tuning is None else tuning  # untuned: as fed, stock form
    start = cached_length(cache)
    length = sequence.shape[0]
    if start >= length:
        raise RuntimeError(
            f"cache holds {start} tokens but the sequence has {length}: nothing to feed"
        )
    fed = sequence[start:]
    pad = 0 if cache is None else tuning.padded_width(length - start) - fed.shape[0]
    if pad:
        limit = context_length(model)
        if limit is not None and length + pad > limit:
            pad = 0  # never feed positions past the context
    if pad:  # a wider pass is cheaper here (see widths.py); the padding is cut off again
        fed = torch.cat((fed, fed[-1:].expand(pad)))
    with tuning.running(model):
        output = model(
            input_ids=fed.unsqueeze(0).to(input_device(model)),
            past_key_values=cache,
            use_cache=cache is not None,
            logits_to_keep=keep + pad,
            output_hidden_states=features,
        )
    if pad:
        rollback_to(cache, length)
    logits = output.logits[0, -(keep + pad) : output.logits.shape[1] - pad, :vocab_size]
    # read where the sequence is: a split model's logits land where its last layer ran
    logits = logits.to(sequence.device)
    if not features:
        return logits, None
    hidden = selected_features(output.hidden_states, feature_layers)[0]
    return logits, hidden[: hidden.shape[0] - pad].to(sequence.device)


def selected_features(
    hidden_states: tuple[torch.Tensor, ...], feature_layers: tuple[int, ...]
) -> torch.Tensor:
    """The outputs of `feature_layers` (indices into `hidden_states`: 0 is the
    embedding, i the output of decoder layer i) and the final hidden state,
    side by side on the last axis."""
    if not feature_layers:
        return hidden_states[-1]
    return torch.cat([hidden_states[i] for i in feature_layers] + [hidden_states[-1]], dim=-1)
