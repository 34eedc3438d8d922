"""What vLLM's CPU backend wants preloaded into its processes, named once.

vLLM's CPU docs preload tcmalloc and the OpenMP runtime its wheel bundles (`libiomp5.so` in the
venv's `lib/`); without them it warns that speculative decoding on CPU is slow, and its steps
run several times slower. The worker sets this for the processes vLLM spawns; benchmarks and
tests set it for the vLLM servers they start.
"""

from pathlib import Path

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's package


def cpu_preload(venv: Path) -> str:
    """LD_PRELOAD for vLLM on CPU from the venv at `venv`: what of the two exists."""
    libraries = (TCMALLOC, venv / "lib" / "libiomp5.so")
    return ":".join(str(p.absolute()) for p in libraries if p.exists())
