"""The queue requests behind one HTTP request, and how their events become a response.

A request with several prompts or n > 1 becomes one queue request per choice, enqueued together
(all or none, against the depth limit). Their events are merged into one queue in arrival order.
A response waits until every choice has been taken up by a worker before it sends anything, so
a full queue, an expired deadline or a refused prompt still gets a proper HTTP status. A stream
that waits longer than the keep-alive interval starts anyway with SSE comments, and an error
from then on arrives as an error event.

Every wait is bounded: each choice's reader gives up on its own (queue deadline, then stall
timeout), and the merged wait gives up too if the readers fall silent for longer than that.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import ValidationError

from dcoco.gateway.answers import DONE, PING, Answer, Choice, sse
from dcoco.gateway.errors import APIError, RateLimited, Timeout, Unavailable, from_worker
from dcoco.gateway.metrics import GatewayMetrics
from dcoco.gateway.pieces import Pieces
from dcoco.queue.client import GatewayQueue, QueueTimeout
from dcoco.queue.connection import BACKOFF, UNAVAILABLE
from dcoco.queue.keys import CANCEL_TTL_S
from dcoco.queue.protocol import Envelope, Event, GenerationParams, Speculation
from dcoco.settings import GatewaySettings

log = logging.getLogger(__name__)
START_GRACE_S = 2.0  # a worker that picks a request up at its deadline still gets to say so
GUARD_S = 5.0  # how much longer than its readers the merged wait waits before giving up
CLOSE_GRACE_S = 2.0  # how long a closing gateway waits for cancellations still being sent

Item = tuple[int, Event | APIError]


@dataclass
class Job:
    ids: list[str]
    prompt_tokens: int
    model: str
    started_at: float  # monotonic, at HTTP request arrival
    events: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    backlog: list[Item] = field(default_factory=list)  # events read while waiting for starts
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    unstarted: set[int] = field(default_factory=set)  # choices no worker has taken up yet
    unfinished: set[int] = field(default_factory=set)  # choices without a done or error
    heard_at: float = field(default_factory=time.monotonic)  # last event of any choice

    @property
    def finished(self) -> bool:
        return not self.unfinished


class Jobs:
    def __init__(
        self, queue: GatewayQueue, settings: GatewaySettings, metrics: GatewayMetrics
    ) -> None:
        self.queue, self.settings, self.metrics = queue, settings, metrics
        self.first_timeout_s = settings.queue_timeout_s + START_GRACE_S
        self.background: set[asyncio.Task[None]] = set()

    async def submit(
        self,
        base_id: str,
        model: str,
        prompts: list[list[int]],
        params: GenerationParams,
        n: int,
        started_at: float,
        speculation: Speculation | None = None,
        provenance: bool = False,
    ) -> Job:
        now = time.time()
        envelopes = []
        for p, prompt in enumerate(prompts):
            for i in range(n):
                seed = None if params.seed is None else params.seed + i
                envelopes.append(
                    Envelope(
                        id=f"{base_id}-{p * n + i}",
                        model=model,
                        prompt_ids=tuple(prompt),
                        params=params.model_copy(update={"seed": seed}),
                        enqueued_at=now,
                        deadline=now + self.settings.queue_timeout_s,
                        speculation=speculation,
                        provenance=provenance,
                    )
                )
        if not await self.queue.enqueue(envelopes, self.settings.max_queue_depth):
            raise RateLimited(
                f"the queue for '{model}' is full", self.settings.retry_after_s, "queue_full"
            )
        job = Job([e.id for e in envelopes], sum(len(p) for p in prompts) * n, model, started_at)
        job.unstarted = set(range(len(job.ids)))
        job.unfinished = set(range(len(job.ids)))
        job.readers = [
            asyncio.create_task(self._follow(job, i, rid, params.max_tokens))
            for i, rid in enumerate(job.ids)
        ]
        return job

    async def _follow(self, job: Job, index: int, request_id: str, max_tokens: int) -> None:
        """Relays one choice's events into the job; meanwhile the choice's tokens still to
        generate (max_tokens less those received) count in dcoco_backlog_tokens."""
        backlog, left = self.metrics.backlog_tokens.labels(job.model), max_tokens
        backlog.inc(left)
        try:
            async for event in self.queue.events(
                request_id, self.first_timeout_s, self.settings.stall_timeout_s
            ):
                received = min(left, len(event.token_ids))
                backlog.dec(received)
                left -= received
                job.events.put_nowait((index, event))
        except QueueTimeout as timeout:
            job.events.put_nowait((index, _timeout(timeout.started, self.settings)))
        except UNAVAILABLE:
            job.events.put_nowait((index, Unavailable("the queue is unavailable")))
        except (ValidationError, KeyError):
            log.error("malformed event on the response stream of %s", request_id)
            job.events.put_nowait(
                (index, APIError("a worker sent a malformed event", code="bad_event"))
            )
        finally:
            backlog.dec(left)

    async def _next(self, job: Job, ping_s: float | None = None) -> Item | None:
        """The next event of any choice; None after `ping_s` of silence. Raises Timeout once
        the readers, which time out on their own, have been silent well past their limits."""
        limit = self.first_timeout_s if job.unstarted else self.settings.stall_timeout_s
        while True:
            left = job.heard_at + limit + GUARD_S - time.monotonic()
            if left <= 0:
                raise _timeout(not job.unstarted, self.settings)
            try:
                async with asyncio.timeout(min(left, ping_s or left)):
                    item = await job.events.get()
            except TimeoutError:
                if ping_s is not None:
                    return None
                continue
            job.heard_at = time.monotonic()
            return item

    async def wait_started(self, job: Job, within_s: float | None = None) -> bool:
        """True once every choice has started; False if `within_s` passed first (the wait can
        be resumed). Raises the first error instead."""
        deadline = None if within_s is None else time.monotonic() + within_s
        while job.unstarted:
            ping_s = None if deadline is None else deadline - time.monotonic()
            if ping_s is not None and ping_s <= 0:
                return False
            item = await self._next(job, ping_s)
            if item is None:
                return False
            index, event = item
            if isinstance(event, APIError):
                raise event
            if event.kind == "error":
                raise _worker_error(event)
            job.unstarted.discard(index)
            if event.kind != "start":
                job.backlog.append(item)
        return True

    async def _items(self, job: Job, ping_s: float | None = None) -> AsyncIterator[Item | None]:
        """Every choice's events after its start, in arrival order, until each has ended;
        None after each `ping_s` of silence."""
        while job.unfinished:
            item = job.backlog.pop(0) if job.backlog else await self._next(job, ping_s)
            if item is not None:
                index, event = item
                if isinstance(event, APIError) or event.kind in ("done", "error"):
                    job.unfinished.discard(index)
            yield item

    async def collect(self, job: Job) -> list[Choice]:
        choices = [Choice(i) for i in range(len(job.ids))]
        async for item in self._items(job):
            assert item is not None  # no ping interval, so never a silence marker
            index, event = item
            if isinstance(event, APIError):
                raise event
            if event.kind == "error":
                raise _worker_error(event)
            choice = choices[index]
            choice.text += event.text
            if event.kind == "done":
                choice.finish_reason, choice.usage = event.finish_reason, event.usage
        self.metrics.e2e.labels(job.model).observe(time.monotonic() - job.started_at)
        return choices

    async def stream(
        self, job: Job, answer: Answer, pieces: Pieces | None = None
    ) -> AsyncIterator[bytes]:
        """SSE: keep-alives until every choice started, the role for each choice, content
        deltas (with their tokens' provenance when `pieces` decodes them), each finish, usage,
        [DONE]."""
        keepalive = self.settings.sse_keepalive_s
        try:
            while not await self.wait_started(job, keepalive):
                yield PING
        except APIError as refused:
            yield sse(refused.envelope())
            yield DONE
            return
        choices = [Choice(i) for i in range(len(job.ids))]
        last_sent: float | None = None
        if answer.chat:
            for choice in choices:
                yield answer.chunk(choice.index, None, role=True)
        try:
            async for item in self._items(job, keepalive):
                if item is None:
                    yield PING
                    continue
                index, event = item
                if isinstance(event, APIError) or event.kind == "error":
                    failed = event if isinstance(event, APIError) else _worker_error(event)
                    yield sse(failed.envelope())
                    break
                provenance = pieces.of(index, event) if pieces is not None else None
                if event.text:
                    now = time.monotonic()
                    if last_sent is None:
                        self.metrics.ttft.labels(job.model).observe(now - job.started_at)
                    else:
                        self.metrics.itl.labels(job.model).observe(now - last_sent)
                    last_sent = now
                if event.text or provenance is not None:
                    yield answer.chunk(index, event.text, provenance=provenance)
                if event.kind == "done":
                    choices[index].finish_reason = event.finish_reason
                    choices[index].usage = event.usage
                    yield answer.chunk(
                        index, None if answer.chat else "", finish_reason=event.finish_reason
                    )
        except Timeout as stalled:
            yield sse(stalled.envelope())
        if answer.include_usage_chunk and job.finished:
            yield answer.usage_chunk(choices, job.prompt_tokens)
        yield DONE
        self.metrics.e2e.labels(job.model).observe(time.monotonic() - job.started_at)

    def abandon(self, job: Job) -> None:
        """The client went away or the request failed: stop reading, tell workers to stop."""
        for reader in job.readers:
            reader.cancel()
        task = asyncio.get_running_loop().create_task(self._cancel(job.ids))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close(self) -> None:
        """Waits a little for the cancellations still being sent, then drops them."""
        if not self.background:
            return
        _, pending = await asyncio.wait(self.background, timeout=CLOSE_GRACE_S)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("closing with %d cancellations not sent: Redis unavailable", len(pending))
        await asyncio.gather(*pending, return_exceptions=True)

    async def _cancel(self, ids: list[str]) -> None:
        """Sets the cancel flags, retrying while Redis is unreachable (for as long as a flag
        would live): a request abandoned during an outage stays in its stream when Redis comes
        back with its data, and without its flag a worker would run it again for nobody."""
        deadline = time.monotonic() + CANCEL_TTL_S
        failures = 0
        while True:
            try:
                await self.queue.cancel(ids)
                return
            except UNAVAILABLE:
                failures += 1
                if failures == 1:
                    log.warning("Redis unavailable; retrying %d cancellations", len(ids))
                if time.monotonic() > deadline:
                    log.warning("gave up cancelling %d requests: Redis unavailable", len(ids))
                    return
                await asyncio.sleep(BACKOFF.compute(failures))


def _timeout(started: bool, settings: GatewaySettings) -> Timeout:
    if not started:
        return Timeout("no worker took the request up before its queue deadline")
    return Timeout(
        f"the worker sent nothing for {settings.stall_timeout_s:g} s", code="stall_timeout"
    )


def _worker_error(event: Event) -> APIError:
    assert event.error is not None
    return from_worker(event.error.status, event.error.code, event.error.message)
