"""The engine's precisions, and `auto`: the fastest of them on this CPU, measured at start.

Which precision is fastest depends on the CPU, not on the model alone: with AVX512_BF16 a bf16
forward of 16 tokens costs about what one token does, while on AVX2-only CPUs bf16 is emulated
and fp32 wins from a few rows on; 4-bit weights read a quarter of bf16's bytes but their
kernel slows down with many rows. So `auto` times one target forward of 1, 2, 4, ... 32 tokens in
each precision and keeps the one with the lowest geometric mean over those widths (plain
steps and verifications weigh alike). The table is cached per CPU, torch build, thread count
and model shape, so later starts read it; a cache that cannot be read is measured afresh.
"""

import copy
import hashlib
import json
import logging
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dcoco.model.causal_lm import CausalLM
from dcoco.model.quant import Int4Linear, Int8Linear, quantize_linears
from dcoco.shared.options import Precision

log = logging.getLogger(__name__)

ACTIVATIONS = {
    Precision.FP32: torch.float32,
    Precision.BF16: torch.bfloat16,
    Precision.INT8: torch.bfloat16,
    Precision.INT4: torch.bfloat16,
}
MEASURED = (Precision.FP32, Precision.BF16, Precision.INT8, Precision.INT4)
# Timed forwards per width, after one warm-up. The fastest counts: other work on the machine
# only ever adds time, and a table is cached for good, so one noisy start must not decide it.
REPEATS = 3


def current_precision(target: CausalLM) -> Precision:
    layers = list(target.model.layers.modules())
    if any(isinstance(m, Int4Linear) for m in layers):
        return Precision.INT4
    if any(isinstance(m, Int8Linear) for m in layers):
        return Precision.INT8
    float32 = target.model.embed_tokens.weight.dtype == torch.float32
    return Precision.FP32 if float32 else Precision.BF16


def apply_precision(target: CausalLM, precision: Precision) -> None:
    """Readies the target for an engine in `precision`, in place: its projections fused
    (`layers.fuse_linears`), then cast or quantized. A quantized target stays as it is:
    quantizing is one way, so asking it for another precision raises ValueError."""
    target.fuse_projections()
    current = current_precision(target)
    if current is precision:
        return
    if current in (Precision.INT8, Precision.INT4):
        raise ValueError(f"the target is already {current}; load it again for {precision}")
    target.to(ACTIVATIONS[precision])
    if precision in (Precision.INT8, Precision.INT4):
        # Unties a tied head; engine code only calls the head, so it may stop being a Linear.
        target.lm_head = Int8Linear(target.lm_head.weight)  # type: ignore[assignment]
        quantize_linears(target.model.layers, 4 if precision is Precision.INT4 else 8)


@dataclass(frozen=True)
class CostTable:
    """Seconds of one target forward over `width` tokens (one row, no cache), per precision."""

    seconds: dict[str, dict[int, float]]  # precision -> width -> seconds
    threads: int

    def fastest(self, among: tuple[Precision, ...] = MEASURED) -> Precision:
        def score(name: str) -> float:
            row = self.seconds[name]
            return sum(math.log(s) for s in row.values()) / len(row)

        names = [p.value for p in among if p.value in self.seconds]
        return Precision(min(names, key=score))

    def to_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "threads": self.threads}


def widths(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `limit` tokens in one forward (at most 32)."""
    return tuple(2**i for i in range(6) if 2**i <= max(1, min(limit, 32)))


# The widths every caller measures, whatever its mode or batch size: `auto` is then one
# precision per CPU and model, so vanilla and speculative decoding print the same tokens.
WIDTHS = widths(32)


def measure(target: CausalLM, sizes: tuple[int, ...]) -> CostTable:
    """Times forwards of each precision on copies of `target` (which is left as it is)."""
    seconds: dict[str, dict[int, float]] = {}
    for precision in MEASURED:
        model = copy.deepcopy(target)
        apply_precision(model, precision)
        row: dict[int, float] = {}
        for width in sizes:
            ids = torch.zeros(1, width, dtype=torch.long)  # [1, T]
            positions = torch.arange(width).unsqueeze(0)  # [1, T]
            samples = []
            with torch.inference_mode():
                for _ in range(REPEATS + 1):
                    start = time.perf_counter()
                    hidden, _ = model(ids, positions)  # [1, T, H]
                    model.logits(hidden)  # [1, T, V]
                    samples.append(time.perf_counter() - start)
            row[width] = min(samples[1:])
        seconds[precision.value] = row
        del model
    return CostTable(seconds, torch.get_num_threads())


def cache_file(cache_dir: Path) -> Path:
    return cache_dir / "precision.json"


def cache_key(target: CausalLM, sizes: tuple[int, ...]) -> str:
    """What the table depends on: the CPU, the torch build, threads and the model's shapes."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                flags += line
    except OSError:
        flags = platform.processor()
    parts = [
        flags,
        torch.__version__,
        str(torch.get_num_threads()),
        repr(target.config),
        repr(sizes),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cost_table(target: CausalLM, sizes: tuple[int, ...], cache_dir: Path) -> CostTable:
    """The cached table for this CPU and model, or a fresh measurement (then cached)."""
    path, key = cache_file(cache_dir), cache_key(target, sizes)
    cached: dict[str, object] = {}
    if path.exists():
        try:
            cached = json.loads(path.read_text())
            entry = cached.get(key)
            if isinstance(entry, dict):
                table = CostTable(
                    {
                        p: {int(w): float(s) for w, s in row.items()}
                        for p, row in entry["seconds"].items()
                    },
                    int(entry["threads"]),
                )
                table.fastest()  # a bad entry fails here, not later
                return table
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as bad:
            log.warning("precision cache %s unreadable (%s); measuring again", path, bad)
            cached = {}
    table = measure(target, sizes)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(cached | {key: table.to_json()}, indent=1))
        partial.replace(path)
    except OSError as unwritable:
        log.warning("precision cache %s not written (%s)", path, unwritable)
    return table
