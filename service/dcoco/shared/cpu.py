"""This CPU as benchmarks and training records name it: its model name and the vector
extensions that decide which precision is fast here (AVX2 only, AVX512_BF16, AMX)."""

import platform
from pathlib import Path

KERNEL_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"})


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags() -> list[str]:
    """Which of KERNEL_FLAGS this CPU has, sorted."""
    return sorted(KERNEL_FLAGS & set(_cpuinfo().split()))


def describe() -> str:
    """For example "Intel(R) Xeon(R) Processor (amx_bf16, avx2, avx512_bf16, avx512f)"."""
    text = _cpuinfo()
    name = next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if "model name" in line),
        platform.machine(),
    )
    return f"{name} ({', '.join(cpu_flags()) or 'no AVX2'})"
