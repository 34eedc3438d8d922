"""The chunked-prefill budget: about one cycle's worth of prompt tokens, within its bounds."""

from dcoco.engine.prefill import MIN_CHUNK, PrefillBudget


def test_a_step_prefills_what_costs_about_one_cycle() -> None:
    budget = PrefillBudget(cap=256)
    assert budget.tokens() == 256  # nothing measured yet
    budget.observe_prefill(tokens=512, seconds=1.024)  # 2 ms a token
    budget.observe_cycle(0.1)
    assert budget.tokens() == 50
    for _ in range(30):  # the cycle slows down (more streams): chunks grow, up to the cap
        budget.observe_cycle(1.0)
    assert budget.tokens() == 256
    for _ in range(30):  # prefill gets dear: never under MIN_CHUNK
        budget.observe_prefill(tokens=10, seconds=10.0)
    assert budget.tokens() == MIN_CHUNK
