"""The models this gateway can serve: cards and tokenizers that workers publish in Redis.

The gateway holds no model files. It tokenizes with the tokenizer a worker published, so it can
count prompt tokens and refuse an oversized prompt before any work is queued.

Cards stay in Redis when no worker runs, so a model scaled to zero still takes requests, which
wait in its queue. A card the gateway saw recently but Redis no longer has (Redis restarted
empty, and no worker has re-registered yet) makes the model temporarily unavailable (503 with
Retry-After), not unknown.
"""

import asyncio
import time
from dataclasses import dataclass

from tokenizers import Tokenizer as HFTokenizer

from dcoco.gateway.bounds import TokenBound, token_bound
from dcoco.gateway.errors import ModelNotFound, ModelUnavailable, Unavailable
from dcoco.queue.client import GatewayQueue
from dcoco.queue.protocol import ModelCard
from dcoco.tokenizer import Tokenizer

RECENT_S = 600.0  # a model whose card vanished this recently is unavailable, not unknown
MISS_REFRESH_S = 0.2  # an unknown name reloads the cards, at most this often


@dataclass(frozen=True)
class ServedModel:
    card: ModelCard
    tokenizer: Tokenizer
    bound: TokenBound | None  # a cheap lower bound on token counts, where one holds


class Catalog:
    def __init__(self, queue: GatewayQueue, refresh_s: float = 2.0) -> None:
        self.queue, self.refresh_s = queue, refresh_s
        self.cards: dict[str, ModelCard] = {}
        self.seen: dict[str, float] = {}  # model -> last time its card was in Redis (monotonic)
        self.tokenizers: dict[str, tuple[Tokenizer, TokenBound | None]] = {}  # by sha
        self.fetched = float("-inf")
        self.lock = asyncio.Lock()

    async def models(self) -> list[ModelCard]:
        await self._refresh()
        return sorted(self.cards.values(), key=lambda c: c.name)

    async def get(self, name: str) -> ServedModel:
        arrived = time.monotonic()
        await self._refresh()
        if name not in self.cards:  # perhaps published since the last refresh: look again
            await self._refresh_since(arrived)
        card = self.cards.get(name)
        if card is None:
            if time.monotonic() - self.seen.get(name, float("-inf")) < RECENT_S:
                raise ModelUnavailable(f"the model '{name}' is temporarily unavailable")
            raise ModelNotFound(f"the model '{name}' does not exist", param="model")
        loaded = self.tokenizers.get(card.tokenizer_sha)
        if loaded is None:
            raw = await self.queue.tokenizer_json(card.tokenizer_sha)
            if raw is None:
                raise Unavailable(f"the tokenizer of '{name}' is not published yet")
            inner = HFTokenizer.from_str(raw)
            loaded = Tokenizer(inner, card.chat_template, []), token_bound(raw, inner)
            self.tokenizers[card.tokenizer_sha] = loaded
        return ServedModel(card, *loaded)

    async def _refresh(self) -> None:
        if time.monotonic() - self.fetched < self.refresh_s:
            return
        async with self.lock:
            if time.monotonic() - self.fetched >= self.refresh_s:
                await self._fetch()

    async def _refresh_since(self, moment: float) -> None:
        """Cards read after `moment`, the arrival of a request for an unknown name. Misses
        read Redis at most every MISS_REFRESH_S: a miss waits out that interval rather than
        answer 404 from cards read before the model's first worker registered."""
        async with self.lock:
            if self.fetched >= moment:
                return
            await asyncio.sleep(self.fetched + MISS_REFRESH_S - time.monotonic())
            await self._fetch()

    async def _fetch(self) -> None:
        """Reads every card; `fetched` is when the read began, so that a card written during
        the read does not count as looked for."""
        began = time.monotonic()
        self.cards = await self.queue.cards()
        self.fetched = began
        self.seen |= dict.fromkeys(self.cards, began)
