"""The bench's CPU accounting: a server's descendants count, by role, and idle ones cost nothing."""

import os
import signal
import subprocess
import sys
import time

from dcoco.bench.cpu import cpu_seconds, per_token_ms, role

# sleeps, burns 0.4 s of CPU, then sleeps on
BURN = (
    "import time\ntime.sleep(0.5)\nend = time.process_time() + 0.4\n"
    "while time.process_time() < end: pass\ntime.sleep(5)\n"
)


def test_vllm_engine_processes_are_the_engine_and_the_rest_the_front() -> None:
    assert role("VLLM::EngineCore") == "engine"
    assert role("VLLM::Worker") == "engine"
    assert role("python") == "front"
    assert role("redis-server") == "front"


def test_a_grandchild_burning_cpu_counts_for_the_front_of_its_root() -> None:
    command = f"{sys.executable} -c '{BURN}' & wait"
    root = subprocess.Popen(["sh", "-c", command], start_new_session=True)
    try:
        time.sleep(0.3)  # the grandchild has started and sleeps
        before = cpu_seconds([root.pid])
        time.sleep(2.0)  # it burns 0.4 s meanwhile, with a CPU to itself or not
        after = cpu_seconds([root.pid])
        figures = per_token_ms(before, after, tokens=100)
        # 0.4 s and a little over 100 tokens, read in /proc's 10 ms ticks (0.1 ms a token)
        assert 3.8 <= figures["cpu_front_ms"] <= 5.0
        assert figures["cpu_engine_ms"] == 0.0
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_gone_processes_and_the_client_are_read_without_failing() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    reading = cpu_seconds([gone.pid])
    assert reading["front"] == 0.0
    assert reading["engine"] == 0.0
    assert reading["client"] > 0.0  # this test process has run
