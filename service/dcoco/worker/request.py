"""One request on a worker: from its stream entry to its last event.

A reclaimed request continues where its previous attempt stopped:
- nothing was sent yet: it simply runs;
- greedy or unseeded sampling: it continues from prompt + the tokens already sent, which is
  exactly what an uninterrupted run would do (greedy) or distributed identically (sampling);
- seeded sampling: it replays from the start, checks that the replay reproduces the tokens
  already sent, and continues; if it does not, it ends with an error event.

The usage it reports counts the speculation behind every token: a continuing attempt adds what
the earlier attempts' delta events carried to its own; a replay's own figures already cover the
whole answer.
"""

import time
from contextlib import aclosing
from typing import Any

from dcoco.queue.consumer import Delivery, Ownership, WorkerQueue
from dcoco.queue.protocol import Envelope, ErrorInfo, Event, Usage
from dcoco.shared.options import Mode
from dcoco.shared.protocol import EngineClient, EngineDelta, EngineRequest
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer
from dcoco.worker.detokenizer import Detokenizer
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.outbox import Outbox


class RequestRun:
    def __init__(
        self,
        envelope: Envelope,
        delivery: Delivery,
        engine: EngineClient,
        tokenizer: Tokenizer,
        outbox: Outbox,
        metrics: WorkerMetrics,
        queue: WorkerQueue,
    ) -> None:
        self.envelope, self.delivery, self.engine = envelope, delivery, engine
        self.tokenizer, self.outbox, self.metrics, self.queue = tokenizer, outbox, metrics, queue
        self.cancelled = False
        self.owned: Ownership | None = None

    async def cancel(self) -> None:
        """The client went away: abort the engine request; execute() then returns "abort"."""
        self.cancelled = True
        await self.engine.abort(self.envelope.id)

    def fail_internal(self) -> None:
        """Answers the client with an error after an unexpected failure, if the request was
        taken up; otherwise the entry is left to be reclaimed."""
        if self.owned is not None and not self.owned.finished:
            self._fail(500, "internal_error", "the worker failed while running the request")

    async def execute(self) -> str:
        """Runs the request and returns its outcome (a finish reason, or why it did not run)."""
        env, entry, reclaimed = self.envelope, self.delivery.entry_id, self.delivery.reclaimed
        expired = not reclaimed and env.expired()  # a reclaimed request was picked up in time
        owned = self.owned = await self.queue.own(env.id, reclaimed, announce=not expired)
        if owned is None or self.cancelled:
            self.outbox.orphan(entry)
            return "cancelled"
        if owned.finished:
            self.outbox.put(owned, None, entry)
            return "duplicate"
        if expired:
            self._fail(504, "queue_timeout", "the request waited in the queue past its deadline")
            return "expired"
        if not reclaimed:
            self.metrics.queue_wait.labels(env.model).observe(
                max(0.0, time.time() - env.enqueued_at)
            )
        return await self._generate(owned)

    async def _generate(self, owned: Ownership) -> str:
        env, p = self.envelope, self.envelope.params
        replay = list(owned.emitted_ids) if p.seed is not None else []
        prompt = list(env.prompt_ids) + ([] if replay else owned.emitted_ids)
        budget = p.max_tokens - (0 if replay else len(owned.emitted_ids))
        detok = Detokenizer(self.tokenizer, p.stop, owned.emitted_ids, owned.sent_text)
        if budget < 1:
            return self._done(owned, "length", None, detok.flush())
        params = SamplingParams(
            max_tokens=budget,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            speculation=Mode.of_speculation(env.speculation) if env.speculation else None,
        )
        self.metrics.prompt_tokens.labels(env.model).inc(len(prompt))
        generated = list(owned.emitted_ids)
        last: EngineDelta | None = None
        carried = (0, 0)  # this attempt's speculation already written in its delta events
        deltas = self.engine.generate(EngineRequest(env.id, prompt, params))
        async with aclosing(deltas):  # leaving early aborts the engine request
            async for delta in deltas:
                last = delta
                fresh = delta.token_ids
                while replay and fresh:
                    if fresh[0] != replay[0]:
                        self._fail(
                            500, "resume_mismatch", "a seeded request could not be replayed exactly"
                        )
                        return "error"
                    fresh, replay = fresh[1:], replay[1:]
                self.metrics.generation_tokens.labels(env.model).inc(len(delta.token_ids))
                generated += fresh
                text = detok.push(fresh)
                if text or fresh:
                    spec = delta.stats
                    total = (spec.accepted_tokens, spec.rejected_tokens) if spec else carried
                    self._emit(
                        Event(
                            kind="delta",
                            seq=self._seq(),
                            attempt=owned.attempt,
                            text=text,
                            token_ids=tuple(fresh),
                            accepted=total[0] - carried[0],
                            rejected=total[1] - carried[1],
                            **self._provenance(delta, len(fresh)),
                        )
                    )
                    carried = total
                if detok.stopped:
                    return self._done(owned, "stop", delta, "", len(generated))
        if last is None or last.finish_reason in (None, "abort"):
            self._fail(499, "cancelled", "the client closed the connection")
            return "abort"
        if last.finish_reason == "error":
            self._fail(400, "invalid_request", last.error or "the engine refused the request")
            return "error"
        return self._done(owned, str(last.finish_reason), last, detok.flush(), len(generated))

    def _provenance(self, delta: EngineDelta, fresh: int) -> dict[str, Any]:
        """The event's provenance fields, when the request asked and the engine told."""
        if not self.envelope.provenance or not delta.provenance:
            return {}
        return {
            "provenance": delta.provenance[len(delta.provenance) - fresh :],
            "cycle": delta.cycle,
            "rejected_ids": delta.rejected,
        }

    def _done(
        self,
        owned: Ownership,
        reason: str,
        last: EngineDelta | None,
        text: str,
        completion: int = 0,
    ) -> str:
        if text:
            self._emit(Event(kind="delta", seq=self._seq(), attempt=owned.attempt, text=text))
        stats = last.stats if last is not None else None
        replayed = self.envelope.params.seed is not None
        earlier = (0, 0) if replayed else (owned.accepted, owned.rejected)
        usage = Usage(
            prompt_tokens=len(self.envelope.prompt_ids),
            completion_tokens=completion or len(owned.emitted_ids),
            accepted_prediction_tokens=earlier[0] + (stats.accepted_tokens if stats else 0),
            rejected_prediction_tokens=earlier[1] + (stats.rejected_tokens if stats else 0),
        )
        event = Event(
            kind="done", seq=self._seq(), attempt=owned.attempt, finish_reason=reason, usage=usage
        )
        self.outbox.put(owned, event, self.delivery.entry_id)
        return reason

    def _fail(self, status: int, code: str, message: str) -> None:
        assert self.owned is not None
        error = ErrorInfo(status=status, code=code, message=message)
        event = Event(kind="error", seq=self._seq(), attempt=self.owned.attempt, error=error)
        self.outbox.put(self.owned, event, self.delivery.entry_id)

    def _emit(self, event: Event) -> None:
        assert self.owned is not None
        self.outbox.put(self.owned, event)

    def _seq(self) -> int:
        assert self.owned is not None
        self.owned.next_seq += 1
        return self.owned.next_seq - 1
