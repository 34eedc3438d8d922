"""Adaptive verification: the planner's choices on known costs and acceptance, and the engine
staying lossless whatever prefix it verifies."""

import copy
import time

import pytest

from dcoco.engine.engine import Engine
from dcoco.engine.sequence import Sequence
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import CycleStats
from dcoco.spec.drafter import DFlashDrafter
from dcoco.spec.planner import EXPLORE_SHARE, Acceptance, CostCurve, LineFit, Plan, VerifyPlanner
from factories import greedy_reference, make_drafter

Pair = tuple[CausalLM, DFlashDrafter]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [3], [2] * 13, [7, 1], [9, 9, 4, 0, 2]]


def trained(planner: VerifyPlanner, rows: int, accepted: int, seconds_per_token: float) -> None:
    """Feeds cycles where every row accepts `accepted` of the block, verifying costs a fixed
    0.01 s plus `seconds_per_token` for each token verified."""
    for k in (planner.block, 1, planner.block // 2) * 20:
        cost = 0.01 + seconds_per_token * rows * (k + 1)
        planner.observe(rows, k, [min(accepted, k)] * rows, 0.002, cost)


def test_a_line_fit_recovers_intercept_and_slope() -> None:
    fit = LineFit()
    for x in (1, 5, 9, 2, 7) * 10:
        fit.add(x, 3.0 + 0.5 * x)
    assert fit(4) == pytest.approx(5.0)
    assert fit(0) == pytest.approx(3.0)


def test_drafting_seen_at_one_batch_size_is_not_scaled_by_the_rows() -> None:
    """Drafting measured only at one row (6 ms), plain steps at 8 rows (45 ms): at 8 rows the
    planner drafts at once. A fit through the origin priced drafting there at 48 ms, and the
    planner stepped plain until an exploration paid for a try."""
    planner = VerifyPlanner(block=15)
    for _ in range(5):
        planner.observe(1, 3, [3], 0.006, 0.036)
        planner.observe(8, 0, [], 0.0, 0.045)
    assert planner.fixed_cost(planner.draft_width(8, 3)) == pytest.approx(0.006)
    assert planner.choose(8, exploring_allowed=False) > 0


def test_drafting_is_priced_by_the_slots_a_cycle_drafts() -> None:
    """The torch engine drafts only the k slots a cycle verifies: drafting learnt at k = 2 (4
    ms) and k = 15 (11 ms) prices k = 8 between them. vLLM's drafter drafts the whole block
    whatever k, so there the same cycles average to one price."""
    sliced, whole = VerifyPlanner(block=15), VerifyPlanner(block=15, whole_block=True)
    for planner in (sliced, whole):
        for _ in range(5):
            planner.observe(1, 2, [1], 0.004, 0.030)
            planner.observe(1, 15, [1], 0.011, 0.090)
    assert sliced.fixed_cost(sliced.draft_width(1, 2)) == pytest.approx(0.004)
    assert sliced.fixed_cost(sliced.draft_width(1, 8)) == pytest.approx(0.004 + 0.007 * 6 / 13)
    assert sliced.fixed_cost(sliced.draft_width(1, 15)) == pytest.approx(0.011)
    assert whole.fixed_cost(whole.draft_width(1, 2)) == pytest.approx(0.0075, rel=0.05)
    assert whole.fixed_cost(whole.draft_width(1, 2)) == whole.fixed_cost(whole.draft_width(1, 15))


def test_the_cost_curve_follows_measured_widths_and_interpolates_between() -> None:
    curve = CostCurve()
    for width, seconds in ((1, 0.025), (4, 0.040), (16, 0.084)) * 3:
        curve.add(width, seconds)
    assert curve(1) == pytest.approx(0.025)
    assert curve(4) == pytest.approx(0.040)
    assert curve(10) == pytest.approx(0.062)  # between 4 and 16
    assert curve(2) == pytest.approx(0.030)  # along the first two


def test_beyond_the_widest_width_measured_the_slope_spans_a_doubling_at_least() -> None:
    """vLLM's steps on 2 cores: 8 tokens 0.044 s, 32 and 35 tokens 0.088 and 0.089 s. The
    line along the widest two prices 512 tokens at 0.11 s (they took 0.556 s); along 8 to
    35 tokens, 0.88 s. Where the widest two rise faster, they stand; the first tokens' cost
    (4-bit kernels, 1 token 0.010 s, 16 tokens 0.030 s) does not steepen the dense range's."""
    curve = CostCurve()
    for width, seconds in ((8, 0.044), (32, 0.088), (35, 0.089)) * 3:
        curve.add(width, seconds)
    assert curve(512) == pytest.approx(0.089 + 477 * 0.045 / 27)
    assert curve(20) == pytest.approx(0.066)  # between measured widths, as before
    steep = CostCurve()
    for width, seconds in ((1, 0.010), (8, 0.020), (16, 0.060)) * 3:
        steep.add(width, seconds)
    assert steep(32) == pytest.approx(0.140)  # along the widest two
    dense = CostCurve()
    for width, seconds in ((1, 0.010), (16, 0.030), (32, 0.034)) * 3:
        dense.add(width, seconds)
    assert dense(64) == pytest.approx(0.042)  # along 16 to 32, not 1 to 32 (0.059)


def test_a_narrow_width_never_costs_more_than_a_wider_one_measured() -> None:
    """Slow first steps of 8 rows (0.2 s; vLLM's first step also runs the prompts), then
    whole blocks at 0.034 s: the narrow widths are capped by the wider measurement, so plain
    steps still get tried, and short verifications learnt to be cheaper (without the cap the
    plain try looks to lose 0.17 s, and it stays at B). A cycle is learnt after one of its
    kind, so each measurement takes two, and each plain try teaches its second step only."""
    planner = VerifyPlanner(block=15)
    for k, seconds in ((0, 0.2), (0, 0.2), (15, 0.034), (15, 0.034)):
        planner.observe(8, k, [1] * 8 if k else [], 0.0, seconds)
    assert planner.cost(8, 0) == pytest.approx(0.034)
    choices = []
    for _ in range(800):  # slot 0 always holds, slot 1 never: k = 1 is best
        k = planner.choose(8)
        choices.append(k)
        planner.observe(8, k, [min(1, k)] * 8, 0.0, 0.012 + 0.00017 * 8 * (k + 1))
    assert choices[0] == 15
    assert sum(choices[-200:]) / 200 < 2


def test_plain_decoding_wins_where_short_verifications_cost_much_more_than_a_step() -> None:
    """Weight-only 4-bit kernels on a CPU: one token 25 ms, four 40 ms, sixteen 84 ms, drafting
    13 ms, the first slot accepted half the time."""
    planner = VerifyPlanner(block=15)
    for i, (k, seconds) in enumerate(((0, 0.025), (3, 0.040), (15, 0.084)) * 30):
        planner.observe(1, k, [i % 2] if k else [], 0.013, seconds)  # slot 0 held half the time
    assert planner.choose(1, exploring_allowed=False) == 0


def test_cheap_verification_and_high_acceptance_verify_the_whole_block() -> None:
    planner = VerifyPlanner(block=8)
    trained(planner, rows=1, accepted=8, seconds_per_token=1e-4)
    assert planner.choose(1) == 8


def test_expensive_verification_and_low_acceptance_fall_back_to_plain_decoding() -> None:
    planner = VerifyPlanner(block=8)
    trained(planner, rows=32, accepted=0, seconds_per_token=1e-3)
    assert planner.choose(32) == 0


def test_a_short_accepted_prefix_verifies_a_short_prefix() -> None:
    planner = VerifyPlanner(block=8)
    trained(planner, rows=16, accepted=2, seconds_per_token=5e-4)
    assert 1 <= planner.choose(16) <= 4


def test_it_tries_deeper_now_and_then_for_a_bounded_share_of_the_time() -> None:
    """Nothing is accepted: a try verifies slot 0 only, the one slot rows reach."""
    planner = VerifyPlanner(block=8)
    trained(planner, rows=32, accepted=0, seconds_per_token=1e-3)
    choices = [planner.choose(32) for _ in range(1000)]
    explored = choices.count(1)
    assert explored >= 2
    assert choices.count(0) == 1000 - explored
    extra = explored * (planner.cost(32, 1) - planner.cost(32, 0))
    assert extra <= EXPLORE_SHARE * sum(planner.cost(32, k) for k in choices) * 1.01


def test_cheap_exploration_happens_often() -> None:
    planner = VerifyPlanner(block=8)
    trained(planner, rows=1, accepted=0, seconds_per_token=1e-5)
    choices = [planner.choose(1) for _ in range(100)]
    assert choices.count(0) > 0
    assert choices.count(1) >= 10


def test_a_try_goes_as_deep_as_rows_often_reach() -> None:
    """Two slots always held, the third never: rows reach slot 2 and seldom slot 3."""
    planner = VerifyPlanner(block=8)
    trained(planner, rows=1, accepted=2, seconds_per_token=1e-3)
    choices = [planner.choose(1) for _ in range(500)]
    assert set(choices) == {0, 2, 3}  # the best k, tries that verify slot 2 too, plain tries
    assert choices.count(2) > 450


def test_where_speculation_wins_a_try_is_a_plain_step() -> None:
    planner = VerifyPlanner(block=8)
    trained(planner, rows=1, accepted=8, seconds_per_token=1e-4)
    choices = [planner.choose(1) for _ in range(500)]
    assert 0 < choices.count(0) < 25
    assert choices.count(8) == 500 - choices.count(0)


def test_one_slow_plain_step_does_not_keep_it_speculating_where_plain_is_faster() -> None:
    """The first plain step is measured at 4x its cost; every drafted token is rejected, so
    speculating only loses. Plain steps must win back, though speculation looked better."""
    planner = VerifyPlanner(block=8)
    planner.observe(1, 8, [0], 0.010, 0.060)
    planner.observe(1, 0, [], 0.0, 0.100)  # a plain step really costs 0.025 s
    choices = []
    for _ in range(2000):
        k = planner.choose(1)
        choices.append(k)
        planner.observe(1, k, [0] if k else [], 0.010 if k else 0.0, 0.025 + 0.004 * k)
    assert choices[0] > 0  # speculating first, misled
    assert choices[-500:].count(0) > 480


def test_a_verify_after_plain_steps_is_not_learnt_and_a_try_lasts_two_cycles() -> None:
    """Plain steps 25 ms; 3-token verifies 33 ms among verifies but 41 ms right after plain
    steps; drafting 11 ms; the first two slots hold 0.56 and 0.3 of the time (held-out code,
    int4, batch 1, AMD EPYC). Verifying two tokens commits 1.86 a cycle in 44 ms against 1 in
    25 ms plain: 1.13x. Learnt from every cycle, the verify looked to cost 41 ms among plain
    steps and tries, and plain decoding won for good."""
    planner = VerifyPlanner(block=15)
    held = iter([2, 0, 1, 0, 2, 1, 0, 2, 0, 1] * 1000)  # slot 0 holds 6 in 10, slot 1 3 in 10
    choices: list[int] = []
    for _ in range(400):
        k = planner.choose(1)
        after_plain = not choices or choices[-1] == 0
        choices.append(k)
        verify_s = 0.025 if k == 0 else (0.041 if after_plain else 0.033) + 0.004 * (k - 2)
        planner.observe(1, k, [min(k, next(held))] if k else [], 0.011 if k else 0.0, verify_s)
    last = choices[-100:]
    assert last.count(2) > 60
    plain_runs = "".join("p" if k == 0 else "." for k in last).split(".")
    assert {len(run) for run in plain_runs[1:-1]} <= {0, 2}  # plain steps: tries of two
    assert planner.cost(1, 2) == pytest.approx(0.033 + 0.011, abs=0.002)


def test_an_outcome_counts_only_the_slots_it_knows() -> None:
    """A lookup draft compared with the two tokens a cycle committed, both matching: slots 0
    and 1 held, slot 2 unknown. Another row's draft broke at slot 1."""
    seen = Acceptance(block=4)
    seen.observe([(2, 2), (1, 2)])
    assert seen.trials[:3] == [4 * 0.98 + 2, 4 * 0.98 + 2, 4]
    assert seen.hits[:3] == [2 * 0.98 + 2, 2 * 0.98 + 1, 2]


def lookup_trained(planner: VerifyPlanner, drafted: int, looked_up: int) -> None:
    """The drafter's drafts hold `drafted` slots, lookup drafts `looked_up`; verifying costs
    0.020 s plus 0.002 s a token, drafting 0.010 s."""
    for k in (planner.block, 1, planner.block // 2) * 20:
        planner.observe(1, k, [min(drafted, k)], 0.010, 0.020 + 0.002 * (k + 1))
        planner.observe_lookups([(4, looked_up, min(looked_up + 1, planner.block))])


def test_a_row_whose_lookup_draft_holds_verifies_it_and_skips_the_drafter() -> None:
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=1, looked_up=6)
    plan = planner.plan([(8, 4)], exploring_allowed=False)
    assert plan.looked_up == {0}
    assert not plan.drafting
    assert 5 <= plan.k <= 8
    assert planner.plan([(0, 0)], exploring_allowed=False) == Plan(planner.choose(1, False))


def test_lookup_drafts_that_seldom_hold_are_left_unverified() -> None:
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=4, looked_up=0)
    assert planner.plan([(8, 4)], exploring_allowed=False) == Plan(4)


def test_what_a_match_length_has_shown_steers_its_own_drafts() -> None:
    """4-token matches have held six slots, 2-token ones none: only the first are verified."""
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=1, looked_up=6)
    for _ in range(60):
        planner.observe_lookups([(2, 0, 1)])
    assert planner.plan([(8, 4)], exploring_allowed=False).looked_up == {0}
    assert planner.plan([(8, 2)], exploring_allowed=False).looked_up == frozenset()


def test_rows_without_a_lookup_draft_draft_when_drafting_pays() -> None:
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=4, looked_up=8)
    plan = planner.plan([(8, 4), (0, 0)], exploring_allowed=False)
    assert plan.looked_up == {0}
    assert plan.drafting
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=0, looked_up=8)
    plan = planner.plan([(8, 4), (0, 0)], exploring_allowed=False)
    assert plan.looked_up == {0}
    assert not plan.drafting


def test_a_row_whose_lookup_draft_is_weaker_than_the_drafter_s_drafts_instead() -> None:
    """Two rows with lookup drafts: a 4-token match (holds six slots) and a 2-token one (holds
    none), where the drafter holds four: the first verifies its lookup draft, the second the
    drafter's."""
    planner = VerifyPlanner(block=8)
    lookup_trained(planner, drafted=4, looked_up=6)
    for _ in range(60):
        planner.observe_lookups([(2, 0, 1)])
    plan = planner.plan([(8, 4), (8, 2)], exploring_allowed=False)
    assert plan.looked_up == {0}
    assert plan.drafting


def test_with_lookup_greedy_output_is_token_for_token_the_targets(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random target repeats itself, so lookup drafts hold; the untrained drafter's rarely
    do. Whatever each cycle verifies, the text is the target's."""
    target = pair[0]
    drafter = make_drafter(target, block=4, top_k=4)
    cfg = EngineConfig(
        mode=Mode.DCOCO, max_batch_size=6, max_model_len=96, adaptive=True, lookup=True
    )
    eng = Engine(target, drafter, cfg)
    assert eng.planner is not None
    plans: list[Plan] = []
    plan = eng.planner.plan

    def record(found: list[tuple[int, int]], exploring_allowed: bool = True) -> Plan:
        plans.append(plan(found, exploring_allowed))
        return plans[-1]

    monkeypatch.setattr(eng.planner, "plan", record)
    total = CycleStats()
    for batch in (PROMPTS, PROMPTS[:1]):
        completions, cycles = eng.generate(batch, SamplingParams(max_tokens=40))
        for completion, prompt in zip(completions, batch, strict=True):
            assert completion.token_ids == greedy_reference(target, prompt, 40)
        for cycle in cycles:
            total.add(cycle)
    assert any(p.looked_up and p.k for p in plans)
    # The counters behind dcoco_spec_lookup_*_tokens_total: lookup drafts are a part of all.
    assert 0 < total.lookup_accepted_tokens <= total.lookup_draft_tokens <= total.draft_tokens
    assert total.lookup_accepted_tokens <= total.accepted_tokens
    assert sum(seen.trials[0] for seen in eng.planner.looked_up.values()) > 4 * 4 * 3  # learnt


def test_adaptive_greedy_output_is_token_for_token_the_targets(pair: Pair) -> None:
    target = pair[0]
    untrained = make_drafter(target, block=4, top_k=4)  # rarely right: k drops to 0 at times
    for drafter in (pair[1], untrained):
        cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=6, max_model_len=96, adaptive=True)
        completions, cycles = Engine(target, drafter, cfg).generate(
            PROMPTS, SamplingParams(max_tokens=40)
        )
        for completion, prompt in zip(completions, PROMPTS, strict=True):
            assert completion.token_ids == greedy_reference(target, prompt, 40)
        verified = {c.draft_tokens // max(1, c.verifications) for c in cycles}
        assert len(verified) > 1, verified  # it really chose different prefixes


def test_a_cycle_drafts_only_the_slots_it_verifies(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cycle verifying k of B = 4 runs the drafter over the pending token and k masks."""
    target = pair[0]
    drafter = make_drafter(target, block=4, top_k=4)
    cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=1, max_model_len=96, adaptive=True)
    eng = Engine(target, drafter, cfg)
    plans = iter([2, 4, 1] * 10)
    monkeypatch.setattr(eng, "_plan", lambda seqs, shadow: Plan(next(plans)))
    widths: list[int] = []
    drafter.register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    eng.add_request("r", PROMPTS[1], SamplingParams(max_tokens=20, ignore_eos=True))
    while eng.has_unfinished():
        eng.step()
    assert widths[:3] == [3, 5, 2]


def test_a_draft_after_plain_steps_is_not_charged_their_deferred_context(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain steps leave the drafter's context to the next draft. After 20 of them, writing it
    takes 20 positions' time, of which the planner is charged what a run of drafting cycles
    owes: k + 1 positions a row. Here a position takes 10 ms to write."""
    target, drafter = pair
    cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=1, max_model_len=96, adaptive=True)
    eng = Engine(target, drafter, cfg)
    plans = iter([0] * 20 + [2] * 10)
    monkeypatch.setattr(eng, "_plan", lambda seqs, shadow: Plan(next(plans)))
    flush = eng.runner.flush_context

    def slow(seqs: list[Sequence]) -> None:
        time.sleep(0.01 * sum(s.pending_positions for s in seqs))
        flush(seqs)

    monkeypatch.setattr(eng.runner, "flush_context", slow)
    charged: list[tuple[int, float]] = []
    observe = eng._observe

    def record(
        seqs: list[Sequence], k: int, accepted: list[int], fixed: float, verify: float
    ) -> None:
        charged.append((k, fixed))
        observe(seqs, k, accepted, fixed, verify)

    monkeypatch.setattr(eng, "_observe", record)
    eng.add_request("r", PROMPTS[0], SamplingParams(max_tokens=40, ignore_eos=True))
    drafted: list[float] = []
    while not drafted:
        cycles = eng.step().cycles
        drafted = [c.seconds["draft"] for c in cycles if c.draft_tokens]
    assert drafted[0] >= 0.2  # the step wrote about 20 positions' context
    k, fixed = charged[-1]
    assert k == 2
    assert 0.03 <= fixed < 0.1  # charged 3 positions' writing (0.03 s) and the draft


def test_the_corrector_s_token_table_is_built_before_the_first_cycle(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built lazily, it made the first cycle's drafting cost 4x its usual on SmolLM2, and the
    planner, taking that for the drafting cost, stepped plain where drafting paid."""
    target, drafter = pair[0], copy.deepcopy(pair[1])  # no table built by earlier tests
    assert drafter.corrector is not None
    cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=1, max_model_len=96, adaptive=True)
    eng = Engine(target, drafter, cfg)
    monkeypatch.setattr(
        drafter.corrector.rep_token, "forward", lambda x: pytest.fail("built in a cycle")
    )
    _, cycles = eng.generate([PROMPTS[1]], SamplingParams(max_tokens=12))
    assert any(c.draft_tokens for c in cycles)  # it drafted, and corrected
