"""The garbage collector in a serving process: full collections skip the frozen startup heap
(frozen again once the torch worker's compiles end), and each one's pause is timed."""

import asyncio
import gc
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from dcoco.shared.heap import FullCollections, freeze_startup_heap
from dcoco.worker import main


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # this test process goes on collecting as before


def test_what_was_alive_is_frozen_and_what_comes_after_is_not(unfrozen: None) -> None:
    before = [1]  # a list: tracked by the collector
    assert any(o is before for o in gc.get_objects())
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() > 10_000  # pytest and its imports
    assert not any(o is before for o in gc.get_objects())  # gc.get_objects() skips the frozen
    after = [2]
    assert any(o is after for o in gc.get_objects())


def test_full_collections_are_timed_and_younger_ones_are_not() -> None:
    registry = CollectorRegistry()
    timed = FullCollections(registry)
    try:
        gc.collect(0)
        gc.collect(1)
        assert registry.get_sample_value("dcoco_gc_full_collection_seconds_count") == 0
        gc.collect()
        gc.collect()
        assert registry.get_sample_value("dcoco_gc_full_collection_seconds_count") == 2
        assert registry.get_sample_value("dcoco_gc_full_collection_seconds_sum") > 0
    finally:
        gc.callbacks.remove(timed.on_collection)


async def test_the_worker_freezes_again_once_its_compiles_end(
    unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(main, "COMPILE_POLL_S", 0.01)
    compiles = [threading.Event(), threading.Event()]
    refreeze = asyncio.create_task(main.freeze_when_compiled(compiles))
    compiles[0].set()
    await asyncio.sleep(0.1)
    made_while_compiling = [3]
    assert not refreeze.done()  # one compile still under way
    compiles[1].set()
    await asyncio.wait_for(refreeze, 5)
    assert not any(o is made_while_compiling for o in gc.get_objects())  # frozen now
