"""The worker's HTTP port: Prometheus metrics and the probes an orchestrator reads.

    GET /metrics   the worker's series
    GET /healthz   liveness: 200 unless the worker is broken (a loop kept crashing, the engine
                   died, or the event loop has not ticked for a lease); 503 then, restart it
    GET /readyz    readiness: 200 while the model is loaded and the worker takes requests;
                   503 while loading, draining or broken

It runs on its own threads, so it answers even while the event loop is busy, and it reads the
worker's state only through `Health`, whose fields are plain values set by the event loop.
"""

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from threading import Thread
from typing import Any, Literal
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

State = Literal["loading", "ready", "draining", "stopped", "broken"]


@dataclass
class Health:
    stale_after_s: float  # a heartbeat loop silent this long means a stuck event loop
    state: State = "loading"
    last_tick: float = field(default_factory=time.monotonic)
    engine_failed: Callable[[], bool] = lambda: False

    def tick(self) -> None:
        """Called by the heartbeat loop on every beat."""
        self.last_tick = time.monotonic()

    @property
    def live(self) -> bool:
        if self.state in ("loading", "stopped"):
            return True
        stuck = time.monotonic() - self.last_tick > self.stale_after_s
        return self.state != "broken" and not self.engine_failed() and not stuck

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.live


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None


Start = Callable[[str, list[tuple[str, str]]], Any]


def _app(
    registry: CollectorRegistry, health: Health
) -> Callable[[dict[str, Any], Start], Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            if path != "/metrics":
                start("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found\n"]
            return metrics(environ, start)
        ok = health.live if path == "/healthz" else health.ready
        body = json.dumps({"status": "ok" if ok else "unavailable", "state": health.state})
        start("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "application/json")])
        return [body.encode() + b"\n"]

    return app


def serve_http(
    host: str, port: int, registry: CollectorRegistry, health: Health
) -> ThreadingWSGIServer:
    """Starts the server on a daemon thread; call `shutdown()` on the result to stop it."""
    server = make_server(
        host, port, _app(registry, health), ThreadingWSGIServer, handler_class=_Quiet
    )
    Thread(target=server.serve_forever, name="worker-http", daemon=True).start()
    return server
