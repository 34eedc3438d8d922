"""The gateway in front of a `vllm` worker passes the same OpenAI client tests as in front of the
torch worker (imported from test_serving and test_serving_faults), on the embedded DCOCO pair.

One vLLM worker runs at a time. The kill test comes last: it SIGKILLs that worker and starts
another, which reclaims the requests after the lease expires.
"""

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from dcoco.vllm.cpu_env import SHARE_UP_TO, usable_cpus
from stack import Stack, fetch, wait_for
from test_serving import (  # noqa: F401  (collected here with this module's fixtures)
    client,
    test_32_concurrent_streams_match_single_requests,
    test_a_malformed_queue_entry_is_dropped_and_counted,
    test_bad_requests_get_the_openai_envelope,
    test_chat_completion_with_usage,
    test_completions_stream_and_not,
    test_every_contract_metric_is_exported,
    test_max_completion_tokens,
    test_metrics_agree_with_the_engine,
    test_models_route,
    test_n_choices_and_seeds,
    test_stop_sequences_end_the_text_before_them,
    test_streaming_matches_the_complete_answer,
    test_the_openai_client_raises_typed_errors,
)
from test_serving_faults import check_disconnect_aborts, check_kill_and_reclaim
from vllm_env import EMBEDDED, VLLM_PYTHON, WORKER_ARGS, require_vllm, vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
STARTUP_S = 300  # vLLM starts in 35-60 s here, several minutes on a cold compile cache


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return dict(EMBEDDED)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[Stack]:
    require_vllm()
    running = Stack(
        tmp_path_factory.mktemp("stack"),
        models,
        worker_python=VLLM_PYTHON,
        DCOCO_ENGINE="vllm",
        DCOCO_VLLM_ARGS=WORKER_ARGS,
        DCOCO_STALL_TIMEOUT_S="180",  # a reclaiming vLLM worker needs its start-up time
        **vllm_env(),
    ).start(timeout=STARTUP_S)
    yield running
    running.stop()


def test_the_worker_serves_the_plugin_s_series(stack: Stack) -> None:
    """Corrected tokens and phase times come from vLLM's worker process."""
    openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused").chat.completions.create(
        model=Stack.MODEL,
        messages=[{"role": "user", "content": "def fibonacci(n):"}],
        max_tokens=48,
        temperature=0,
    )
    text = fetch(f"http://127.0.0.1:{stack.metrics_ports[-1]}/metrics")
    for phase in ("draft", "correct", "verify", "total"):
        assert (
            f'dcoco_spec_cycle_seconds_count{{method="dcoco",model="tiny",phase="{phase}"}}' in text
        )
    assert 'dcoco_spec_corrected_tokens_total{method="dcoco",model="tiny"}' in text
    assert text.count("# TYPE dcoco_spec_corrected_tokens_total") <= 1


def test_vllm_s_model_threads_share_the_engine_core_s_cores_on_a_small_machine(
    stack: Stack,
) -> None:
    """On at most SHARE_UP_TO CPUs the worker sets VLLM_CPU_NUM_OF_RESERVED_CPU=0 for vLLM,
    which then binds the model's threads to every core; above it vLLM reserves one."""
    reserved = 0 if usable_cpus() <= SHARE_UP_TO else 1
    assert f"reserve_cpu_num={reserved}" in stack.workers[0].log.read_text(errors="replace")


def test_the_card_says_what_vllm_cannot_give_and_the_gateway_refuses_it(stack: Stack) -> None:
    """vLLM drafts one way for every request and reports acceptance per request only: its
    card says so, and the gateway answers 400 naming `speculation` and `provenance`."""
    sdk = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0)
    [card] = [m.model_extra for m in sdk.models.list().data]
    assert card is not None
    assert (card["engine"], card["speculation"], card["provenance"]) == ("vllm", ["dcoco"], False)
    ask = {"model": Stack.MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for extra, param in (
        ({"speculation": "off"}, "speculation"),
        ({"provenance": True}, "provenance"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(**ask, stream=True, extra_body=extra)
        assert refused.value.param == param
        assert refused.value.code == "unsupported_value"
    same = sdk.chat.completions.create(**ask, extra_body={"speculation": "dcoco"})
    assert same.usage is not None
    assert same.usage.completion_tokens > 0


def test_a_disconnected_client_aborts_the_vllm_request(stack: Stack) -> None:
    check_disconnect_aborts(stack, max_tokens=480)


def live_processes() -> dict[int, int]:
    """pid -> parent pid of every process that is neither gone nor a zombie, from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> set[int]:
    parents = live_processes()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def test_a_killed_vllm_worker_s_requests_finish_on_another(stack: Stack) -> None:
    """Also: the killed worker's vLLM processes (EngineCore, Worker) die with it."""
    engine_processes = descendants(stack.workers[-1].pid)
    assert engine_processes  # vLLM runs its engine in child processes
    patient = openai.OpenAI(
        base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=STARTUP_S
    )
    check_kill_and_reclaim(
        stack,
        patient,
        max_tokens=450,
        within_s=STARTUP_S,
        after_kill=stack.add_worker,
    )
    wait_for(
        lambda: not engine_processes & set(live_processes()),
        timeout=10,
        what="the killed worker's engine processes to exit",
    )
