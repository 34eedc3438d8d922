"""How benchmarks and training records name this CPU (`dcoco/shared/cpu.py`)."""

import pytest

from dcoco.shared import cpu

AMX_XEON = """processor : 0
model name : Intel(R) Xeon(R) Processor
flags : fpu avx2 avx512f avx512fp16 avx512_bf16 amx_bf16 amx_tile
"""


def test_only_whole_flags_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_cpuinfo", lambda: AMX_XEON)
    assert cpu.cpu_flags() == ["amx_bf16", "avx2", "avx512_bf16", "avx512f"]
    assert cpu.describe() == "Intel(R) Xeon(R) Processor (amx_bf16, avx2, avx512_bf16, avx512f)"


def test_a_cpu_without_avx2_or_cpuinfo_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_cpuinfo", lambda: "model name : Old\nflags : fpu sse2\n")
    assert cpu.describe() == "Old (no AVX2)"
    monkeypatch.setattr(cpu, "_cpuinfo", lambda: "")
    assert cpu.cpu_flags() == []
    assert cpu.describe().endswith("(no AVX2)")
