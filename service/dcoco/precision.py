"""The engine's precisions, and `auto`: the fastest of them on this CPU, measured at start.

Which precision is fastest depends on the CPU, not on the model alone: with AVX512_BF16 a bf16
forward of 16 tokens costs about what one token does, while on AVX2-only CPUs bf16 is emulated
and fp32 wins from a few rows on; 4-bit weights read a quarter of bf16's bytes but their
kernel slows down with many rows. So `auto` times one target forward of 1, 2, 4, ... 32 tokens in
each precision, and within it the matmuls over the weights alone, and keeps the precision whose
matmuls have the lowest geometric mean over those widths (plain steps and verifications weigh
alike). The matmuls decide, not the whole forward: around them an eager forward spends about
the same in every precision (on SmolLM2 on an AVX2-only EPYC, 25 of a one-token forward's 33
ms), which the compiled layers the engine serves with mostly do not, and on a busy machine
that shared part's noise would otherwise decide between precisions a few ms apart. The whole
forward's seconds are kept too: the adaptive planner starts from them. The table is cached per
CPU, torch build, thread count and model shape, so later starts read it; a cache that cannot be
read is measured afresh.

Engines with bf16 activations also measure, once per CPU and model and cached alike, whether
their small masked attention runs faster on fp32 copies (`attention_upcast`), and quantized
ones from how many rows each weight shape multiplies faster dequantized (`dense_crossover`).
"""

import copy
import hashlib
import json
import logging
import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from dcoco.model.causal_lm import CausalLM
from dcoco.model.packed import Bf16Linear, pack_linears
from dcoco.model.quant import (
    GROUP,
    Int4Linear,
    Int8Linear,
    QuantizedLinear,
    W4A8Linear,
    quantize_linears,
    quantized_linears,
)
from dcoco.model.w4a8_kernel import unavailable
from dcoco.shared.contention import Contention
from dcoco.shared.options import Precision

log = logging.getLogger(__name__)
T = TypeVar("T")

ACTIVATIONS = {
    Precision.FP32: torch.float32,
    Precision.BF16: torch.bfloat16,
    Precision.INT8: torch.bfloat16,
    Precision.INT4: torch.bfloat16,
    Precision.W4A8: torch.bfloat16,
}
QUANTIZED: dict[Precision, type[QuantizedLinear]] = {
    Precision.INT8: Int8Linear,
    Precision.INT4: Int4Linear,
    Precision.W4A8: W4A8Linear,
}
# Timed forwards per width, after one warm-up. The fastest counts: other work on the machine
# only ever adds time, and a table is cached for good, so one noisy start must not decide it.
REPEATS = 3
# Seconds this process's threads may wait for a CPU, per wall second of a measurement, for the
# measurement to be cached: about 0.01 on a quiet machine, near 1 with another process on
# one of two cores (`shared/contention.py`).
QUIET_SHARE = 0.1
# The engine's own kernels, part of every cache key: bumped when a change to them (bf16
# weights packed for oneDNN: 2; dense copies in fp32 where bf16 is emulated: 3; in fp16 for
# fbgemm there: 4; w4a8 beside the others, the matmuls timed alone: 5) makes earlier
# measurements stale.
KERNELS = 5


def measured() -> tuple[Precision, ...]:
    """The precisions `auto` times here: all but w4a8 where its kernel cannot run (logged)."""
    why = unavailable()
    if why is not None:
        log.warning("auto precision leaves w4a8 out: %s", why)
        return tuple(p for p in ACTIVATIONS if p is not Precision.W4A8)
    return tuple(ACTIVATIONS)


def current_precision(target: CausalLM) -> Precision:
    layers = list(target.model.layers.modules())
    for precision, kind in QUANTIZED.items():
        if any(isinstance(m, kind) for m in layers):
            return precision
    float32 = target.model.embed_tokens.weight.dtype == torch.float32
    return Precision.FP32 if float32 else Precision.BF16


def apply_precision(target: CausalLM, precision: Precision) -> None:
    """Readies the target for an engine in `precision`, in place: its projections fused
    (`layers.fuse_linears`), then cast, and packed (bf16, `model/packed.py`) or
    quantized. Packing and quantizing are one way: such a target asked for another precision
    raises ValueError."""
    target.fuse_projections()
    current = current_precision(target)
    if current is not precision:
        if any(isinstance(m, Bf16Linear) for m in target.modules()):
            raise ValueError(f"the target is already {current}; load it again for {precision}")
        target.to(ACTIVATIONS[precision])
    if precision is Precision.BF16:
        pack_linears(target)  # unties a tied head, as quantizing does
    elif precision in QUANTIZED and current is not precision:
        # Unties a tied head; engine code only calls the head, so it may stop being a Linear.
        target.lm_head = Int8Linear(target.lm_head.weight)  # type: ignore[assignment]
        quantize_linears(target.model.layers, QUANTIZED[precision])


def quantize_like(layers: nn.Module, target: CausalLM) -> None:
    """Quantizes `layers`, a drafter's decoder layers, in place in the kind of the target's
    own, switching to their dense copies from the row count the target's do (`dense_crossover`;
    the drafters' layers have the target's shapes). Drafts need not be exact: on the AVX2-only
    EPYC the DCOCO drafter on w4a8 kept its accepted length (1.90 against 1.91 on code, 2.48
    against 2.45 on math at B = 2) and its two layers' linears cost about half what fbgemm's
    fp16 took at 1-3 rows (docs/engine-profile.md). Left as they are where the target is not
    quantized, or a linear has a bias or an input width off the 4-bit groups."""
    theirs = quantized_linears(target.model.layers)
    linears = [m for m in layers.modules() if isinstance(m, nn.Linear)]
    if not theirs or any(m.bias is not None or m.in_features % GROUP for m in linears):
        return
    quantize_linears(layers, type(theirs[0]))
    for linear in quantized_linears(layers):
        linear.dense_from = theirs[0].dense_from


@dataclass(frozen=True)
class CostTable:
    """Seconds of one target forward over `width` tokens (one row, no cache), per precision,
    and of its matmuls over the weights alone (`matmuls`), which decide `fastest`."""

    seconds: dict[str, dict[int, float]]  # precision -> width -> seconds
    matmuls: dict[str, dict[int, float]]  # precision -> width -> seconds
    threads: int

    def fastest(self, among: tuple[Precision, ...] = tuple(ACTIVATIONS)) -> Precision:
        def score(name: str) -> float:
            row = self.matmuls[name]
            return sum(math.log(s) for s in row.values()) / len(row)

        names = [p.value for p in among if p.value in self.matmuls]
        return Precision(min(names, key=score))

    def to_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "matmuls": self.matmuls, "threads": self.threads}


def widths(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to `limit` tokens in one forward (at most 32)."""
    return tuple(2**i for i in range(6) if 2**i <= max(1, min(limit, 32)))


# The widths every caller measures, whatever its mode or batch size: `auto` is then one
# precision per CPU and model, so vanilla and speculative decoding print the same tokens.
WIDTHS = widths(32)


def weight_matmuls(model: CausalLM) -> list[nn.Module]:
    """The modules that multiply by the model's weights, the LM head included; a quantized
    linear counts once, its dense copy inside it not apart."""
    copies = {id(m) for q in quantized_linears(model) for m in q.modules() if m is not q}
    kinds = nn.Linear | Bf16Linear | QuantizedLinear
    return [m for m in model.modules() if isinstance(m, kinds) and id(m) not in copies]


def measure(target: CausalLM, sizes: tuple[int, ...], cache_dir: Path) -> CostTable:
    """Times forwards of each precision on copies of `target` (which is left as it is), each
    with the kernels an engine of that precision runs (`dense_crossover`), then the weight
    matmuls of such a forward again alone, on the inputs the forward gave them."""
    seconds: dict[str, dict[int, float]] = {}
    matmuls: dict[str, dict[int, float]] = {}
    for precision in measured():
        model = copy.deepcopy(target)
        apply_precision(model, precision)
        dense_crossover(model, cache_dir)
        seconds[precision.value], matmuls[precision.value] = {}, {}
        for width in sizes:
            ids = torch.zeros(1, width, dtype=torch.long)  # [1, T]
            positions = torch.arange(width).unsqueeze(0)  # [1, T]
            inputs: list[tuple[nn.Module, torch.Tensor]] = []
            hooks = [
                m.register_forward_pre_hook(
                    lambda called, args, seen=inputs: seen.append((called, args[0]))
                )
                for m in weight_matmuls(model)
            ]
            whole, alone = [], []
            with torch.inference_mode():
                for _ in range(REPEATS + 1):
                    inputs.clear()
                    start = time.perf_counter()
                    hidden, _ = model(ids, positions)  # [1, T, H]
                    model.logits(hidden)  # [1, T, V]
                    whole.append(time.perf_counter() - start)
                for hook in hooks:
                    hook.remove()
                for _ in range(REPEATS + 1):
                    start = time.perf_counter()
                    for module, x in inputs:
                        module(x)  # [1, T, N]
                    alone.append(time.perf_counter() - start)
            seconds[precision.value][width] = min(whole[1:])
            matmuls[precision.value][width] = min(alone[1:])
        del model
    return CostTable(seconds, matmuls, torch.get_num_threads())


def cache_file(cache_dir: Path) -> Path:
    return cache_dir / "precision.json"


def cache_key(target: CausalLM, settings: tuple[object, ...]) -> str:
    """What a measurement depends on: the CPU, the torch build, threads, the model's shapes
    and the measurement's own settings."""
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
        str(KERNELS),
        str(torch.get_num_threads()),
        repr(target.config),
        repr(settings),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


UNREADABLE = (OSError, ValueError, KeyError, TypeError, AttributeError)
# Measurements taken while the machine was busy, by cache file and key: this process's only.
_BUSY: dict[tuple[Path, str], object] = {}


def cached(
    cache_dir: Path,
    key: str,
    measure_fresh: Callable[[], T],
    read: Callable[[Any], T],
    write: Callable[[T], object],
) -> T:
    """The entry `key` of this CPU's cache file read back with `read`, or `measure_fresh()`
    stored with `write`. An entry that cannot be read is measured afresh, with a warning. The
    file is read again before the write: a measurement may store entries of its own.

    A measurement during which this process waited for its CPUs (other work on the machine)
    serves this process only: it is not stored, so the next start measures again rather than
    keeping a busy moment's timings for good, while every engine of this process reads the
    same one (vanilla and speculative engines then run one precision, and print the same
    tokens)."""
    path = cache_file(cache_dir)
    try:
        entries = _entries(path)
        if key in entries:
            return read(entries[key])
    except UNREADABLE as bad:
        log.warning("precision cache %s unreadable (%s); measuring again", path, bad)
    if (path, key) in _BUSY:
        return _BUSY[path, key]  # type: ignore[return-value]
    with Contention() as contention:
        value = measure_fresh()
    if contention.share > QUIET_SHARE:
        log.warning(
            "precision measurement %s not cached: its threads waited for a CPU %.0f%% of the "
            "time, so other work shared this machine; the next start measures again",
            key,
            100 * contention.share,
        )
        _BUSY[path, key] = value
        return value
    try:
        entries = _entries(path)
    except UNREADABLE:
        entries = {}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(entries | {key: write(value)}, indent=1))
        partial.replace(path)
    except OSError as unwritable:
        log.warning("precision cache %s not written (%s)", path, unwritable)
    return value


def _entries(path: Path) -> dict[str, object]:
    """The cache file's entries, {} before the first; raises if the file is corrupt."""
    if not path.exists():
        return {}
    entries = json.loads(path.read_text())
    if not isinstance(entries, dict):
        raise ValueError("not a JSON object")
    return entries


def cost_table(target: CausalLM, sizes: tuple[int, ...], cache_dir: Path) -> CostTable:
    """The cached table for this CPU and model, or a fresh measurement (then cached)."""

    def read(entry: dict[str, Any]) -> CostTable:
        seconds, matmuls = (
            {p: {int(w): float(s) for w, s in row.items()} for p, row in entry[part].items()}
            for part in ("seconds", "matmuls")
        )
        table = CostTable(seconds, matmuls, int(entry["threads"]))
        table.fastest()  # a bad entry fails here, not later
        return table

    return cached(
        cache_dir,
        cache_key(target, ("crossover", sizes, measured())),
        lambda: measure(target, sizes, cache_dir),
        read,
        CostTable.to_json,
    )


# (rows, queries) of the small attentions an engine runs: decoding alone and batched, and a
# verified or drafted block; each over UPCAST_KEYS keys, a fresh length each repeat.
UPCAST_SHAPES = ((1, 1), (8, 1), (64, 1), (1, 16), (8, 16))
UPCAST_KEYS = 256


def measure_upcast(target: CausalLM) -> dict[str, float]:
    """Seconds of the target's small masked attention (SDPA) in bf16 and on fp32 copies: the
    geometric mean over UPCAST_SHAPES of the fastest of REPEATS calls. The copies are timed
    with it, as a compiled engine converts its bf16 cache; an eager engine that upcasts keeps
    an fp32 cache and converts nothing, so where this says fp32 its attention is cheaper still."""
    c = target.config
    logs = {"bf16": 0.0, "fp32": 0.0}
    for rows, queries in UPCAST_SHAPES:
        for work in logs:
            samples = []
            for repeat in range(REPEATS + 1):
                keys = UPCAST_KEYS + repeat  # a new length, as every decoding step brings
                q = torch.randn(rows, c.num_attention_heads, queries, c.head_dim).bfloat16()
                k = torch.randn(rows, c.num_key_value_heads, keys, c.head_dim).bfloat16()
                mask = torch.ones(rows, 1, queries, keys, dtype=torch.bool)  # [N, 1, T, L]
                dtype = torch.float32 if work == "fp32" else torch.bfloat16
                start = time.perf_counter()
                F.scaled_dot_product_attention(
                    q.to(dtype), k.to(dtype), k.to(dtype), attn_mask=mask, enable_gqa=True
                ).bfloat16()  # [N, Hq, T, D]
                samples.append(time.perf_counter() - start)
            logs[work] += math.log(min(samples[1:])) / len(UPCAST_SHAPES)
    return {work: math.exp(total) for work, total in logs.items()}


def attention_upcast(target: CausalLM, cache_dir: Path) -> bool:
    """Whether small masked bf16 attention is faster on fp32 copies on this CPU (cached)."""

    def read(entry: dict[str, Any]) -> dict[str, float]:
        return {"bf16": float(entry["bf16"]), "fp32": float(entry["fp32"])}

    seconds = cached(
        cache_dir,
        cache_key(target, ("attention", *UPCAST_SHAPES)),
        lambda: measure_upcast(target),
        read,
        lambda s: s,
    )
    upcast = seconds["fp32"] < seconds["bf16"]
    log.info(
        "small bf16 attention %s, from seconds %s", "in fp32" if upcast else "in bf16", seconds
    )
    return upcast


# Rows at which the quantized kernels and the dense bf16 matmuls are timed against each other.
CROSSOVER_ROWS = (1, 2, 4, 8, 12, 16, 24, 32)


def measure_crossover(target: CausalLM) -> dict[str, int]:
    """The fewest rows from which dense bf16 matmuls beat the quantized kernels at every
    measured row count (above CROSSOVER_ROWS when they never do), for the decoder layers
    ("layers") and the LM head ("head"). Whole forwards are timed, so weights stream from
    memory as they do when serving rather than sitting in a cache."""
    parts = {"layers": quantized_linears(target.model.layers), "head": quantized_linears(target)}
    parts["head"] = [m for m in parts["head"] if m not in parts["layers"]]
    faster: dict[str, list[bool]] = {name: [] for name in parts}
    for rows in CROSSOVER_ROWS:
        ids = torch.zeros(1, rows, dtype=torch.long)  # [1, T]
        positions = torch.arange(rows).unsqueeze(0)  # [1, T]
        seconds: dict[tuple[str, bool], float] = {}
        for dense in (True, False):
            for linear in parts["layers"] + parts["head"]:
                linear.dense_from = 0 if dense else rows + 1
            samples: dict[str, list[float]] = {"layers": [], "head": []}
            with torch.inference_mode():
                for _ in range(REPEATS + 1):
                    start = time.perf_counter()
                    hidden, _ = target(ids, positions)  # [1, T, H]
                    middle = time.perf_counter()
                    target.logits(hidden)  # [1, T, V]
                    samples["layers"].append(middle - start)
                    samples["head"].append(time.perf_counter() - middle)
            for name, times in samples.items():
                seconds[name, dense] = min(times[1:])
        for name in parts:
            faster[name].append(seconds[name, True] <= seconds[name, False])
    return {
        name: next(
            (r for i, r in enumerate(CROSSOVER_ROWS) if all(flags[i:])), CROSSOVER_ROWS[-1] + 1
        )
        for name, flags in faster.items()
    }


def dense_crossover(target: CausalLM, cache_dir: Path) -> None:
    """Sets every quantized linear of `target` to switch to its dense weights where that is
    faster on this CPU (`measure_crossover`, cached)."""
    if not quantized_linears(target):
        return

    def read(entry: dict[str, Any]) -> dict[str, int]:
        return {"layers": int(entry["layers"]), "head": int(entry["head"])}

    settings = ("dense", current_precision(target).value, CROSSOVER_ROWS)
    crossover = cached(
        cache_dir, cache_key(target, settings), lambda: measure_crossover(target), read, dict
    )
    layers = quantized_linears(target.model.layers)
    for linear in quantized_linears(target):
        linear.dense_from = crossover["layers" if linear in layers else "head"]
    log.info("quantized linears multiply dense from rows %s", crossover)
