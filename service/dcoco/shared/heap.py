"""Python's garbage collector in a serving process: the startup heap frozen, and the pauses of
full collections timed (the gateway's and the worker's metrics each export them)."""

import gc
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
OLDEST = 2  # the generation a full collection traverses
FULL_COLLECTION_SECONDS = "dcoco_gc_full_collection_seconds"
FULL_COLLECTION_HELP = (
    "Python's full garbage collections in this process, each a pause of every thread"
)
PAUSE = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # its histogram's buckets


def freeze_startup_heap(collect: bool = True) -> int:
    """Collects once (a full pause: `collect=False` while serving, leaving the garbage of the
    moment to stay), then moves every live object into the collector's permanent generation
    (`gc.freeze`), and returns how many that is.

    A serving process holds its imports, settings and models for good: about 330,000 objects in
    a worker with the tiny pair loaded. Python's full collections, which come every so often as
    the objects of requests accumulate, traverse them all; one took 167 ms on one core of an
    AMD EPYC, a pause of every stream, and on a loaded machine several times that. Frozen, they
    are skipped, and a full collection traverses only what was made since."""
    if collect:
        gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("startup heap frozen: %d objects", frozen)
    return frozen


class FullCollections:
    """Hands each of this process's full collections' seconds to `observe` (a callback of the
    collector's, for the life of the process: one per process).

    The callback runs inside whatever allocation set the collection off, on any thread, even
    one reading the histogram `observe` feeds for a scrape; that cannot deadlock, because
    prometheus_client holds a value's lock only over float arithmetic, which allocates nothing
    the collector tracks."""

    def __init__(self, observe: Callable[[float], None]) -> None:
        self.observe = observe
        self.started = 0.0
        gc.callbacks.append(self.on_collection)

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != OLDEST:
            return
        if phase == "start":
            self.started = time.perf_counter()
        else:
            self.observe(time.perf_counter() - self.started)
