"""A worker's event writes on a real redis-server: one round trip per flush, and a Redis that
lost its scripts (restarted, or flushed) still gets every event exactly once."""

from typing import Any

from dcoco.queue import keys
from dcoco.queue.connection import connect, stream_entries
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import Event
from stack import RedisServer


def calls(info: dict[str, Any], command: str) -> int:
    return int(info.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_a_flush_is_one_round_trip_and_survives_lost_scripts(
    redis_server: RedisServer,
) -> None:
    redis = connect(redis_server.url, timeout_s=2.0)
    queue = WorkerQueue(redis, redis, "append-model", "worker-a", lease_s=5.0)
    owned = await queue.own("append-request", reclaimed=False)
    assert owned is not None
    events = [Event(kind="delta", seq=seq, attempt=1, text=f"t{seq}") for seq in range(4)]
    assert await queue.append([(owned, events[0], "")]) == [True]  # loads the script
    before = await redis.info("commandstats")
    assert await queue.append([(owned, event, "") for event in events[1:3]]) == [True, True]
    after = await redis.info("commandstats")
    assert calls(after, "evalsha") - calls(before, "evalsha") == 2
    for command in ("script|exists", "script|load"):
        assert calls(after, command) == calls(before, command)

    await redis.script_flush()
    assert await queue.append([(owned, events[3], "")]) == [True]
    written = stream_entries(await redis.xrange(keys.response("append-request")))
    texts = [Event.model_validate_json(fields["e"]).text for _, fields in written]
    assert texts == ["", "t0", "t1", "t2", "t3"]  # the start event, then each delta once
    await redis.aclose()
