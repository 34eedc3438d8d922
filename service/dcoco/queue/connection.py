"""Redis connections that fail fast: an outage must surface within about a second."""

import asyncio
import builtins
import logging
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Connection, Redis
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff, NoBackoff
from redis.exceptions import BusyLoadingError, ConnectionError, TimeoutError

# Errors meaning "Redis is not reachable right now", as opposed to a bad command. redis-py wraps
# socket errors in these, so an OSError from anywhere else is a different problem.
UNAVAILABLE = (ConnectionError, TimeoutError, BusyLoadingError)

# Delays between a loop's attempts while Redis stays unreachable: 0.05 s doubling to 2 s, half of
# each drawn at random so that workers do not retry in step.
BACKOFF = EqualJitterBackoff(cap=2.0, base=0.05)
log = logging.getLogger(__name__)


async def back_off(what: str, problem: Exception, failures: int) -> None:
    """Logs a failed attempt at `what` and sleeps before the next one."""
    delay = BACKOFF.compute(failures)
    log.warning(
        "Redis unavailable; retrying",
        extra={"what": what, "problem": str(problem), "failures": failures, "delay_s": delay},
    )
    await asyncio.sleep(delay)


class _Connection(Connection):
    """Bounds writes with `asyncio.timeout` instead of redis-py's `asyncio.wait_for`.

    In Python 3.11, `wait_for` swallows the cancellation of the calling task when the write it
    wraps finishes at the same moment (fixed in 3.12), and a write usually finishes at once: a
    task cancelled mid-command (a worker loop at shutdown, a request whose client left) then
    keeps running. Reads already use `asyncio.timeout`.
    """

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        timeout, self.socket_timeout = self.socket_timeout, None
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)
        except builtins.TimeoutError:  # our asyncio.timeout expired
            await self.disconnect(nowait=True)
            raise TimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout


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
        connection_class=_Connection,
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
