"""The verification step of speculative decoding, as small pure functions.

Given the drafts x_1..x_gamma, the drafter's distributions q_1..q_gamma and the
target's distributions p_1..p_{gamma+1} at the same positions, decide how many
drafts to keep and which token the target adds (Leviathan et al. 2023, Alg. 1;
Chen et al. 2023):

- greedy: keep drafts while they equal the target's argmax, then add the
  target's argmax at the first mismatch (or after the last draft);
- sampling: keep x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
  rejection sample from norm(max(0, p_i - q_i)); if every draft is kept sample
  a bonus token from p_{gamma+1}.

A deterministic drafter passes a one-hot q (a point mass), which keeps the
sampling step lossless. These functions know nothing about models or caches;
they return the number of accepted drafts and the target's token.

Numerics: the acceptance test is written without p / q (a draft the drafter
gave probability 0 is kept iff p > 0), the residual is only normalised when it
has mass, and every token drawn has p > 0. Greedy verification never takes a
NaN for the argmax, and a position with no finite logit raises
`UnusableLogitsError`.

One read a step: `greedy_verdict` and `sampling_verdict` decide on the
logits' device and bring back, in one read, the number kept, the target's
token and the drafts as host integers (a `Verdict`), with the token also left
on the device for the sequence; on a GPU that read is the step's one wait for
the device. `verify_greedy` and `verify_sampling` are the same decisions,
returning the two numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specrepl.engine.processors import usable_logits

__all__ = [
    "Verdict",
    "greedy_verdict",
    "residual_distribution",
    "sampling_verdict",
    "verify_greedy",
    "verify_sampling",
]


@dataclass(frozen=True)
class Verdict:
    """What verification decided, read back in one go."""

    accepted: int
    """How many drafts the target keeps."""
    token: int
    """The token the target adds after them."""
    drafts: list[int]
    """Every draft, as host integers."""
    token_tensor: torch.Tensor
    """`token` as a (1,) tensor on the logits' device, never read back."""


def greedy_verdict(drafts: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Exact greedy check: accept while draft == argmax of the target.

    `drafts`: (gamma,) token ids; `target_logits`: (gamma + 1, vocab), any float dtype.
    A NaN is never the argmax; a +inf is (the first). Raises UnusableLogitsError
    when a position has no finite logit.

    One pass over the logits: each row's largest value and where it is. A row
    whose largest is finite holds no NaN and no infinity above it, so that is
    its argmax; only a row whose largest is not (NaN or an infinity: rare, a
    half-precision overflow) is resolved again, after the read."""
    values, choices = torch.max(target_logits, dim=-1)
    gamma = drafts.shape[0]
    finite = torch.isfinite(values).to(torch.long)
    read = torch.cat((choices, finite, drafts.to(choices.device, torch.long))).tolist()
    targets, drafted = read[: gamma + 1], read[2 * gamma + 2 :]
    if not all(read[gamma + 1 : 2 * gamma + 2]):
        choices = torch.argmax(usable_logits(target_logits), dim=-1)  # resolves, or refuses
        targets = choices.tolist()
    accepted = 0
    while accepted < gamma and drafted[accepted] == targets[accepted]:
        accepted += 1
    return Verdict(accepted, targets[accepted], drafted, choices[accepted : accepted + 1])


def verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """`greedy_verdict`'s number of drafts kept and the target's token."""
    verdict = greedy_verdict(drafts, target_logits)
    return verdict.accepted, verdict.token


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), the law of the target's token after a rejection.

    If nothing is left (p <= q everywhere, as when p == q), p itself is
    returned: a rejection then had probability ~0, and p is the right law in
    the limit. Either way every token with mass has p > 0. Nothing is read
    back from the device."""
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    return torch.where(total > 0, residual / torch.where(total > 0, total, 1.0), p)


def sampling_verdict(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    usable: torch.Tensor | None = None,
) -> Verdict | None:
    """Speculative rejection sampling over all draft positions at once.

    `drafts`: (gamma,); `draft_probs` q: (gamma, vocab); `target_probs` p:
    (gamma + 1, vocab). `usable` (a one-element bool tensor, from
    `LogitsProcessor.unread_probabilities`) says whether p is right: read
    with the rest; where it was not, a stand-in was drawn from and None is
    returned (the caller decides again from checked probabilities)."""
    gamma = drafts.shape[0]
    device = target_probs.device
    if gamma:
        positions = torch.arange(gamma, device=drafts.device)
        p_of_draft = target_probs[positions, drafts]
        q_of_draft = draft_probs[positions, drafts]
        u = torch.rand(gamma, generator=generator, device=device)
        # accept iff u < p/q, written without a division (q(x) > 0 for a drawn x)
        keep = (u * q_of_draft < p_of_draft).to(torch.int64)
        accepted = torch.cumprod(keep, dim=0).sum().reshape(1)
        row = accepted.clamp(max=gamma - 1)
        residual = residual_distribution(
            target_probs.index_select(0, row)[0], draft_probs.index_select(0, row)[0]
        )
        law = torch.where(accepted < gamma, residual, target_probs[gamma])
    else:
        accepted = torch.zeros(1, dtype=torch.int64, device=device)
        law = target_probs[0]
    if usable is not None:  # p not right: draw from a stand-in, decided again after the read
        law = torch.where(usable, law, torch.ones_like(law))
    token = torch.multinomial(law, 1, generator=generator)
    flag = torch.ones(1, dtype=torch.int64, device=device) if usable is None else usable
    parts = (accepted, token, flag.reshape(1).to(torch.int64), drafts.to(device, torch.long))
    read = torch.cat(parts).tolist()
    if not read[2]:
        return None
    return Verdict(read[0], read[1], read[3:], token)


def verify_sampling(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """`sampling_verdict`'s number of drafts kept and the target's token."""
    verdict = sampling_verdict(drafts, draft_probs, target_probs, generator)
    assert verdict is not None  # no `usable` given: p is taken as it is
    return verdict.accepted, verdict.token
