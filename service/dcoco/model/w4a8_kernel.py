"""The w4a8 kernel (`w4a8.cpp`): 4-bit weights times activations quantized to 8 bits per group
of 32, summed as integers, as GGUF's Q4_1 x Q8_1 dot product is. No kernel in torch's CPU build
(nor torchao's, whose 8-bit-activation 4-bit kernel is AVX512-only and scalar elsewhere) does this
on an AVX2 CPU, where torch's 4-bit kernel widens every weight to floats and is compute-bound.

The op: `torch.ops.dcoco.w4a8_linear(x [M, K] bf16 or fp32, weight [N, K / 32 * 20] uint8)
-> [M, N]` in x's dtype, the weight laid out by `quant.W4A8Linear`.

Built with torch's extension builder (g++ and ninja) into a folder named by a digest of the
source, the flags and torch's version, under TORCH_EXTENSIONS_DIR (by default
~/.cache/torch_extensions): about 15 s once, then loaded as it is, so a read-only folder built
ahead (`python -m dcoco.model.w4a8_kernel`, which `make setup` and the CPU worker image run)
serves too.
"""

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

NAME = "dcoco_w4a8"
SOURCE = Path(__file__).with_name("w4a8.cpp")
# -ffp-contract=off: the compiler fuses no multiply-add on its own, so every row is summed alike.
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"]
CAPABLE = ("AVX2", "AVX512")  # torch's names for CPUs with AVX2, FMA and F16C


def build_folder() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    digest = hashlib.sha256(
        b"\0".join([SOURCE.read_bytes(), " ".join(FLAGS).encode(), torch.__version__.encode()])
    ).hexdigest()[:16]
    return Path(root) / f"{NAME}-{digest}"


@functools.cache
def unavailable() -> str | None:
    """Why the kernel cannot run here, or None once it is loaded (built first if need be)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in CAPABLE:
        return f"w4a8 needs an x86 CPU with AVX2; torch reports {capability}"
    folder = build_folder()
    built = folder / f"{NAME}.so"
    try:
        if built.exists() and not (folder / "lock").exists():  # built, and not being rebuilt
            torch.ops.load_library(built)
        else:
            from torch.utils import cpp_extension

            log.info("building the w4a8 kernel in %s (once, about 15 s)", folder)
            folder.mkdir(parents=True, exist_ok=True)
            path = os.environ.get("PATH", "")
            # the ninja this environment installed, where its bin folder is not on PATH
            os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), path])
            try:
                cpp_extension.load(
                    name=NAME,
                    sources=[str(SOURCE)],
                    extra_cflags=FLAGS,
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(folder),
                    is_python_module=False,
                )
            finally:
                os.environ["PATH"] = path
    except (OSError, RuntimeError, ImportError) as failed:
        lines = str(failed).strip().splitlines() or [type(failed).__name__]
        return f"the w4a8 kernel did not build or load in {folder}: {lines[-1]}"
    torch.library.register_fake("dcoco::w4a8_linear", _fake)
    return None


def _fake(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))  # [M, N]


if __name__ == "__main__":
    # Builds ahead of serving; a CPU that cannot run it is not an error here.
    why = unavailable()
    print(f"w4a8 kernel: {why or f'ready in {build_folder()}'}", file=sys.stderr)
