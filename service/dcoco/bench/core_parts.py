"""The measurements `make bench-core` puts side by side (`dcoco.bench.core`)."""

import copy
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch

from dcoco.engine.engine import Engine
from dcoco.engine.outputs import Completion
from dcoco.model.causal_lm import CausalLM
from dcoco.precision import apply_precision
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import CycleStats, SpecStats
from dcoco.spec.drafter import DFlashDrafter

GIB = 1 << 30
PHASES = ("draft", "correct", "verify")
WARMUP_TOKENS = 8
LLAMA_TIMEOUT_S = 600.0


def memory_bandwidth() -> float:
    """Bytes a second summing a 1 GiB float32 buffer, best of 5, on torch's threads."""
    buffer = torch.ones(GIB // 4)  # [G]
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return GIB / best


def weight_bytes(target: CausalLM, precision: Precision) -> int:
    """Bytes of weights one decoding step reads: every layer and the LM head (the embedding
    is read one row a token), quantized ones without their dense copies (`model.quant`).
    Puts `target` in `precision`."""
    apply_precision(target, precision)
    parts = [target.model.layers, target.model.norm, target.lm_head]
    return sum(t.numel() * t.element_size() for part in parts for t in read_by_decoding(part))


def read_by_decoding(module: torch.nn.Module) -> list[torch.Tensor]:
    buffers = [b for name, b in module.named_buffers() if "dense" not in name.split(".")]
    return [*module.parameters(), *buffers]


def plain_rates(
    fp32: CausalLM,
    precisions: tuple[Precision, ...],
    prompts: list[list[int]],
    tokens: int,
    passes: int,
) -> dict[Precision, float]:
    """Decoded tokens a second of plain decoding, all prompts at once, in each precision
    (`decode`): the precisions take turns, `passes` times, and each keeps its best pass
    (other work on a shared machine only ever slows a pass down)."""
    engines = {}
    for precision in precisions:
        cfg = EngineConfig(
            mode=Mode.VANILLA,
            max_batch_size=len(prompts),
            max_model_len=1024,
            precision=precision,
            compile=True,
        )
        engines[precision] = Engine(copy.deepcopy(fp32), None, cfg)
        engines[precision].runner.wait_compiled()
        engines[precision].generate(
            prompts[:1], SamplingParams(max_tokens=WARMUP_TOKENS, ignore_eos=True)
        )
    best = dict.fromkeys(precisions, 0.0)
    for _ in range(passes):
        for precision, engine in engines.items():
            decoded, seconds = decode(engine, prompts, tokens)
            best[precision] = max(best[precision], decoded / seconds)
    return best


def decode(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[int, float]:
    """Runs the prompts to `tokens` tokens after their first; returns the tokens decoded and
    the seconds they took, from the step that gave the last prompt its first token: decoding
    alone, the prompts' prefill left out, as llama.cpp's eval time counts it
    (`bench.llama_timing`)."""
    params = SamplingParams(max_tokens=tokens + 1, ignore_eos=True)
    ids = [f"rate-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    waiting, decoded, started = set(ids), 0, 0.0
    while engine.has_unfinished():
        outputs = engine.step().outputs
        if waiting:
            waiting -= {out.request_id for out in outputs if out.new_token_ids}
            started = time.perf_counter()
        else:
            decoded += sum(len(out.new_token_ids) for out in outputs)
    return decoded, time.perf_counter() - started


@dataclass(frozen=True)
class Row:
    variant: str
    tokens_per_s: float
    over_plain: float
    accepted_length: float
    phase_ms: dict[str, float]  # mean per cycle

    def markdown(self, suite: str) -> str:
        phases = " | ".join(f"{self.phase_ms.get(p, 0.0):.1f}" for p in PHASES)
        return (
            f"| {suite} | {self.variant} | {self.tokens_per_s:.1f} | {self.over_plain:.2f}x "
            f"| {self.accepted_length:.2f} | {phases} |"
        )


VARIANTS = (  # name, mode, drafter folder, adaptive, lookup
    ("vanilla", Mode.VANILLA, None, False, False),
    ("ngram", Mode.NGRAM, None, False, False),
    ("dflash", Mode.DFLASH, "dflash", False, False),
    ("dcoco", Mode.DCOCO, "dcoco", False, False),
    ("dcoco-adaptive", Mode.DCOCO, "dcoco", True, False),
    ("dcoco-lookup", Mode.DCOCO, "dcoco", True, True),  # the worker's default
)


@dataclass
class Tally:
    """One variant's pass over the prompts."""

    generated: int = 0
    seconds: float = 0.0
    stats: SpecStats = field(default_factory=SpecStats)
    phases: dict[str, float] = field(default_factory=dict)
    cycles: int = 0

    @property
    def rate(self) -> float:
        return self.generated / self.seconds if self.seconds else 0.0

    def add(self, completion: Completion, cycles: list[CycleStats], seconds: float) -> None:
        self.generated += len(completion.token_ids)
        self.seconds += seconds
        self.stats.add(completion.stats)
        self.cycles += len(cycles)
        for cycle in cycles:
            for phase, spent in cycle.seconds.items():
                self.phases[phase] = self.phases.get(phase, 0.0) + spent


def spec_rates(
    fp32: CausalLM,
    drafters: dict[str, DFlashDrafter],
    precision: Precision,
    prompts: list[list[int]],
    tokens: int,
    passes: int,
) -> list[Row]:
    """Plain, n-gram, DFlash, DCOCO and adaptive DCOCO without and with lookup drafts, at batch
    1: for each prompt the variants take turns, `passes` times over all prompts; each variant
    keeps its best pass."""
    engines = []
    for _, mode, drafter, adaptive, lookup in VARIANTS:
        cfg = EngineConfig(
            mode=mode,
            max_batch_size=1,
            max_model_len=1024,
            precision=precision,
            adaptive=adaptive,
            lookup=lookup,
            compile=True,
        )
        spec = copy.deepcopy(drafters[drafter]) if drafter else None
        engine = Engine(copy.deepcopy(fp32), spec, cfg)
        engine.runner.wait_compiled()
        engine.generate(prompts[:1], SamplingParams(max_tokens=WARMUP_TOKENS))
        engines.append(engine)
    params = SamplingParams(max_tokens=tokens)
    best = [Tally() for _ in VARIANTS]
    for _ in range(passes):
        tallies = [Tally() for _ in VARIANTS]
        for prompt in prompts:
            for engine, tally in zip(engines, tallies, strict=True):
                start = time.perf_counter()
                (completion,), cycles = engine.generate([prompt], params)
                tally.add(completion, cycles, time.perf_counter() - start)
        best = [max(a, b, key=lambda t: t.rate) for a, b in zip(best, tallies, strict=True)]
    plain = best[0].rate
    return [
        Row(
            name,
            tally.rate,
            tally.rate / plain,
            tally.stats.mean_accepted_length,
            {p: 1000 * spent / max(1, tally.cycles) for p, spent in tally.phases.items()},
        )
        for (name, *_), tally in zip(VARIANTS, best, strict=True)
    ]


@dataclass(frozen=True)
class LlamaTiming:
    ms: float  # milliseconds per decoded token
    extra: bool  # with llama.cpp's extra buffer types (AMX, repacked weights)
    notes: list[str]  # what failed on the way


def llama_cpp_ms(gguf: Path, prompt: list[int], tokens: int, threads: int) -> LlamaTiming | None:
    """llama.cpp's milliseconds per decoded token after `prompt`, greedy, in a process of its
    own (`bench.llama_timing`); None when llama-cpp-python is not installed."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    command = [sys.executable, "-m", "dcoco.bench.llama_timing"]
    return time_llama(command, [str(gguf), str(tokens), str(threads)], prompt)


def time_llama(command: list[str], args: list[str], prompt: list[int]) -> LlamaTiming:
    """Runs `command` *args KIND with the prompt on stdin: KIND "extra" (llama-cpp-python's
    default kernels) first, then "plain" (without its extra buffer types) if that failed.
    Raises RuntimeError when both fail."""
    notes: list[str] = []
    for kind in ("extra", "plain"):
        run = subprocess.run(
            [*command, *args, kind],
            input=json.dumps(prompt),
            capture_output=True,
            text=True,
            timeout=LLAMA_TIMEOUT_S,
        )
        if run.returncode == 0:
            return LlamaTiming(float(run.stdout.split()[-1]), kind == "extra", notes)
        reason = f"signal {-run.returncode}" if run.returncode < 0 else f"exit {run.returncode}"
        notes.append(f"llama.cpp with {kind} buffer types failed ({reason})")
    raise RuntimeError("; ".join(notes))


QUIET_STEPS = 30  # the streams' steps timed before the long prompt joins


class Gaps(NamedTuple):
    """The streams' gaps between tokens around a long prompt's join, in seconds."""

    median: float  # over QUIET_STEPS steps before it joins
    quiet: float  # the largest of those: what the machine's own noise gives, with no join
    joining: float  # the largest from its join until it has its first token
    first: float  # its time to that first token


def gaps(
    target: CausalLM,
    precision: Precision,
    prompt: list[int],
    long_prompt: list[int],
    budget: int,
    cycles: float,
    alongside: bool | None = None,
) -> Gaps:
    """8 streams decode, then a long prompt joins, prefilled `budget` tokens a step at most,
    steered to `cycles` decoding cycles (0: `budget` every step), its chunks in the streams'
    forward, in their own, or where measured cheaper (`alongside` True, False, None)."""
    cfg = EngineConfig(
        mode=Mode.VANILLA,
        max_batch_size=9,
        max_model_len=len(long_prompt) + QUIET_STEPS + 64,
        precision=precision,
        prefill_tokens=budget,
        prefill_cycles=cycles,
        prefill_alongside=alongside,
        compile=True,
    )
    engine = Engine(target, None, cfg)
    engine.runner.wait_compiled()
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"s{i}", prompt, params)
    for _ in range(3):
        engine.step()
    last = dict.fromkeys((f"s{i}" for i in range(8)), time.perf_counter())
    before: list[float] = []
    during: list[float] = []
    for step in range(10_000):
        if step == QUIET_STEPS:
            engine.add_request("long", long_prompt, SamplingParams(max_tokens=1))
            joined = time.perf_counter()
        result = engine.step()
        now = time.perf_counter()
        for out in result.outputs:
            if out.request_id in last:
                (during if step >= QUIET_STEPS else before).append(now - last[out.request_id])
                last[out.request_id] = now
        if any(out.request_id == "long" for out in result.outputs):
            break
    return Gaps(statistics.median(before), max(before), max(during), time.perf_counter() - joined)
