"""`make bench-vllm` names the vLLM settings every server runs with: they change vLLM's speed
(on 2 cores, VLLM_CPU_NUM_OF_RESERVED_CPU=0 ran plain decoding 1.31-1.49x faster), and every
server, vLLM's own ones included, gets the core reservation the worker would choose."""

import argparse
import os

import pytest

from dcoco.bench import vllm_servers
from dcoco.bench.vllm import heading
from dcoco.bench.vllm_servers import vllm_settings


def test_the_environment_s_vllm_settings_are_named_and_the_kv_cache_size_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_servers, "usable_cpus", lambda: 16)
    environ = {
        "VLLM_CPU_OMP_THREADS_BIND": "0-7",
        "VLLM_CPU_KVCACHE_SPACE": "8",  # the benchmark sets its own
        "HF_HOME": "/tmp/hf",
        "PATH": "/usr/bin",
    }
    assert vllm_settings(environ) == {"VLLM_CPU_OMP_THREADS_BIND": "0-7"}


def test_on_two_cpus_every_server_shares_its_cores_unless_the_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_servers, "usable_cpus", lambda: 2)
    assert vllm_settings({}) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert vllm_settings({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}) == {
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"
    }
    env = os.environ | vllm_servers.vllm_env("/venv/bin/python", {})
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def args() -> argparse.Namespace:
    return argparse.Namespace(block=15, pair="tiny", texts=["a"], max_tokens=8, repeats=1)


def test_the_heading_names_them_or_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(vllm_servers, "usable_cpus", lambda: 16)
    assert "for this many CPUs): none. Prefix caching on" in heading(args())
    monkeypatch.setattr(vllm_servers, "usable_cpus", lambda: 2)
    named = "for this many CPUs): VLLM_CPU_NUM_OF_RESERVED_CPU=0. Prefix caching on"
    assert named in heading(args())
