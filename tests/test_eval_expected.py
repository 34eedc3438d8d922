"""The expected accepted length under sampling: each drafted token's probability from one
cached pass equals a plain forward over its prefix, and the expectation is bounded by the
greedy count's extremes."""

import torch

from dcoco.engine.engine import Engine
from dcoco.eval.coverage import draft_blocks, measure_coverage
from dcoco.eval.expected import drafted_probs, expected_accepted_length
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter
from dcoco.spec.verify import target_probs

Pair = tuple[CausalLM, DFlashDrafter]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 3]]


def sampled(pair: Pair, temperature: float) -> list[tuple[list[int], list[int]]]:
    engine = Engine(pair[0], None, EngineConfig(mode=Mode.VANILLA, max_model_len=64))
    params = SamplingParams(max_tokens=30, temperature=temperature, seed=1)
    completions, _ = engine.generate(PROMPTS, params)
    return [(c.prompt_ids, c.token_ids) for c in completions]


def test_a_drafted_token_s_probability_is_the_target_s_after_its_prefix(pair: Pair) -> None:
    target, drafter = pair
    prompt, completion = sampled(pair, 1.0)[1]
    b = draft_blocks(target, drafter, prompt, completion, 4, (Rule.PREFIX,))
    anchors = b.anchors[:5]  # [5]
    drafts = {"walk": b.walks["prefix"][:5]}  # [5, B]
    got = drafted_probs(target, b.tokens, anchors, drafts, 0.7)["walk"]  # [5, B]
    with torch.no_grad():
        for row, anchor in enumerate(anchors.tolist()):
            ids = torch.cat([b.tokens[0, : anchor + 1], drafts["walk"][row]]).unsqueeze(0)
            hidden, _ = target(ids, torch.arange(ids.shape[1]).unsqueeze(0))  # [1, L, H]
            logits = target.logits(hidden[:, anchor:-1])  # [1, B, V]
            probs = target_probs(logits, torch.tensor([0.7]), torch.ones(1))[0]  # [B, V]
            want = probs.gather(-1, drafts["walk"][row].unsqueeze(-1)).squeeze(-1)  # [B]
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-5)


def test_near_zero_temperature_expects_what_greedy_verification_accepts(pair: Pair) -> None:
    """At a temperature near 0 the target's distribution is one-hot on its argmax, so the
    expectation over greedy completions is the coverage measure's exact count."""
    target, drafter = pair
    greedy = sampled(pair, 0.0)
    expected = expected_accepted_length(target, drafter, greedy, 4, 1e-4, (Rule.PREFIX,))
    counted = measure_coverage(target, drafter, greedy, 4, (Rule.PREFIX,)).summary()
    assert set(expected) == {"top1", "prefix"}
    assert expected["top1"] == counted["teacher_forced_accepted_length_top1"]
    assert expected["prefix"] == counted["teacher_forced_accepted_length_prefix"]
    at_one = expected_accepted_length(target, drafter, sampled(pair, 1.0), 4, 1.0)
    assert 1.0 <= at_one["top1"] <= drafter.config.block_size + 1
