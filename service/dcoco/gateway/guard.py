"""API keys and per-key limits, shared by every gateway replica through Redis.

Keys are compared in constant time against every configured key. A key is identified in Redis,
logs and metrics only by a short hash, never by its value.
"""

import hashlib
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from redis.asyncio import Redis

from dcoco.gateway.errors import RateLimited, Unauthorized
from dcoco.queue import keys, scripts
from dcoco.settings import GatewaySettings

ANONYMOUS = "anonymous"


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


class Guard:
    def __init__(self, api_keys: tuple[str, ...], redis: Redis, settings: GatewaySettings) -> None:
        self.api_keys = [k.encode() for k in api_keys]
        self.redis, self.settings = redis, settings
        self._rate = redis.register_script(scripts.RATE)
        self._acquire = redis.register_script(scripts.ACQUIRE)

    def authenticate(self, key: str | None) -> str:
        """The caller's principal (a key id), from the key of an `Authorization: Bearer`
        header (None: no such header)."""
        if not self.api_keys:
            return ANONYMOUS
        offered = (key or "").strip().encode()
        matched = False
        for candidate in self.api_keys:  # no early exit: timing says nothing about which key
            matched |= hmac.compare_digest(candidate, offered)
        if key is None or not matched:
            raise Unauthorized("a valid API key is required: Authorization: Bearer <key>")
        return key_id(key.strip())

    async def admit(self, principal: str) -> Callable[[], Awaitable[None]]:
        """Applies the rate and concurrency limits; returns the call that frees the slot."""
        s, now_ms = self.settings, int(time.time() * 1000)
        if s.rate_limit_rpm:
            interval = 60_000 / s.rate_limit_rpm
            allowed, wait_ms = await self._rate(
                keys=[keys.rate(principal)], args=[now_ms, interval, s.rate_limit_burst]
            )
            if not int(allowed):
                raise RateLimited(
                    "request rate limit reached for this key",
                    float(wait_ms) / 1000,
                    "rate_limit_exceeded",
                )
        if not s.max_concurrent_per_key:
            return _nothing
        member = uuid.uuid4().hex
        lease_ms = keys.CONCURRENCY_LEASE_S * 1000
        args: list[Any] = [now_ms, s.max_concurrent_per_key, member, lease_ms]
        if not int(await self._acquire(keys=[keys.active(principal)], args=args)):
            raise RateLimited(
                "too many concurrent requests for this key", 1.0, "concurrency_limit_exceeded"
            )

        async def release() -> None:
            await self.redis.zrem(keys.active(principal), member)

        return release


async def _nothing() -> None:
    return None
