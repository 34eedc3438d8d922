"""Lossless verification of a draft by the target, greedy and sampled, batched over rows.

The target scores [last, d_1..d_B] in one pass, giving B + 1 next-token distributions: row
position i is the target's distribution for the token after d_i (position 0: after `last`).
Every function here takes the randomness it needs as uniforms drawn by the caller, one per
position, so a seeded request replays exactly whatever else shares its batch.
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
    below = total.nextafter(torch.zeros_like(total))  # [R, 1], the largest float under total
    point = torch.minimum(uniforms.unsqueeze(1) * total, below)  # [R, 1]
    found = torch.searchsorted(cdf, point, right=True).squeeze(1)  # [R]
    return found.clamp(max=weights.shape[-1] - 1)  # [R]


def verify_sampled(probs: torch.Tensor, draft: torch.Tensor, uniforms: torch.Tensor) -> Verdict:
    """probs [R, B+1, V] target distributions, draft [R, B], uniforms [R, B+1].

    Rule: the target samples every position by inverse CDF from that position's uniform; a
    drafted token is accepted while it equals the target's sample, and the bonus is the sample
    at the first mismatch. For a one-hot draft distribution q = 1[d_i] this accepts d_i with
    probability p(d_i), as speculative sampling's min(1, p/q) test does, and every committed
    token is the target's own sample. So the committed tokens depend on the uniforms alone, not
    on the draft: with uniforms keyed by output position (`engine/uniforms.py`), speculative
    output is plain sampled output, whatever was drafted, verified or batched alongside.
    """
    rows, width, vocab = probs.shape
    flat = sample(probs.reshape(rows * width, vocab), uniforms.reshape(rows * width))  # [R*(B+1)]
    tokens = flat.view(rows, width)  # [R, B+1]
    return Verdict(tokens=tokens, accepted=accepted_prefix(draft == tokens[:, :-1]))


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
