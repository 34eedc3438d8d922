"""Hostile and careless clients against a real gateway process over real sockets (an instant
worker answers): uploads cut short, clients too slow to send, idle connections, and large bodies
sent alongside small requests. None of it may be a 5xx, and each closure is counted."""

import json
import re
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from dcoco.queue import keys
from factories import write_models
from stack import Stack, fetch, metric_values, wait_for

pytestmark = pytest.mark.slow
MODEL = Stack.MODEL
ROUTE = "/v1/chat/completions"
KEEPALIVE_S, HEADERS_S, BODY_S = 1, 1.0, 2.0
SMALL = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = write_models(tmp_path_factory.mktemp("models"), distilled=False)
    running = Stack(
        tmp_path_factory.mktemp("stack"),
        models,
        DCOCO_ENGINE="instant",
        DCOCO_KEEPALIVE_TIMEOUT_S=str(KEEPALIVE_S),
        DCOCO_HEADERS_TIMEOUT_S=str(HEADERS_S),
        DCOCO_BODY_TIMEOUT_S=str(BODY_S),
    ).start()
    yield running
    running.stop()


def metrics(stack: Stack) -> dict[str, float]:
    return metric_values(fetch(f"{stack.url}/metrics"))


def count(stack: Stack, name: str, **labels: str) -> float:
    """The sum of a counter's series whose labels include `labels`."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        value
        for series, value in metrics(stack).items()
        if series.startswith(name + "{") and all(w in series for w in wanted)
    )


def server_errors(stack: Stack) -> float:
    """5xx answers of the generation routes (/readyz rightly answers 503 while starting)."""
    return sum(
        value
        for series, value in metrics(stack).items()
        if series.startswith("dcoco_requests_total{") and 'status="5' in series and "/v1/" in series
    )


def head(length: int, content_type: str = "application/json") -> bytes:
    return (
        f"POST {ROUTE} HTTP/1.1\r\nHost: gateway\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def connect(stack: Stack) -> socket.socket:
    return socket.create_connection(("127.0.0.1", stack.port), timeout=30)


def trickle_until_closed(sock: socket.socket, data: bytes, gap_s: float, limit_s: float) -> bytes:
    """Sends `data` a byte at a time, `gap_s` apart, until the server closes; returns what it
    answered. Bounded by `limit_s`."""
    sock.settimeout(gap_s)
    answer = b""
    deadline = time.monotonic() + limit_s
    for byte in data:
        if time.monotonic() > deadline:
            break
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        answer += chunk
        if not chunk:
            break
    return answer


def test_the_gateway_and_the_worker_froze_their_startup_heaps(stack: Stack) -> None:
    """Full garbage collections skip what each process holds for good, and each is timed: the
    one that preceded the freezing at least (`shared/heap.py`)."""
    for log in (stack.gateway.log, stack.workers[0].log):
        frozen = re.search(r"startup heap frozen: (\d+) objects", log.read_text())
        assert frozen, log.name
        assert int(frozen[1]) > 10_000, log.name
    for url in (stack.url, f"http://127.0.0.1:{stack.metrics_ports[0]}"):
        series = metric_values(fetch(f"{url}/metrics"))
        assert series["dcoco_gc_full_collection_seconds_count"] >= 1, url


def test_an_upload_cut_short_is_a_499_not_a_500(stack: Stack) -> None:
    before = count(stack, "dcoco_requests_total", route=ROUTE, status="499")
    for _ in range(3):
        with connect(stack) as sock:
            sock.sendall(head(100) + b'{"model":')  # 9 of the 100 bytes announced
    wait_for(
        lambda: count(stack, "dcoco_requests_total", route=ROUTE, status="499") == before + 3,
        timeout=10,
        what="three cancelled uploads counted",
    )
    assert server_errors(stack) == 0
    log = stack.gateway.log.read_text()
    assert "unexpected error" not in log
    assert "Traceback" not in log


def test_idle_connections_are_closed_after_the_keep_alive_timeout(stack: Stack) -> None:
    before = count(stack, "dcoco_client_timeouts_total", phase="idle")
    started = time.monotonic()
    idle = [connect(stack) for _ in range(50)]  # never send a byte
    with httpx.Client(base_url=stack.url) as client:  # one that sent a request, then went idle
        assert client.get("/healthz").status_code == 200
        for sock in idle:
            sock.settimeout(KEEPALIVE_S + 10)
            assert sock.recv(1) == b""  # closed by the server
            sock.close()
        took = time.monotonic() - started
        wait_for(
            lambda: count(stack, "dcoco_client_timeouts_total", phase="idle") >= before + 51,
            timeout=KEEPALIVE_S + 10,
            what="51 idle closures counted",
        )
    assert KEEPALIVE_S * 0.9 <= took < KEEPALIVE_S + 5


def test_headers_sent_a_byte_at_a_time_get_a_408_and_the_connection_closed(
    stack: Stack,
) -> None:
    before = count(stack, "dcoco_client_timeouts_total", phase="headers")
    started = time.monotonic()
    with connect(stack) as sock:
        answer = trickle_until_closed(sock, head(2) + b"{}", gap_s=0.2, limit_s=HEADERS_S + 10)
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert HEADERS_S * 0.9 <= took < HEADERS_S + 5
    assert count(stack, "dcoco_client_timeouts_total", phase="headers") == before + 1


def test_a_kept_alive_connection_s_stalled_next_request_gets_a_408_after_the_first_answer(
    stack: Stack,
) -> None:
    before = count(stack, "dcoco_client_timeouts_total", phase="headers")
    with connect(stack) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\nGET /heal")  # then stalls
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    first, _, rest = answer.partition(b"HTTP/1.1 408 ")
    assert first.startswith(b"HTTP/1.1 200 ")  # answered whole, then the 408
    assert rest
    assert count(stack, "dcoco_client_timeouts_total", phase="headers") == before + 1


def test_a_body_sent_a_byte_at_a_time_gets_a_408_and_the_connection_closed(
    stack: Stack,
) -> None:
    before = count(stack, "dcoco_client_timeouts_total", phase="body")
    timed_out = count(stack, "dcoco_requests_total", route=ROUTE, status="408")
    body = json.dumps(SMALL).encode()
    with connect(stack) as sock:
        sock.sendall(head(len(body)))
        started = time.monotonic()
        answer = trickle_until_closed(sock, body, gap_s=0.2, limit_s=BODY_S + 10)
    took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert BODY_S * 0.9 <= took < BODY_S + 5
    assert count(stack, "dcoco_client_timeouts_total", phase="body") == before + 1
    wait_for(
        lambda: count(stack, "dcoco_requests_total", route=ROUTE, status="408") == timed_out + 1,
        timeout=10,
        what="the request counted as the 408 it was",
    )
    assert server_errors(stack) == 0


UPLOADER = """
import asyncio, json, sys
import httpx

async def main(url: str, model: str, repeat: int, count: int) -> None:
    content = "hello world " * repeat
    large = json.dumps({"model": model, "messages": [{"role": "user", "content": content}]})
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        print("ready", flush=True)
        route = "/v1/chat/completions"
        replies = await asyncio.gather(
            *(client.post(route, content=large, headers=headers) for _ in range(count))
        )
    print(json.dumps([[r.status_code, r.json()["error"]] for r in replies]), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def small_latency(client: httpx.Client) -> float:
    started = time.monotonic()
    reply = client.post(ROUTE, json=SMALL)
    assert reply.status_code == 200, reply.text
    return time.monotonic() - started


def alongside_uploads(
    stack: Stack, model: str, repeat: int, count: int
) -> tuple[float, list[float], list[tuple[int, dict[str, str]]]]:
    """A small request's idle latency (median of 7); then its latencies, one request after
    another, while another process uploads `count` bodies of "hello world " × `repeat` at once
    and until they are all answered; and their answers."""
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        idle = statistics.median([small_latency(client) for _ in range(7)])
        args = [stack.url, model, str(repeat), str(count)]
        uploader = subprocess.Popen(
            [sys.executable, "-c", UPLOADER, *args], stdout=subprocess.PIPE, text=True
        )
        assert uploader.stdout is not None
        assert uploader.stdout.readline().strip() == "ready"
        time.sleep(0.05)  # the uploads are under way
        answered = selectors.DefaultSelector()
        answered.register(uploader.stdout, selectors.EVENT_READ)
        loaded = [small_latency(client)]
        while not answered.select(timeout=0) and len(loaded) < 1000:
            loaded.append(small_latency(client))
        replies = json.loads(uploader.stdout.readline())
    assert uploader.wait(timeout=60) == 0
    middle, worst = statistics.median(loaded), max(loaded)
    print(f"small: idle {idle:.3f} s; {len(loaded)} alongside: {middle:.3f} s, max {worst:.3f}")
    return idle, loaded, replies


def test_large_bodies_do_not_delay_a_small_request(stack: Stack) -> None:
    """Eight 3.9 MB bodies, far beyond the context, sent at once by another process, then a
    stream of small requests: they answer within twice their idle latency (plus a margin for
    the 2 shared cores, which also run this test, the uploader and the worker)."""
    idle, loaded, replies = alongside_uploads(stack, MODEL, 325_000, 8)
    assert [status for status, _ in replies] == [400] * 8
    assert {error["code"] for _, error in replies} == {"context_length_exceeded"}
    assert "at least" in replies[0][1]["message"]  # refused by the bound, before tokenizing
    assert statistics.median(loaded) < 2 * idle + 0.05
    assert max(loaded) < 1.0  # it waited 31 s behind their tokenizing before the bound
    assert server_errors(stack) == 0


def test_bodies_that_take_long_to_tokenize_do_not_delay_small_requests(
    stack: Stack,
) -> None:
    """Bodies the bound lets through (a model with a 100k context) but that take a fifth to a
    third of a second each to tokenize: they are tokenized (in the large lane, whose ordering
    tests/test_gateway_lanes.py shows) and a small request never waits for them."""
    client = stack.redis.client()
    card = json.loads(client.get(keys.model_card(MODEL)) or "{}")
    wide = card | {"name": "wide", "max_model_len": 100_000}
    client.set(keys.model_card("wide"), json.dumps(wide))
    client.sadd(keys.MODELS, "wide")
    idle, loaded, replies = alongside_uploads(stack, "wide", 25_000, 6)
    assert [status for status, _ in replies] == [400] * 6
    assert {error["code"] for _, error in replies} == {"context_length_exceeded"}
    assert "at least" not in replies[0][1]["message"]  # tokenized: the bound let it through
    assert statistics.median(loaded) < 2 * idle + 0.05
    assert max(loaded) < 1.0  # it never waited for a tokenizing thread
    assert server_errors(stack) == 0
