"""Long-lived asyncio loops that survive their own bugs, but not forever.

A loop that raises is logged with its traceback, counted and restarted after a jittered,
exponentially growing delay. A loop that keeps crashing (more than `max_restarts` times within
`window_s`) raises LoopFailed: the process is then broken, and the right move is to stop and let
an orchestrator replace it rather than stay alive but deaf.
"""

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.backoff import EqualJitterBackoff

log = logging.getLogger(__name__)


class LoopFailed(Exception):
    """A supervised loop kept crashing."""

    def __init__(self, name: str) -> None:
        super().__init__(f"the {name} loop kept crashing")
        self.name = name


@dataclass
class Supervisor:
    on_restart: Callable[[str], None]  # called with the loop's name after each crash
    max_restarts: int = 5  # crashes of one loop tolerated within window_s
    window_s: float = 60.0
    backoff: EqualJitterBackoff = field(default_factory=lambda: EqualJitterBackoff(5.0, 0.05))

    async def keep(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Runs `loop()` until it returns, restarting it after each crash; raises LoopFailed
        once it crashed too often. Cancellation passes straight through."""
        crashes: deque[float] = deque()
        while True:
            try:
                await loop()
                return
            except Exception:  # the outermost loop: whatever escaped it is a bug to survive
                now = time.monotonic()
                crashes.append(now)
                while now - crashes[0] > self.window_s:
                    crashes.popleft()
                log.exception(
                    "loop crashed",
                    extra={"loop": name, "crashes": len(crashes), "window_s": self.window_s},
                )
                self.on_restart(name)
                if len(crashes) > self.max_restarts:
                    raise LoopFailed(name) from None
                await asyncio.sleep(self.backoff.compute(len(crashes)))
