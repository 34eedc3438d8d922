import copy

import pytest
import torch

from dcoco.engine.engine import Engine
from dcoco.eval.coverage import Coverage, measure_coverage
from dcoco.eval.runner import Measurement, compare_to_vanilla
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter

Pair = tuple[CausalLM, DFlashDrafter]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 3], [2, 2, 2, 2]]


@pytest.fixture(scope="module")
def sequences(pair: Pair) -> list[tuple[list[int], list[int]]]:
    engine = Engine(pair[0], None, EngineConfig(mode=Mode.VANILLA, max_model_len=64))
    completions, _ = engine.generate(PROMPTS, SamplingParams(max_tokens=30))
    return [(c.prompt_ids, c.token_ids) for c in completions]


def test_coverage_rates_are_shares_and_top_k_covers_at_least_top_1(
    pair: Pair, sequences: list[tuple[list[int], list[int]]]
) -> None:
    summary = measure_coverage(*pair, sequences, top_k=4).summary()
    top1, topk = summary["top1_by_depth"], summary["topk_by_depth"]
    assert isinstance(top1, list)
    assert isinstance(topk, list)
    assert len(top1) == len(topk) == pair[1].config.block_size
    for one, many in zip(top1, topk, strict=True):
        assert 0.0 <= one <= many <= 1.0
    assert 0.0 <= float(summary["topk_given_top1_wrong"]) <= 1.0  # type: ignore[arg-type]
    # the distilled drafter has learned something: its first slot is usually right
    assert top1[0] > 0.5
    oracle = float(summary["teacher_forced_accepted_length_oracle"])  # type: ignore[arg-type]
    top1_length = float(summary["teacher_forced_accepted_length_top1"])  # type: ignore[arg-type]
    assert 1.0 <= top1_length <= oracle <= pair[1].config.block_size + 1


def test_candidates_over_the_whole_vocabulary_always_cover(
    pair: Pair, sequences: list[tuple[list[int], list[int]]]
) -> None:
    vocab = pair[0].config.vocab_size
    summary = measure_coverage(*pair, sequences, top_k=vocab).summary()
    assert summary["topk_by_depth"] == [1.0] * pair[1].config.block_size
    assert summary["teacher_forced_accepted_length_oracle"] == pair[1].config.block_size + 1


def test_a_walk_accepts_what_the_engine_s_first_cycle_accepts(
    pair: Pair, sequences: list[tuple[list[int], list[int]]]
) -> None:
    """Cut to B + 1 tokens, a completion holds one fully labelled block, drafted where the
    engine's first cycle drafts: each walk's teacher-forced count is that cycle's."""
    target, drafter = pair
    assert drafter.corrector is not None
    block, k = drafter.config.block_size, drafter.corrector.config.top_k
    for rule in Rule:
        cfg = EngineConfig(mode=Mode.DCOCO, max_model_len=64, rule=rule)
        engine = Engine(target, drafter, cfg)
        for prompt, completion in sequences:
            _, cycles = engine.generate([prompt], SamplingParams(max_tokens=30))
            cut = [(prompt, completion[: block + 1])]
            cov = measure_coverage(target, drafter, cut, k, (rule,))
            assert cov.blocks == 1
            assert cov.walk_accepted == {rule.value: cycles[0].accepted_tokens}


def test_an_untrained_corrector_walks_the_top_1_draft(
    pair: Pair, sequences: list[tuple[list[int], list[int]]]
) -> None:
    target, drafter = pair
    untrained = copy.deepcopy(drafter)
    assert untrained.corrector is not None
    torch.nn.init.zeros_(untrained.corrector.delta_out.weight)
    summary = measure_coverage(target, untrained, sequences, 4, tuple(Rule)).summary()
    for rule in Rule:
        walk = summary[f"teacher_forced_accepted_length_{rule.value}"]
        assert walk == summary["teacher_forced_accepted_length_top1"]
    trained = measure_coverage(target, drafter, sequences, 4, (Rule.PREFIX,)).summary()
    assert (
        trained["teacher_forced_accepted_length_prefix"]
        != trained["teacher_forced_accepted_length_top1"]
    )  # the random corrector does re-select


def test_walks_need_a_corrector(pair: Pair, sequences: list[tuple[list[int], list[int]]]) -> None:
    target, drafter = pair
    plain = copy.deepcopy(drafter)
    plain.corrector = None
    with pytest.raises(ValueError, match="walk rules need a drafter with a corrector"):
        measure_coverage(target, plain, sequences, 4, (Rule.PREFIX,))


def test_coverage_counts_what_it_is_given() -> None:
    cov = Coverage.empty(block=3, top_k=2)
    top1 = torch.tensor([[True, False, True], [True, True, False]])  # [A, B]
    topk = torch.tensor([[True, True, True], [True, True, False]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    walk = torch.tensor([[True, True, False], [True, True, True]])
    cov.add(top1, topk, valid, {"prefix": walk})
    assert cov.slots == [2, 2, 1]
    assert cov.top1 == [2, 1, 1]
    assert cov.topk == [2, 2, 1]
    assert cov.topk_when_top1_wrong == [0, 1, 0]
    assert cov.blocks == 1  # only the first block has every slot labelled
    assert cov.top1_accepted == 1  # its top-1 draft is right at slot 0 only
    assert cov.oracle_accepted == 3
    assert cov.walk_accepted == {"prefix": 2}
    summary = cov.summary()
    assert summary["topk_given_top1_wrong"] == 1.0
    assert summary["teacher_forced_accepted_length_oracle"] == 4.0
    assert summary["teacher_forced_accepted_length_prefix"] == 3.0


def measurement(variant: str, setting: str, tokens: int, ids: list[list[int]]) -> Measurement:
    return Measurement(
        suite="s",
        variant=variant,
        setting=setting,
        prompts=len(ids),
        generated_tokens=tokens,
        seconds=1.0,
        verifications=1,
        accepted_length=1.0,
        acceptance_by_position=[],
        corrected_tokens=0,
        corrected_accepted_tokens=0,
        phase_seconds={},
        token_ids=ids,
    )


def test_speedup_and_identity_are_against_vanilla_in_the_same_setting() -> None:
    runs = [
        measurement("vanilla", "greedy-b1", 100, [[1, 2], [3]]),
        measurement("dcoco-prefix", "greedy-b1", 250, [[1, 2], [4]]),
        measurement("vanilla", "t1-b1", 50, [[7]]),
        measurement("dcoco-prefix", "t1-b1", 100, [[8]]),
    ]
    compare_to_vanilla(runs)
    assert runs[1].speedup == pytest.approx(2.5)
    assert runs[1].identical_to_vanilla == 1
    assert runs[3].speedup == pytest.approx(2.0)
    assert runs[3].identical_to_vanilla is None  # sampled outputs are not compared
