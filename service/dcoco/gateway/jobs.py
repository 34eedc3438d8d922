"""The queue requests behind one HTTP request, and how their events become a response.

A request with several prompts or n > 1 becomes one queue request per choice, enqueued together
(all or none, against the depth limit). Their events are merged into one queue in arrival order.
Nothing is sent to the client until every choice has been taken up by a worker, so a full queue,
an expired deadline or a refused prompt still gets a proper HTTP status.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import ValidationError

from dcoco.gateway.errors import APIError, RateLimited, Timeout, Unavailable, from_worker
from dcoco.gateway.formats import DONE, Choice, Format, sse
from dcoco.gateway.metrics import GatewayMetrics
from dcoco.queue.client import GatewayQueue, QueueTimeout
from dcoco.queue.connection import UNAVAILABLE
from dcoco.queue.protocol import Envelope, Event, GenerationParams
from dcoco.settings import GatewaySettings

log = logging.getLogger(__name__)
START_GRACE_S = 2.0  # a worker that picks a request up at its deadline still gets to say so

Item = tuple[int, Event | APIError]


@dataclass
class Job:
    ids: list[str]
    prompt_tokens: int
    model: str
    started_at: float  # monotonic, at HTTP request arrival
    events: asyncio.Queue[Item] = field(default_factory=asyncio.Queue)
    backlog: list[Item] = field(default_factory=list)
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    finished: bool = False


class Jobs:
    def __init__(
        self, queue: GatewayQueue, settings: GatewaySettings, metrics: GatewayMetrics
    ) -> None:
        self.queue, self.settings, self.metrics = queue, settings, metrics
        self.background: set[asyncio.Task[None]] = set()

    async def submit(
        self,
        base_id: str,
        model: str,
        prompts: list[list[int]],
        params: GenerationParams,
        n: int,
        started_at: float,
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
                    )
                )
        if not await self.queue.enqueue(envelopes, self.settings.max_queue_depth):
            raise RateLimited(
                f"the queue for '{model}' is full", self.settings.retry_after_s, "queue_full"
            )
        job = Job([e.id for e in envelopes], sum(len(p) for p in prompts) * n, model, started_at)
        first = self.settings.queue_timeout_s + START_GRACE_S
        job.readers = [
            asyncio.create_task(self._follow(job, i, rid, first)) for i, rid in enumerate(job.ids)
        ]
        return job

    async def _follow(self, job: Job, index: int, request_id: str, first_timeout_s: float) -> None:
        try:
            async for event in self.queue.events(
                request_id, first_timeout_s, self.settings.stall_timeout_s
            ):
                job.events.put_nowait((index, event))
        except QueueTimeout:
            job.events.put_nowait(
                (index, Timeout("no worker took the request up before its queue deadline"))
            )
        except UNAVAILABLE:
            job.events.put_nowait((index, Unavailable("the queue is unavailable")))
        except (ValidationError, KeyError):
            log.error("malformed event on the response stream of %s", request_id)
            job.events.put_nowait(
                (index, APIError("a worker sent a malformed event", code="bad_event"))
            )

    async def wait_started(self, job: Job) -> None:
        """Returns once every choice has started; raises the first error instead."""
        pending = set(range(len(job.ids)))
        while pending:
            item = await job.events.get()
            index, event = item
            if isinstance(event, APIError):
                raise event
            if event.kind == "error":
                raise _worker_error(event)
            pending.discard(index)
            if event.kind != "start":
                job.backlog.append(item)

    async def _items(self, job: Job) -> AsyncIterator[Item]:
        for item in job.backlog:
            yield item
        job.backlog = []
        open_choices = len(job.ids)
        while open_choices:
            item = await job.events.get()
            if isinstance(item[1], APIError) or item[1].kind in ("done", "error"):
                open_choices -= 1
            yield item
        job.finished = True

    async def collect(self, job: Job) -> list[Choice]:
        choices = [Choice(i) for i in range(len(job.ids))]
        async for index, event in self._items(job):
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

    async def stream(self, job: Job, fmt: Format) -> AsyncIterator[bytes]:
        """SSE: the role for each choice, content deltas, each finish, usage, [DONE]."""
        choices = [Choice(i) for i in range(len(job.ids))]
        last_sent: float | None = None
        if fmt.chat:
            for choice in choices:
                yield fmt.chunk(choice.index, None, role=True)
        async for index, event in self._items(job):
            if isinstance(event, APIError) or event.kind == "error":
                error = event if isinstance(event, APIError) else _worker_error(event)
                yield sse(error.body())
                break
            if event.text:
                now = time.monotonic()
                if last_sent is None:
                    self.metrics.ttft.labels(job.model).observe(now - job.started_at)
                else:
                    self.metrics.itl.labels(job.model).observe(now - last_sent)
                last_sent = now
                yield fmt.chunk(index, event.text)
            if event.kind == "done":
                choices[index].finish_reason, choices[index].usage = (
                    event.finish_reason,
                    event.usage,
                )
                yield fmt.chunk(index, None if fmt.chat else "", finish_reason=event.finish_reason)
        if fmt.include_usage_chunk and job.finished:
            yield fmt.usage_chunk(choices, job.prompt_tokens)
        yield DONE
        self.metrics.e2e.labels(job.model).observe(time.monotonic() - job.started_at)

    def abandon(self, job: Job) -> None:
        """The client went away or the request failed: stop reading, tell workers to stop."""
        for reader in job.readers:
            reader.cancel()
        task = asyncio.get_running_loop().create_task(self._cancel(job.ids))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _cancel(self, ids: list[str]) -> None:
        try:
            await self.queue.cancel(ids)
        except UNAVAILABLE:
            log.warning("could not cancel %d requests: Redis unavailable", len(ids))


def _worker_error(event: Event) -> APIError:
    assert event.error is not None
    return from_worker(event.error.status, event.error.code, event.error.message)
