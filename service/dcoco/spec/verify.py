"""Lossless verification of a draft by the target, greedy and sampled, batched over rows.

The target scores [last, d_1..d_B] in one pass, giving B + 1 next-token distributions: row
position i is the target's distribution for the token after d_i (position 0: after `last`).
Every function here takes the randomness it needs as uniforms drawn by the caller, so a seeded
request replays exactly whatever else shares its batch.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    tokens: torch.Tensor  # [R, B+1]; the first accepted + 1 of each row are committed
    accepted: torch.Tensor  # [R] accepted drafted tokens, 0..B


def accepted_prefix(accept: torch.Tensor) -> torch.Tensor:
    """accept [R, B] bool -> length of the all-True prefix [R]."""
    return accept.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [R]


def verify_greedy(logits: torch.Tensor, draft: torch.Tensor) -> Verdict:
    """logits [R, B+1, V], draft [R, B].

    Rule: accept d_i while it equals the target's argmax after d_1..d_{i-1}; the bonus is the
    target's argmax at the first mismatch. Accepted tokens equal the argmax, so the committed
    tokens are simply the target's argmax row.
    """
    target = logits.max(-1).indices  # [R, B+1]; max is faster than argmax on CPU
    return Verdict(tokens=target, accepted=accepted_prefix(draft == target[:, :-1]))


def target_probs(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """logits [R, T, V], temperature and top_p [R] -> the distribution to sample from [R, T, V].

    Greedy rows (temperature 0) get a finite but meaningless distribution; callers mask them.
    """
    scaled = logits.float() / temperature.clamp(min=1e-5)[:, None, None]  # [R, T, V]
    probs = scaled.softmax(-1)  # [R, T, V]
    if bool((top_p < 1.0).any()):
        ordered, order = probs.sort(dim=-1, descending=True)  # [R, T, V] each
        mass_before = ordered.cumsum(-1) - ordered  # [R, T, V]
        ordered = ordered.masked_fill(mass_before >= top_p[:, None, None], 0.0)  # [R, T, V]
        probs = torch.zeros_like(probs).scatter_(-1, order, ordered)  # [R, T, V]
        probs = probs / probs.sum(-1, keepdim=True)  # [R, T, V]
    return probs


def sample(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling. weights [R, V] >= 0 (need not sum to 1), uniforms [R] in [0, 1).

    Returns [R] token ids; a token of zero weight is never returned.
    """
    cdf = weights.cumsum(-1)  # [R, V]
    total = cdf[:, -1:]  # [R, 1]
    point = torch.minimum(uniforms.unsqueeze(1) * total, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True).squeeze(1).clamp(max=weights.shape[-1] - 1)


def verify_sampled(probs: torch.Tensor, draft: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    """probs [R, B+1, V] target distributions, draft [R, B], uniforms [R, B+1].

    Rule (speculative sampling with a one-hot draft distribution q = 1[d_i]): accept d_i with
    probability min(1, p(d_i) / q(d_i)) = p(d_i). At the first rejection, sample from the
    residual max(p - q, 0), which is p with d_i removed, renormalised. If every slot is
    accepted, sample the bonus from p at position B. Each committed token is then distributed
    exactly as the target's own sample.
    """
    rows, slots = draft.shape
    p_draft = probs[:, :slots].gather(-1, draft.unsqueeze(-1)).squeeze(-1)  # [R, B]
    accepted = accepted_prefix(uniforms[:, :slots] < p_draft)  # [R]
    at = accepted.view(rows, 1, 1).expand(rows, 1, probs.shape[-1])  # [R, 1, V]
    residual = probs.gather(1, at).squeeze(1)  # [R, V] the target's distribution there
    rejected = accepted.unsqueeze(1).clamp(max=slots - 1)  # [R, 1] slot of the rejected draft
    rejected_token = draft.gather(1, rejected)  # [R, 1]
    keep = (accepted == slots).unsqueeze(1)  # [R, 1] all accepted: nothing to remove
    kept_mass = residual.gather(1, rejected_token) * keep  # [R, 1]
    residual = residual.scatter(1, rejected_token, kept_mass)  # [R, V]
    last = sample(residual, uniforms[:, slots])  # [R]
    tokens = torch.cat([draft, draft.new_zeros(rows, 1)], dim=1)  # [R, B+1]
    tokens = tokens.scatter(1, accepted.unsqueeze(1), last.unsqueeze(1))  # [R, B+1]
    return Verdict(tokens=tokens, accepted=accepted)


def verify(
    logits: torch.Tensor,
    draft: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    uniforms: torch.Tensor | None,
) -> Verdict:
    """Mixed batch: rows with temperature 0 are verified greedily, the others by sampling.

    logits [R, B+1, V], draft [R, B], temperature and top_p [R], uniforms [R, B+1] (None when
    every row is greedy).
    """
    greedy = verify_greedy(logits, draft)
    if uniforms is None:
        return greedy
    sampled = verify_sampled(target_probs(logits, temperature, top_p), draft, uniforms)
    is_greedy = temperature == 0  # [R]
    return Verdict(
        tokens=torch.where(is_greedy.unsqueeze(1), greedy.tokens, sampled.tokens),  # [R, B+1]
        accepted=torch.where(is_greedy, greedy.accepted, sampled.accepted),  # [R]
    )
