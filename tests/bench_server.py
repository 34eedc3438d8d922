"""A scripted OpenAI-compatible server for the benchmark's tests: it streams chunks after
delays the test chooses, reports the usage the test chooses, and exports speculation counters
that advance with every answer. It runs its own event loop on a thread, on a free loopback
port, so synchronous tests (the command line) and asynchronous ones can both use it."""

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Script:
    model: str = "scripted"
    chunks: list[tuple[float, int]] = field(default_factory=lambda: [(0.01, 2), (0.01, 3)])
    accepted: int = 0  # per answer, in usage and in the counters
    rejected: int = 0
    block: int = 4  # drafted tokens per cycle, for the counters
    family: str | None = "dcoco"  # the counters' names: "dcoco", "vllm" or None (no counters)
    counter_scale: float = 1.0  # > 1: the counters overstate acceptance, for the cross-check
    per_chunk_usage: bool = False  # accepts stream_options.continuous_usage_stats
    models_reply: str = "json"  # "json", "html" or "404"
    metrics_answers: int | None = None  # /metrics answers 500 after this many
    compiling_scrapes: int = 0  # /metrics says the layers compile for this many scrapes


COUNTERS = {
    "dcoco": ("dcoco_spec_cycles_total", "dcoco_spec_draft_tokens_total",
              "dcoco_spec_accepted_tokens_total"),
    "vllm": ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
             "vllm:spec_decode_num_accepted_tokens_total"),
}  # fmt: skip


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.in_flight = self.most_in_flight = 0
        self.bodies: list[dict[str, Any]] = []
        self.cycles = self.drafted = self.accepted = 0.0
        self.port = 0
        self.scrapes = 0
        self.scrapes_before_chat: int | None = None  # at the first chat request
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ScriptedServer":
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise TimeoutError("the scripted server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._run())
        self._loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(runner.addresses[0][1])
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def models(self, request: web.Request) -> web.Response:
        if self.script.models_reply == "html":
            return web.Response(text="<html><body>hello</body></html>", content_type="text/html")
        if self.script.models_reply == "404":
            return web.Response(status=404, text="404 page not found")
        return web.json_response({"object": "list", "data": [{"id": self.script.model}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.scrapes_before_chat is None:
            self.scrapes_before_chat = self.scrapes
        continuous = body.get("stream_options", {}).get("continuous_usage_stats", False)
        if continuous and not self.script.per_chunk_usage:
            error = {"message": "stream_options.continuous_usage_stats: unknown parameter"}
            return web.json_response({"error": error}, status=400)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._stream(request, continuous)
        finally:
            self.in_flight -= 1

    async def _stream(self, request: web.Request, continuous: bool) -> web.StreamResponse:
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        await self._send(reply, {"role": "assistant", "content": ""}, 0 if continuous else None)
        total = 0
        for delay, tokens in self.script.chunks:
            await asyncio.sleep(delay)
            total += tokens
            # One character per chunk, whatever its tokens: counting text would be wrong.
            await self._send(reply, {"content": "x"}, total if continuous else None)
        s = self.script
        cycles = (s.accepted + s.rejected) / s.block
        self.cycles += cycles
        self.drafted += cycles * s.block
        self.accepted += s.accepted * s.counter_scale
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": total,
            "total_tokens": 7 + total,
            "completion_tokens_details": {
                "accepted_prediction_tokens": s.accepted,
                "rejected_prediction_tokens": s.rejected,
            },
        }
        await reply.write(_sse({"id": "x", "choices": [], "usage": usage}))
        await reply.write(b"data: [DONE]\n\n")
        return reply

    async def _send(
        self, reply: web.StreamResponse, delta: dict[str, str], used: int | None
    ) -> None:
        chunk: dict[str, Any] = {"id": "x", "choices": [{"index": 0, "delta": delta}]}
        if used is not None:
            chunk["usage"] = {"prompt_tokens": 7, "completion_tokens": used}
        await reply.write(_sse(chunk))

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        if self.script.metrics_answers is not None and self.scrapes > self.script.metrics_answers:
            return web.Response(status=500, text="gone")
        if self.script.family is None:
            return web.Response(text="# no speculation here\nup 1\n")
        cycles, drafted, accepted = COUNTERS[self.script.family]
        lines = []
        for name, value in ((cycles, self.cycles), (drafted, self.drafted),
                            (accepted, self.accepted)):  # fmt: skip
            base = name.removesuffix("_total")
            lines += [f"# TYPE {base} counter", f'{name}{{model="{self.script.model}"}} {value}']
        ready = 2 if self.scrapes > self.script.compiling_scrapes else 1
        lines += [
            "# TYPE dcoco_engine_compiled_shapes gauge",
            f'dcoco_engine_compiled_shapes{{model="{self.script.model}",part="target",'
            'state="planned"} 2.0',
            f'dcoco_engine_compiled_shapes{{model="{self.script.model}",part="target",'
            f'state="ready"}} {ready}.0',
        ]
        return web.Response(text="\n".join(lines) + "\n")


def _sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"
