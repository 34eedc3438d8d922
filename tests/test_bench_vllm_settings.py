"""`make bench-vllm` names the vLLM settings its servers inherit from its environment: they
change vLLM's speed (on 2 cores, VLLM_CPU_NUM_OF_RESERVED_CPU=0 ran plain decoding 1.75x
faster), and every server gets the same ones."""

import argparse
import os

import pytest

from dcoco.bench.vllm import heading
from dcoco.bench.vllm_servers import inherited_vllm_settings


def test_only_the_vllm_settings_the_benchmark_does_not_set_itself_are_named() -> None:
    environ = {
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "8",  # the benchmark sets its own
        "HF_HOME": "/tmp/hf",
        "PATH": "/usr/bin",
    }
    assert inherited_vllm_settings(environ) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}


def args() -> argparse.Namespace:
    return argparse.Namespace(block=15, pair="tiny", texts=["a"], max_tokens=8, repeats=1)


def test_the_heading_names_them_or_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    assert heading(args()).endswith("the same for every server: none.")
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    assert heading(args()).endswith("the same for every server: VLLM_CPU_NUM_OF_RESERVED_CPU=0.")
