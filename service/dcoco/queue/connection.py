"""Redis connections that fail fast: an outage must surface within about a second."""

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

# Errors meaning "Redis is not reachable right now", as opposed to a bad command. redis-py wraps
# socket errors in these, so an OSError from anywhere else is a different problem.
UNAVAILABLE = (ConnectionError, TimeoutError, BusyLoadingError)

# Delays between a loop's attempts while Redis stays unreachable: 0.05 s doubling to 2 s, half of
# each drawn at random so that workers do not retry in step.
BACKOFF = EqualJitterBackoff(cap=2.0, base=0.05)


def connect(url: str, timeout_s: float = 1.0, max_connections: int | None = None) -> Redis:
    """A client whose commands give up after `timeout_s`. A failed command is retried once on a
    fresh connection, at once: after a Redis restart, pooled connections are stale, and the
    first command on each must not fail the request that happened to pick it."""
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, 0.5),
        retry=Retry(NoBackoff(), 1),
        max_connections=max_connections,
    )


Entry = tuple[str, dict[str, str]]


def stream_entries(reply: Any) -> list[Entry]:
    """The entries of an XREAD / XREADGROUP reply (RESP2: [[stream, [[id, fields]...]]...]),
    or of an XRANGE / XAUTOCLAIM entry list, typed. Deleted entries (fields None) are skipped."""
    if not reply:
        return []
    if isinstance(reply[0], list | tuple) and len(reply[0]) == 2 and isinstance(reply[0][1], list):
        return [entry for _, entries in reply for entry in stream_entries(entries)]
    return [(str(entry_id), dict(fields)) for entry_id, fields in reply if fields]
