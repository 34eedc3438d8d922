"""How long this process's threads waited for a CPU while a measurement ran.

Linux counts, per thread, the time it was ready to run but waited in a run queue
(`/proc/self/task/*/schedstat`, second field, nanoseconds). On a quiet machine a timed forward
waits about 1% of its wall time; with another process on the same cores one of its threads
waits nearly all of it, and the timings are several times too slow. A measurement that is kept
for good must know which of the two it was.
"""

import time
from pathlib import Path
from types import TracebackType

TASKS = Path("/proc/self/task")


def waited_seconds() -> float | None:
    """Run-queue seconds of this process's threads so far; None where Linux does not say."""
    total = 0
    try:
        for task in TASKS.iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue  # a thread that ended while we read
    except OSError:
        return None
    return total / 1e9


class Contention:
    """Context manager: `share` is the seconds this process's threads waited for a CPU over
    the wall seconds of the block (0 where unknown). Above a few percent, something else was
    running on the cores the block's threads needed."""

    def __init__(self) -> None:
        self.share = 0.0

    def __enter__(self) -> "Contention":
        self._start = time.perf_counter()
        self._waited = waited_seconds()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        waited = waited_seconds()
        wall = time.perf_counter() - self._start
        if waited is not None and self._waited is not None and wall > 0:
            self.share = (waited - self._waited) / wall
