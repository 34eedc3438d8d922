"""The chunked-prefill budget, steered to chunks of about `cycles` decoding cycles, against
chunk costs of a fixed part plus a part per token (the shape measured on CPUs)."""

from dcoco.engine.prefill import (
    CYCLE_WINDOW,
    EXPLORE_EVERY,
    FIRST_CHUNK,
    GROUP_TOKENS,
    MAX_PADDING,
    MIN_CHUNK,
    MIN_PADDING,
    ChunkPlacement,
    PrefillBudget,
    length_groups,
)


def chunk_seconds(tokens: int, fixed: float = 0.035, per_token: float = 0.00025) -> float:
    return fixed + per_token * tokens


def steer(budget: PrefillBudget, steps: int, **cost: float) -> list[float]:
    """Runs `steps` full chunks at a 22 ms cycle; returns each chunk's seconds."""
    spent = []
    for _ in range(steps):
        budget.observe_cycle(0.022)
        tokens = budget.tokens()
        seconds = chunk_seconds(tokens, **cost)
        budget.observe_chunk(tokens, seconds, allowed=tokens)
        spent.append(seconds)
    return spent


def test_chunks_start_small_and_settle_near_the_target() -> None:
    budget = PrefillBudget(cap=4096, cycles=2.0)
    assert budget.tokens() == FIRST_CHUNK  # nothing measured: the first chunk is small
    spent = steer(budget, 30)
    assert all(s <= 2 * 0.022 * 1.5 for s in spent)  # never far over two cycles
    assert 0.044 * 0.85 <= spent[-1] <= 0.044 * 1.15
    assert budget.tokens() > FIRST_CHUNK


def test_a_cycle_is_the_median_of_the_recent_ones_not_held_up_by_slow_first_steps() -> None:
    """An engine's first steps run slow (the first forward's allocations), and a shared
    machine stalls now and then: neither may raise the target chunks are steered to."""
    budget = PrefillBudget(cap=256, cycles=2.0)
    assert budget.per_cycle == 0.0
    budget.observe_cycle(0.5)
    for _ in range(CYCLE_WINDOW - 1):
        budget.observe_cycle(0.022)
    assert budget.per_cycle == 0.022
    budget.observe_cycle(0.3)  # a stall among usual cycles
    assert budget.per_cycle == 0.022
    for _ in range(CYCLE_WINDOW):  # the streams' cycles grow (more of them, longer contexts)
        budget.observe_cycle(0.040)
    assert budget.per_cycle == 0.040


def test_cheap_chunks_double_up_to_the_cap() -> None:
    budget = PrefillBudget(cap=256, cycles=2.0)
    steer(budget, 3, fixed=0.0, per_token=0.00001)
    assert budget.tokens() == FIRST_CHUNK * 8
    steer(budget, 10, fixed=0.0, per_token=0.00001)
    assert budget.tokens() == 256


def test_a_fixed_part_over_the_target_keeps_chunks_at_the_minimum() -> None:
    budget = PrefillBudget(cap=256, cycles=1.0)
    steer(budget, 10, fixed=0.030)
    assert budget.tokens() == MIN_CHUNK


def test_without_steering_every_step_takes_the_cap() -> None:
    budget = PrefillBudget(cap=256, cycles=0.0)
    steer(budget, 5, fixed=1.0)
    assert budget.tokens() == 256


def test_a_prompt_s_short_last_chunk_teaches_nothing_unless_it_ran_over() -> None:
    budget = PrefillBudget(cap=4096, cycles=2.0)
    steer(budget, 30)
    settled = budget.tokens()
    budget.observe_chunk(3, chunk_seconds(3), allowed=settled)
    assert budget.tokens() == settled
    budget.observe_chunk(3, 0.5, allowed=settled)  # a stall: the budget backs off
    assert budget.tokens() == MIN_CHUNK


def test_a_chunk_that_added_nothing_to_the_streams_step_doubles() -> None:
    """Riding along a plain step, a chunk's cost is what it added to the step, which noise can
    put at or below zero: the budget grows as for any cheap chunk."""
    budget = PrefillBudget(cap=256, cycles=2.0)
    budget.observe_cycle(0.022)
    budget.observe_chunk(FIRST_CHUNK, -0.001, allowed=FIRST_CHUNK)
    assert budget.tokens() == 2 * FIRST_CHUNK


def test_chunks_go_where_they_were_measured_to_add_less_and_the_other_way_is_retried() -> None:
    """Riding along costs 1 ms a token here and a forward of its own 2 ms: after trying each
    once, chunks ride along, except every EXPLORE_EVERY-th, which checks the other way; when
    riding along turns dear (a CPU whose wide forwards are slow), they move."""
    placement = ChunkPlacement()
    cost = {True: 0.016, False: 0.032}  # seconds a 16-token chunk adds
    ways = []
    for _ in range(4 * EXPLORE_EVERY):
        way = placement.alongside()
        ways.append(way)
        placement.observe(way, 16, cost[way])
    assert ways[:2] == [True, False]
    assert ways.count(False) == 1 + 4  # its first try, then every EXPLORE_EVERY-th chunk
    cost[True] = 0.2
    later = []
    for _ in range(3 * EXPLORE_EVERY):
        way = placement.alongside()
        later.append(way)
        placement.observe(way, 16, cost[way])
    assert later[0]  # one dear ride,
    assert later[1:].count(True) == 3  # then only the checks


def test_an_explored_way_gets_what_the_cheaper_way_would_take_in_the_same_time() -> None:
    """So exploring adds to the streams' step what a chunk of the cheaper way would."""
    placement = ChunkPlacement()
    assert placement.part(True) == placement.part(False) == 1.0  # nothing measured
    placement.observe(True, 16, 0.016)
    assert placement.part(False) == 1.0  # the other way unmeasured
    placement.observe(False, 16, 0.064)
    assert placement.part(True) == 1.0
    assert placement.part(False) == 0.25


def test_a_forced_placement_is_never_measured_against_the_other() -> None:
    assert all(ChunkPlacement(forced=True).alongside() for _ in range(20))
    assert not any(ChunkPlacement(forced=False).alongside() for _ in range(20))


def test_a_dearer_way_is_not_explored_when_its_part_would_fall_below_the_minimum_chunk() -> None:
    """At a 4x dearer way, an explored chunk gets a quarter of the budget: with a budget of 8
    tokens for one prompt that is under MIN_CHUNK, so the chunk runs the cheaper way."""
    placement = ChunkPlacement()
    placement.observe(True, 16, 0.016)
    placement.observe(False, 16, 0.064)
    placement.chunks = EXPLORE_EVERY - 1  # the next chunk explores
    assert placement.choose(floor=MIN_CHUNK / 8) == (True, 1.0)
    placement.chunks = EXPLORE_EVERY - 1
    assert placement.choose(floor=MIN_CHUNK / 32) == (False, 0.25)


def test_whole_prompts_go_in_forwards_of_like_length() -> None:
    widths = [36, 500, 40, 480, 38, 510, 200]
    groups = length_groups(widths)
    assert sorted(row for group in groups for row in group) == list(range(len(widths)))
    assert groups == [[5, 1, 3], [6], [2, 4, 0]]  # longest first; 200 would pad either neighbour
    for group in groups:
        padded = max(widths[row] for row in group) * len(group)
        assert padded - sum(widths[row] for row in group) <= max(MAX_PADDING * padded, MIN_PADDING)
    everything = max(widths) * len(widths)  # one forward, padded to the longest
    assert sum(max(widths[r] for r in g) * len(g) for g in groups) < 0.55 * everything


def test_a_forward_of_whole_prompts_holds_at_most_group_tokens_unless_one_prompt_does() -> None:
    assert length_groups([GROUP_TOKENS // 4] * 6) == [[0, 1, 2, 3], [4, 5]]
    assert length_groups([GROUP_TOKENS * 2, 7]) == [[0], [1]]
    assert length_groups([]) == []


def test_short_prompts_share_a_forward_whatever_their_padding_s_share() -> None:
    """A few dozen padded tokens cost less than a forward of their own."""
    assert length_groups([8, 4, 1]) == [[0, 1, 2]]  # 11 of 24 tokens padding
    assert length_groups([8 + MIN_PADDING, 1]) == [[0], [1]]
