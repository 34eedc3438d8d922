"""The garbage collector in a serving process: full collections skip the frozen startup heap
(frozen again once the torch worker's compiles end), and each one's pause is timed."""

import asyncio
import gc
import threading
from collections.abc import Iterator

import pytest

from dcoco.shared.heap import FullCollections, freeze_startup_heap
from dcoco.worker import main


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # this test process goes on collecting as before


def test_what_was_alive_is_frozen_and_what_comes_after_is_not(unfrozen: None) -> None:
    before = [1]  # a list: tracked by the collector
    assert any(o is before for o in gc.get_objects())
    assert freeze_startup_heap() > 10_000  # pytest and its imports
    assert not any(o is before for o in gc.get_objects())  # gc.get_objects() skips the frozen
    after = [2]
    assert any(o is after for o in gc.get_objects())


def test_full_collections_are_timed_and_younger_ones_are_not() -> None:
    seconds: list[float] = []
    timed = FullCollections(seconds.append)
    try:
        gc.collect(0)
        gc.collect(1)
        assert seconds == []
        gc.collect()
        gc.collect()
        assert len(seconds) == 2
        assert all(s > 0 for s in seconds)
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
