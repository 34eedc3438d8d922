"""Eager layers while the compiled ones stall.

Compiled kernels wait at many more OpenMP barriers than eager ops do, so when other processes
hold the worker's cores a compiled forward can take a hundred times its usual time where an
eager one takes two (docs/engine-profile.md). The runner times every target forward;
`StallGuard` compares each compiled one with the fastest recent forward of the same shape,
eager or compiled (so the eager forwards served while the layers compile set the bar even if
every compiled forward stalls), and after a few stalls in a row turns the compiled layers off
for a while, longer each time they stall again soon after.
"""

import logging
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

RATIO = 10.0  # a forward this many times the fastest recent one of its shape is a stall
STRIKES = 3  # stalls in a row that turn the compiled layers off
PAUSE_S = 30.0  # the first pause; doubles while stalls recur within a pause of resuming
MAX_PAUSE_S = 600.0
RECENT = 32  # forwards per shape whose fastest is the usual time
KNOWN = 4  # forwards of a shape before its times are judged
SHAPES = 256  # shapes remembered (prefill chunks come in many); others are not judged


class StallGuard:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.recent: dict[tuple[int, ...], deque[float]] = {}
        self.strikes = 0
        self.until = float("-inf")  # compiled layers off until then
        self.pause = PAUSE_S
        self.pauses = 0  # times the compiled layers were turned off

    def allows(self) -> bool:
        return self.clock() >= self.until

    def observe(self, shape: tuple[int, ...], seconds: float, compiled: bool) -> None:
        """One forward of input `shape` took `seconds`; only compiled ones can stall."""
        if shape not in self.recent and len(self.recent) >= SHAPES:
            return
        recent = self.recent.setdefault(shape, deque(maxlen=RECENT))
        usual = min(recent) if len(recent) >= KNOWN else None
        recent.append(seconds)
        if not compiled:
            return
        now = self.clock()
        if usual is None or seconds <= RATIO * usual:
            self.strikes = 0
            if now >= self.until + self.pause:  # a pause's length without a stall
                self.pause = PAUSE_S
            return
        self.strikes += 1
        if self.strikes < STRIKES:
            return
        self.strikes = 0
        self.until = now + self.pause
        self.pauses += 1
        log.warning(
            "compiled forwards stalled (%.3f s against a usual %.3f s, %d in a row): eager "
            "layers for %.0f s; other work on these cores? (DCOCO_THREADS, DCOCO_COMPILE)",
            seconds,
            usual,
            STRIKES,
            self.pause,
        )
        self.pause = min(2 * self.pause, MAX_PAUSE_S)
