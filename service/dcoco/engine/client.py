"""The embedded engine behind the worker's engine-client protocol.

The engine runs on a thread of its own: the asyncio loop never waits on a forward pass, and the
engine sees every add and abort between two cycles.
"""

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncGenerator

from dcoco.engine.engine import Engine
from dcoco.engine.outputs import StepResult
from dcoco.shared.protocol import EngineDelta, EngineRequest
from dcoco.shared.stats import CycleStats

log = logging.getLogger(__name__)


_Command = tuple[str, EngineRequest | str | None]


class TorchEngineClient:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.max_model_len = engine.max_model_len
        self.max_concurrency = engine.cfg.max_batch_size
        self._loop = asyncio.get_running_loop()
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[EngineDelta]] = {}
        self._stats: list[CycleStats] = []
        self._stats_lock = threading.Lock()
        self.failure: BaseException | None = None  # set if the engine thread died
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        deltas: asyncio.Queue[EngineDelta] = asyncio.Queue()
        self._streams[request.request_id] = deltas
        self._commands.put(("add", request))
        finished = False
        try:
            while not finished:
                delta = await deltas.get()
                finished = delta.finished
                yield delta
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                self._commands.put(("abort", request.request_id))

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def drain_stats(self) -> list[CycleStats]:
        with self._stats_lock:
            stats, self._stats = self._stats, []
        return stats

    async def close(self) -> None:
        self._commands.put(("stop", None))
        await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        """The engine thread: apply commands, step, hand the outputs to the loop."""
        try:
            while self._apply_commands(block=not self.engine.has_unfinished()):
                result = self.engine.step()
                if result.cycles:
                    with self._stats_lock:
                        self._stats += result.cycles
                self._loop.call_soon_threadsafe(self._dispatch, result)
        except Exception as failure:
            log.exception("engine thread failed")
            self.failure = failure
            self._loop.call_soon_threadsafe(self._fail_all, f"engine failure: {failure}")

    def _apply_commands(self, block: bool) -> bool:
        """Applies queued adds and aborts; False once asked to stop."""
        try:
            command = self._commands.get(block=block)
        except queue.Empty:
            return True
        while True:
            kind, payload = command
            if kind == "stop":
                return False
            if kind == "add" and isinstance(payload, EngineRequest):
                self._add(payload)
            elif kind == "abort" and isinstance(payload, str) and self.engine.abort(payload):
                delta = EngineDelta([], finished=True, finish_reason="abort")
                self._loop.call_soon_threadsafe(self._deliver, payload, delta)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(self, request: EngineRequest) -> None:
        try:
            self.engine.add_request(request.request_id, request.prompt_ids, request.params)
        except ValueError as refused:
            delta = EngineDelta([], finished=True, finish_reason="error", error=str(refused))
            self._loop.call_soon_threadsafe(self._deliver, request.request_id, delta)

    def _dispatch(self, result: StepResult) -> None:
        for out in result.outputs:
            delta = EngineDelta(
                out.new_token_ids,
                out.finished,
                out.finish_reason,
                out.stats,
                provenance=out.provenance,
                rejected=out.rejected,
                cycle=out.cycle,
            )
            self._deliver(out.request_id, delta)

    def _deliver(self, request_id: str, delta: EngineDelta) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(delta)

    def _fail_all(self, reason: str) -> None:
        for stream in self._streams.values():
            stream.put_nowait(EngineDelta([], finished=True, finish_reason="error", error=reason))
