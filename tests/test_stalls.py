"""Eager layers while compiled forwards stall: a few stalls in a row pause the compiled
layers, longer each time they stall again soon after."""

import pytest

from dcoco.engine.stalls import MAX_PAUSE_S, PAUSE_S, SHAPES, STRIKES, StallGuard

SHAPE = (1, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def warmed(clock: Clock) -> StallGuard:
    guard = StallGuard(clock)
    for _ in range(8):
        guard.observe(SHAPE, 0.010, compiled=True)
    return guard


def test_stalls_in_a_row_pause_the_compiled_layers(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    guard = warmed(clock)
    for _ in range(STRIKES - 1):
        guard.observe(SHAPE, 1.0, compiled=True)
    assert guard.allows()  # not yet
    guard.observe(SHAPE, 1.0, compiled=True)
    assert not guard.allows()
    assert "compiled forwards stalled" in caplog.text
    assert guard.pauses == 1
    clock.now += PAUSE_S
    assert guard.allows()


def test_a_lone_slow_forward_and_slower_shapes_are_not_stalls() -> None:
    clock = Clock()
    guard = warmed(clock)
    for _ in range(10):  # one slow forward at a time, each followed by a usual one
        guard.observe(SHAPE, 1.0, compiled=True)
        guard.observe(SHAPE, 0.010, compiled=True)
    guard.observe((1, 16), 0.5, compiled=True)  # a shape not seen before: not judged yet
    for _ in range(STRIKES):
        guard.observe((2, 1), 0.02, compiled=True)  # 2x the batch-1 time, its own shape
    assert guard.allows()


def test_recurring_stalls_pause_longer_and_a_clean_pause_resets() -> None:
    clock = Clock()
    guard = warmed(clock)
    pauses = []
    for _ in range(6):
        for _ in range(STRIKES):
            guard.observe(SHAPE, 1.0, compiled=True)
        start = clock.now
        while not guard.allows():
            clock.now += 1.0
        pauses.append(clock.now - start)
    assert pauses == [PAUSE_S, 2 * PAUSE_S, 4 * PAUSE_S, 8 * PAUSE_S, 16 * PAUSE_S, MAX_PAUSE_S]
    clock.now += MAX_PAUSE_S  # clean running for a pause's length
    guard.observe(SHAPE, 0.010, compiled=True)
    for _ in range(STRIKES):
        guard.observe(SHAPE, 1.0, compiled=True)
    start = clock.now
    while not guard.allows():
        clock.now += 1.0
    assert clock.now - start == PAUSE_S


def test_eager_forwards_set_the_bar_when_every_compiled_one_stalls() -> None:
    """The layers compile while the engine serves eagerly; then every compiled forward
    stalls, so the compiled forwards alone would only ever see stalled times."""
    clock = Clock()
    guard = StallGuard(clock)
    for _ in range(8):
        guard.observe(SHAPE, 0.030, compiled=False)
    for _ in range(STRIKES):
        guard.observe(SHAPE, 1.0, compiled=True)
    assert not guard.allows()
    eager_only = StallGuard(clock)
    for _ in range(20):
        eager_only.observe(SHAPE, 1.0, compiled=False)  # eager forwards never pause anything
    assert eager_only.allows()


def test_it_remembers_a_bounded_number_of_shapes() -> None:
    guard = StallGuard(Clock())
    for tokens in range(SHAPES + 100):  # prefill chunks of every length
        guard.observe((1, tokens), 0.01, compiled=True)
    assert len(guard.recent) == SHAPES
