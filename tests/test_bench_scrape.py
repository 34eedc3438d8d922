"""Speculation counters read from /metrics, ours and vLLM's, and the cross-check of the accepted
length the responses' usage implies against the one the counter deltas give."""

from dataclasses import replace

import pytest

from bench_server import Script, ScriptedServer
from dcoco.bench.client import Server
from dcoco.bench.load import Load
from dcoco.bench.metrics import Slo
from dcoco.bench.prompts import Item, Mode
from dcoco.bench.report import build
from dcoco.bench.run import Plan, run_bench
from dcoco.bench.scrape import Counters, ScrapeFailed, compiling, crosscheck, parse_counters

OURS = """# HELP dcoco_spec_cycles_total Verification cycles
# TYPE dcoco_spec_cycles_total counter
dcoco_spec_cycles_total{model="a"} 10.0
dcoco_spec_cycles_total{model="b"} 5.0
# TYPE dcoco_spec_draft_tokens_total counter
dcoco_spec_draft_tokens_total{model="a"} 150.0
dcoco_spec_draft_tokens_total{model="b"} 75.0
# TYPE dcoco_spec_accepted_tokens_total counter
dcoco_spec_accepted_tokens_total{model="a"} 30.0
dcoco_spec_accepted_tokens_total{model="b"} 15.0
# TYPE dcoco_spec_accepted_tokens_per_position_total counter
dcoco_spec_accepted_tokens_per_position_total{model="a",position="0"} 20.0
dcoco_spec_accepted_tokens_per_position_total{model="a",position="1"} 10.0
dcoco_spec_accepted_tokens_per_position_total{model="b",position="0"} 15.0
"""
VLLM = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="q"} 4.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="q"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} 9.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="q",position="0"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="q",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="q",position="2"} 2.0
"""


def test_both_families_parse_summed_over_label_sets() -> None:
    assert parse_counters(OURS) == Counters("dcoco", 15.0, 225.0, 45.0, slots=2)
    assert parse_counters(VLLM) == Counters("vllm", 4.0, 12.0, 9.0, slots=3)
    assert parse_counters("# a gateway's metrics\nup 1\n") is None
    with pytest.raises(ScrapeFailed, match="not Prometheus text"):
        parse_counters("<html>{not metrics}</html>")


def test_the_crosscheck_agrees_when_usage_and_counters_tell_the_same_story() -> None:
    # 8 cycles of B = 4 over 2 requests: 32 drafted, 20 accepted, so 1 + 20 / 8 = 3.5 per cycle.
    delta = Counters("dcoco", 18.0, 62.0, 25.0) - Counters("dcoco", 10.0, 30.0, 5.0)
    check = crosscheck(20, 12, 2, delta, block=None)
    assert check["block"] == 4.0
    assert check["block_source"] == "metrics"
    assert check["accepted_length_usage"] == pytest.approx(3.5)
    assert check["accepted_length_metrics"] == pytest.approx(3.5)
    assert check["cut"] == 0
    assert check["agree"] is True
    # A stop cut 3 accepted tokens from one request's last cycle: usage calls them rejected.
    cut = crosscheck(17, 15, 2, delta, block=None)
    assert cut["cut"] == 3
    assert cut["accepted_length_usage"] == pytest.approx(1 + 4 * 17 / 32)
    assert cut["agree"] is True
    # More than a block per request cut, counters that count fewer accepted tokens than the
    # responses, other traffic in the drafted counts, or a wrong block size given by hand.
    assert crosscheck(11, 21, 2, delta, block=None)["agree"] is False
    assert crosscheck(22, 10, 2, delta, block=None)["agree"] is False
    assert crosscheck(20, 8, 2, delta, block=None)["agree"] is False
    assert crosscheck(20, 12, 2, delta, block=8.0)["agree"] is False
    assert crosscheck(20, 12, 2, delta, block=4.0)["agree"] is True
    # An adaptive server verifies 0.5 of B = 4 slots per cycle on average; a cut request's
    # last cycle may still have verified all 4, which the slots counted in /metrics bound.
    adaptive = Counters("dcoco", 8.0, 4.0, 3.0, slots=4)
    assert crosscheck(0, 4, 2, adaptive, block=None)["agree"] is True
    assert crosscheck(0, 4, 2, replace(adaptive, slots=0), block=None)["agree"] is False
    # A vanilla server drafts nothing: no accepted length either way.
    vanilla = crosscheck(0, 0, 2, Counters("dcoco", 40.0, 0.0, 0.0), block=None)
    assert vanilla["accepted_length_usage"] is None
    assert vanilla["agree"] is None
    # No counters at all: the usage side still counts with a given block size.
    assert crosscheck(20, 12, 2, None, block=4.0)["accepted_length_usage"] == pytest.approx(3.5)


def plan(loads: list[Load]) -> Plan:
    items = [Item("code", i, [{"role": "user", "content": f"q{i}"}]) for i in range(3)]
    return Plan(items, [Mode("greedy")], loads, 8, 1, 10.0, 30.0, seed=0)


# Counters at 2x: 6 more accepted tokens per request than usage, more than its block of 4.
@pytest.mark.parametrize(("family", "scale", "agree"), [("dcoco", 1.0, True), ("vllm", 1.0, True),
                                                        ("dcoco", 2.0, False)])  # fmt: skip
async def test_the_run_reads_counter_deltas_around_its_turns(
    family: str, scale: float, agree: bool
) -> None:
    # Each answer: 12 drafted (3 cycles of 4), 6 accepted: 1 + 6 / 3 = 3 tokens per cycle.
    script = Script(accepted=6, rejected=6, block=4, family=family, counter_scale=scale)
    with ScriptedServer(script) as server:
        target = Server("s", server.url, "scripted", f"{server.url}/metrics")
        results = await run_bench([target], plan([Load(1), Load(2)]), progress=False)
    # The warm-up's answer is left out of the deltas: 3 prompts at c1, 4 (2 x 2) at c2.
    assert results.counters[("s", "greedy", "c1")].cycles == pytest.approx(3 * 3)
    assert results.counters[("s", "greedy", "c2")].cycles == pytest.approx(4 * 3)
    report = build(results, plan([Load(1), Load(2)]), {}, Slo(), None, [])
    for row in report["by_level"]:
        check = row["crosscheck"]
        assert check["family"] == family
        assert check["block"] == pytest.approx(4.0)
        assert check["accepted_length_usage"] == pytest.approx(3.0)
        assert check["accepted_length_metrics"] == pytest.approx(1 + 6 * scale / 3)
        assert check["agree"] is agree


async def test_a_server_without_counters_is_noted_not_fatal() -> None:
    with ScriptedServer(Script(family=None, accepted=2, rejected=2)) as server:
        target = Server("s", server.url, "scripted", f"{server.url}/metrics")
        unreachable = Server("t", server.url, "scripted", "http://127.0.0.1:9/metrics")
        results = await run_bench([target, unreachable], plan([Load(1)]), progress=False)
    assert results.counters == {}
    assert any(note.startswith("t: no speculation counters (GET") for note in results.notes)
    assert any(note.startswith("s: no speculation counters at") for note in results.notes)
    # Usage alone, with the block size given: 1 + 4 * 2 / 4 = 3 tokens per cycle.
    report = build(results, plan([Load(1)]), {}, Slo(), 4.0, [])
    assert all(row["crosscheck"]["accepted_length_usage"] == 3.0 for row in report["by_level"])


async def test_counters_of_an_endpoint_that_fails_part_way_are_dropped() -> None:
    # Before and after c1, then before c2 answer; after c2 does not.
    with ScriptedServer(Script(accepted=2, rejected=2, metrics_answers=3)) as server:
        target = Server("s", server.url, "scripted", f"{server.url}/metrics")
        results = await run_bench([target], plan([Load(1), Load(2)]), progress=False)
    assert results.counters == {}
    assert any("HTTP 500" in note for note in results.notes)
    assert len(results.records) == 3 + 4  # the requests themselves all ran


def shapes(planned: int, ready: int, failed: int = 0) -> str:
    return f"""# TYPE dcoco_engine_compiled_shapes gauge
dcoco_engine_compiled_shapes{{model="m",part="target",state="planned"}} {planned}.0
dcoco_engine_compiled_shapes{{model="m",part="target",state="ready"}} {ready}.0
dcoco_engine_compiled_shapes{{model="m",part="drafter",state="planned"}} 2.0
dcoco_engine_compiled_shapes{{model="m",part="drafter",state="ready"}} 2.0
# TYPE dcoco_engine_compile_failed gauge
dcoco_engine_compile_failed{{model="m",part="target"}} {failed}.0
"""


def test_a_worker_is_compiling_while_a_part_has_classes_to_go() -> None:
    assert compiling(shapes(5, 3))
    assert not compiling(shapes(5, 5))
    assert not compiling(shapes(5, 3, failed=1))  # eager for good: nothing to wait for
    assert not compiling(OURS)  # no compiled layers (fp32, DCOCO_COMPILE=false, vLLM)
    assert not compiling(VLLM)
    with pytest.raises(ScrapeFailed):
        compiling("dcoco_engine_compiled_shapes{part=")


async def test_the_warm_up_waits_for_the_layers_to_compile() -> None:
    with ScriptedServer(Script(accepted=2, rejected=2, compiling_scrapes=3)) as server:
        target = Server("s", server.url, "scripted", f"{server.url}/metrics")
        results = await run_bench([target], plan([Load(1)]), progress=False)
        assert server.scrapes_before_chat == 4  # three answers of "compiling", then ready
    assert results.notes == []
    assert len(results.records) == 3
