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
has mass, and every token drawn has p > 0. Greedy verification reads the
target's logits through `usable_logits`: a NaN is never the argmax, and a
position with no finite logit raises `UnusableLogitsError`.
"""

from __future__ import annotations

import torch

from specrepl.engine.processors import usable_logits

__all__ = ["residual_distribution", "verify_greedy", "verify_sampling"]


def verify_greedy(drafts: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Exact greedy check: accept while draft == argmax of the target.

    `drafts`: (gamma,) token ids; `target_logits`: (gamma + 1, vocab), any float dtype.
    Raises UnusableLogitsError when a position has no finite logit.
    """
    choices = torch.argmax(usable_logits(target_logits), dim=-1)
    gamma = drafts.shape[0]
    matches = (choices[:gamma] == drafts).to(torch.int64)
    accepted = int(torch.cumprod(matches, dim=0).sum()) if gamma else 0
    return accepted, int(choices[accepted])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), the law of the target's token after a rejection.

    If nothing is left (p <= q everywhere, as when p == q), p itself is
    returned: a rejection then had probability ~0, and p is the right law in
    the limit. Either way every token with mass has p > 0.
    """
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    if not bool(total > 0):
        return p
    return residual / total


def verify_sampling(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Speculative rejection sampling over all draft positions at once.

    `drafts`: (gamma,); `draft_probs` q: (gamma, vocab); `target_probs` p:
    (gamma + 1, vocab). Returns (accepted drafts, the target's token).
    """
    gamma = drafts.shape[0]
    if gamma:
        positions = torch.arange(gamma, device=drafts.device)
        p_of_draft = target_probs[positions, drafts]
        q_of_draft = draft_probs[positions, drafts]
        u = torch.rand(gamma, generator=generator, device=target_probs.device)
        # accept iff u < p/q, written without a division (q(x) > 0 for a drawn x)
        keep = (u * q_of_draft < p_of_draft).to(torch.int64)
        accepted = int(torch.cumprod(keep, dim=0).sum())
    else:
        accepted = 0
    if accepted < gamma:
        law = residual_distribution(target_probs[accepted], draft_probs[accepted])
    else:
        law = target_probs[gamma]
    token = torch.multinomial(law, 1, generator=generator)
    return accepted, int(token)
