"""The benchmark's definitions: first on outcomes written as data, then measured by the client
against a scripted server whose timings are known."""

import aiohttp
import numpy as np
import pytest

from bench_server import Script, ScriptedServer
from dcoco.bench.client import Call, Outcome, Server, stream_chat
from dcoco.bench.metrics import (
    Record,
    Slo,
    accepted_length,
    itl_per_chunk,
    itl_per_token,
    parse_slo,
    percentile,
    summarize,
    tpot,
    ttft,
    weighted_percentile,
)


def outcome(
    chunks: list[float], end: float, tokens: int, steps: list[tuple[float, int]] | None = None
) -> Outcome:
    return Outcome(
        ok=True, chunk_times=chunks, token_steps=steps or [], end=end, completion_tokens=tokens
    )


def flat(pairs: list[tuple[float, float]]) -> list[float]:
    return [x for pair in pairs for x in pair]


def test_ttft_tpot_and_itl_follow_the_definitions() -> None:
    # Three chunks at 0.2, 0.3 and 0.45 s carrying 1, 3 and 2 tokens; the stream ends at 0.5 s.
    o = outcome([0.2, 0.3, 0.45], end=0.5, tokens=6)
    assert ttft(o) == 0.2
    assert tpot(o) == pytest.approx((0.5 - 0.2) / 5)
    assert itl_per_chunk(o) == pytest.approx([0.1, 0.15])
    # No per-chunk usage: each chunk is taken to carry 6 / 3 = 2 tokens.
    assert flat(itl_per_token(o)) == pytest.approx([0.05, 2.0, 0.075, 2.0])
    # With per-chunk usage the sizes are exact: 0.1 s shared by 3 tokens, 0.15 s by 2.
    exact = outcome([0.2, 0.3, 0.45], 0.5, 6, steps=[(0.2, 1), (0.3, 3), (0.45, 2)])
    assert flat(itl_per_token(exact)) == pytest.approx([0.1 / 3, 3.0, 0.075, 2.0])
    # A one-token answer has no TPOT and no gaps.
    single = outcome([0.2], end=0.21, tokens=1)
    assert tpot(single) is None
    assert itl_per_chunk(single) == []
    assert itl_per_token(single) == []


def test_percentiles_match_numpy_and_weights_count_as_repeats() -> None:
    values = [0.5, 0.1, 0.9, 0.3, 0.7, 0.2]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    samples = [(1.0, 3.0), (2.0, 1.0)]  # 1.0 three times, 2.0 once
    assert weighted_percentile(samples, 50) == 1.0
    assert weighted_percentile(samples, 75) == 1.0
    assert weighted_percentile(samples, 76) == 2.0


def test_accepted_length_from_usage_needs_the_block_size() -> None:
    # 30 of 40 drafted tokens accepted, 4 per cycle: 10 cycles, 1 + 30 / 10 = 4 tokens per cycle.
    assert accepted_length(30, 10, 4) == pytest.approx(4.0)
    assert accepted_length(30, 10, None) is None
    assert accepted_length(0, 0, 4) is None  # nothing drafted: not speculative


def test_goodput_counts_requests_meeting_every_slo_over_the_wall_time() -> None:
    fast = outcome([0.1, 0.2], end=0.3, tokens=3)  # TPOT 0.1
    slow_start = outcome([0.6, 0.7], end=0.8, tokens=3)  # TTFT 0.6
    slow_tokens = outcome([0.1, 0.9], end=1.0, tokens=3)  # TPOT 0.45
    one_token = outcome([0.1], end=0.1, tokens=1)  # no TPOT to miss
    failed = Outcome(ok=False, error="HTTP 500: boom")
    slo = parse_slo("ttft=500ms,tpot=0.2")
    assert slo == Slo(ttft=0.5, tpot=0.2)
    records = [
        Record("s", "greedy", "c1", "code", o)
        for o in (fast, slow_start, slow_tokens, one_token, failed)
    ]
    summary = summarize(records, duration_s=2.0, slo=slo)
    assert summary["goodput"] == pytest.approx(2 / 2.0)  # fast and one_token
    assert summary["completed"] == 4
    assert summary["failed"] == 1
    assert summary["errors"] == [("HTTP 500: boom", 1)]
    assert summary["output_tokens"] == 10
    assert summary["output_throughput"] == pytest.approx(10 / 2.0)
    assert summary["per_stream_tokens_per_s"] == pytest.approx(10 / (0.3 + 0.8 + 1.0 + 0.1))
    assert summarize(records, 2.0, Slo())["goodput"] is None  # no objective, no goodput


@pytest.mark.parametrize("text", ["ttft", "ttft=0", "speed=1", "ttft=-1ms", "ttft=nan"])
def test_bad_slos_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"ttft=|positive"):
        parse_slo(text)


@pytest.mark.parametrize("per_chunk_usage", [False, True])
async def test_the_client_measures_a_scripted_stream(per_chunk_usage: bool) -> None:
    script = Script(
        chunks=[(0.20, 1), (0.10, 3), (0.15, 2)],
        accepted=3,
        rejected=1,
        per_chunk_usage=per_chunk_usage,
    )
    call = Call("code", [{"role": "user", "content": "hi"}], max_tokens=8, temperature=0.0)
    with ScriptedServer(script) as server:
        target = Server("s", server.url, "scripted", None)
        async with aiohttp.ClientSession() as http:
            got = await stream_chat(http, target, call, 10.0, continuous_usage=per_chunk_usage)
        sent = server.bodies[0]
    assert got.ok, got.error
    assert sent["stream_options"]["include_usage"] is True
    assert sent["stream"] is True
    # Tokens come from usage (6), never from the chunks (three one-character chunks).
    assert got.completion_tokens == 6
    assert (got.accepted, got.rejected) == (3, 1)
    slack = 0.15  # the machine is shared; a sleep is never shorter than asked
    assert 0.2 <= ttft(got) < 0.2 + slack
    gaps = itl_per_chunk(got)
    assert 0.1 - 0.01 <= gaps[0] < 0.1 + slack
    assert 0.15 - 0.01 <= gaps[1] < 0.15 + slack
    assert got.end >= got.chunk_times[-1] >= 0.45
    assert tpot(got) == pytest.approx((got.end - ttft(got)) / 5)
    per_token = itl_per_token(got)
    if per_chunk_usage:
        assert [w for _, w in per_token] == [3.0, 2.0]
        assert per_token[0][0] == pytest.approx(gaps[0] / 3)
    else:
        assert [w for _, w in per_token] == [2.0, 2.0]
        assert per_token[0][0] == pytest.approx(gaps[0] / 2)
