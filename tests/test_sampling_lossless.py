"""Speculative sampling through the whole engine matches the target's own sampling."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.verify import target_probs
from factories import make_drafter, make_target

VOCAB, PROMPT, LENGTH, SAMPLES = 5, [1, 3, 0, 2], 3, 6000


@torch.no_grad()
def exact_distribution(target: CausalLM, temperature: float, top_p: float) -> torch.Tensor:
    """P(first LENGTH tokens) [V**LENGTH], by enumerating every continuation."""
    paths = list(itertools.product(range(VOCAB), repeat=LENGTH))
    ids = torch.tensor([PROMPT + list(p) for p in paths])  # [V^L, P+L]
    hidden, _ = target(ids, torch.arange(ids.shape[1]).expand_as(ids))
    logits = target.logits(hidden[:, len(PROMPT) - 1 : -1])  # [V^L, L, V]
    rows = len(paths)
    probs = target_probs(logits, torch.full((rows,), temperature), torch.full((rows,), top_p))
    chosen = probs.gather(-1, ids[:, len(PROMPT) :].unsqueeze(-1)).squeeze(-1)  # [V^L, L]
    return chosen.double().prod(dim=1)  # [V^L]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "temperature", "top_p", "family", "adaptive"),
    [
        (Mode.DCOCO, 1.0, 1.0, "qwen3", False),
        (Mode.DCOCO, 0.8, 0.9, "qwen3", False),
        (Mode.DFLASH, 1.0, 1.0, "qwen3", False),
        (Mode.DCOCO, 1.0, 1.0, "llama", False),
        (Mode.DCOCO, 1.0, 1.0, "qwen3", True),
    ],
)
def test_first_tokens_follow_the_targets_distribution(
    mode: Mode, temperature: float, top_p: float, family: str, adaptive: bool
) -> None:
    target = make_target(vocab=VOCAB, hidden=32, layers=3, seed=4, family=family)
    with torch.no_grad():
        target.lm_head.weight.mul_(1.5)  # peaked enough that drafts are often accepted
    drafter = make_drafter(target, block=3, top_k=3)
    eng = Engine(
        target,
        drafter,
        EngineConfig(mode=mode, max_batch_size=512, max_model_len=16, seed=1, adaptive=adaptive),
    )
    completions, cycles = eng.generate(
        [PROMPT] * SAMPLES, SamplingParams(max_tokens=LENGTH, temperature=temperature, top_p=top_p)
    )
    # Acceptance really happens (the adaptive planner verifies less at this batch width).
    assert sum(c.accepted_tokens for c in cycles) > (50 if adaptive else SAMPLES // 5)
    if adaptive:  # and it really verified prefixes of different lengths
        assert len({c.draft_tokens // c.verifications for c in cycles}) > 1
    assert sum(c.accepted_tokens for c in cycles) < sum(
        c.draft_tokens for c in cycles
    )  # and rejection
    index = torch.tensor(
        [sum(t * VOCAB**i for i, t in enumerate(reversed(c.token_ids))) for c in completions]
    )
    observed = torch.bincount(index, minlength=VOCAB**LENGTH).double()
    expected = exact_distribution(target, temperature, top_p) * SAMPLES
    big = expected >= 5  # chi-square needs enough expected counts; pool the rest into one bin
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    assert observed[expected == 0].sum() == 0  # nothing outside the top-p support
    assert chisquare(obs.numpy(), (exp / exp.sum() * obs.sum()).numpy()).pvalue > 1e-3
