"""Where a plain step and a speculative cycle of the embedded engine spend their time, by op.

    python -m dcoco.bench.profile [--precision bf16 int4] [--threads 2]
        [--out docs/engine-profile.md]

For each precision, batch 1 and 8, plain decoding and adaptive-off DCOCO cycles (B = 15) of the
default SmolLM2 pair: the wall time of a step measured bare, then the same steps under
torch.profiler with each op's self time summed into groups (matrix products, attention, KV
cache traffic, norms, ...). What the ops do not account for is Python and dispatch between
them. Also the build's GEMM backends, as `torch.__config__.show()` reports them.

Engines run as the worker runs them: outside fp32 with compiled layers, profiled once every
shape class is compiled. A compiled graph's own kernels (norms, rotary, the KV-cache write,
fused elementwise work) and its wrapper do not show as ops: they, and dynamo's dispatch to the
graph, are the group "compiled graphs"; the ops the graphs call (matmuls, attention) keep
their groups.
"""

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.paths import SMOLLM2_MODELS
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams

# Op name, without its namespace (aten::, mkldnn::) -> group; unlisted ops fall in "other".
GROUPS = {
    "matmul (weights)": (
        "mm",
        "addmm",
        "linear",
        "_weight_int8pack_mm",
        "_weight_int4pack_mm_for_cpu",
        "w4a8_linear",  # ours (model/w4a8.cpp)
        "_linear_pointwise",  # oneDNN's, over the packed bf16 weights (model/packed.py)
        "linear_dynamic_fp16",  # fbgemm's, over fp16 weights where bf16 is emulated
    ),
    "attention": (
        "bmm",
        "_softmax",
        "softmax",
        "masked_fill_",
        "_scaled_dot_product_flash_attention_for_cpu",
        "scaled_dot_product_attention",
        "bitwise_not",
    ),
    "KV cache and gathers": (
        "index_put_",
        "_index_put_impl_",
        "index_select",
        "index",
        "clone",
        "contiguous",
    ),
    "norms": ("rms_norm", "_fused_rms_norm", "rsqrt", "pow", "mean"),
    "elementwise": (
        "add",
        "add_",
        "mul",
        "mul_",
        "silu",
        "neg",
        "cat",
        "stack",
        "where",
        "sub",
        "div",
        "div_",
        "max",
        "topk",
        "argmax",
        "sort",
        "gather",
        "lt",
        "le",
        "eq",
        "ne",
        "cumprod",
        "cumsum",
        "sum",
    ),
    "dtype casts and copies": (
        "to",
        "_to_copy",
        "copy_",
        "empty",
        "empty_strided",
        "zeros",
        "full",
        "fill_",
        "arange",
        "tensor",
        "lift_fresh",
        "detach",
        "detach_",
        "resolve_conj",
        "resolve_neg",
    ),
    "views and shapes": (
        "view",
        "reshape",
        "_reshape_alias",
        "transpose",
        "as_strided",
        "slice",
        "select",
        "expand",
        "unsqueeze",
        "squeeze",
        "t",
        "permute",
        "split",
        "unbind",
        "narrow",
        "alias",
        "_unsafe_view",
        "flatten",
    ),
}
# torch.compile's profiler events: a graph's call, and dynamo's and AOTAutograd's around it
COMPILED = (
    "## Call CompiledFxGraph",
    "TorchDynamo Cache Lookup",
    "Torch-Compiled Region",
    "Pregraph bytecode",
    "AOTDispatcher",
)
WARMUP_STEPS = 3


def group_of(name: str) -> str:
    if name.startswith(COMPILED):
        return "compiled graphs"
    bare = name.rpartition("::")[2]
    return next((g for g, ops in GROUPS.items() if bare in ops), "other")


def engine_for(precision: Precision, mode: Mode, batch: int) -> Engine:
    target = load_target(SMOLLM2_MODELS / "target")
    drafter = load_drafter(SMOLLM2_MODELS / "dcoco") if mode.needs_drafter else None
    cfg = EngineConfig(
        mode=mode,
        max_batch_size=batch,
        max_model_len=1024,
        precision=precision,
        compile=precision is not Precision.FP32,
    )
    engine = Engine(target, drafter, cfg)
    engine.runner.wait_compiled()
    params = SamplingParams(max_tokens=100_000, ignore_eos=True)
    prompt = list(range(200, 456))  # 256 tokens of context
    for i in range(batch):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(WARMUP_STEPS):
        engine.step()
    return engine


def profile_steps(engine: Engine, steps: int) -> tuple[float, dict[str, float], int]:
    """(median wall seconds a step unprofiled, seconds per group per step profiled, ops a step)."""
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    groups: dict[str, float] = defaultdict(float)
    calls = 0
    for event in prof.key_averages():
        groups[group_of(event.key)] += event.self_cpu_time_total / 1e6 / steps
        calls += event.count
    return statistics.median(walls), dict(groups), calls // steps


def backends() -> list[str]:
    """What the torch build says of its CPU kernels: capability, BLAS, oneDNN, OpenMP."""
    shown = torch.__config__.show()
    capability = [line.strip(" -") for line in shown.splitlines() if "CPU capability" in line]
    wanted = ("BLAS_INFO", "USE_MKL", "USE_MKLDNN", "USE_OPENMP")
    settings = [item.strip() for item in shown.replace("\n", ",").replace(":", ",").split(",")]
    build = [item for item in settings if item.split("=")[0] in wanted]
    return [f"- {fact}" for fact in capability] + [
        f"- build: {', '.join(build)}",
        f"- oneDNN (mkldnn) available: {torch.backends.mkldnn.is_available()}; "
        f"MKL available: {torch.backends.mkl.is_available()}",
    ]


def run(precisions: list[Precision], steps: int) -> list[str]:
    lines = [
        "# Where the embedded engine spends a step",
        "",
        "Generated by `python -m dcoco.bench.profile` (`make bench-profile`).",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads. The build's kernels:",
        "",
        *backends(),
        "",
        "Each row: the median wall time of a step measured bare, then each group's share of the "
        "ops' self time under torch.profiler (summed per step), and what the ops leave "
        "unaccounted: Python and dispatch between them (the profiler's own cost included). "
        "Context 256 tokens, SmolLM2-135M with its DCOCO drafter, B = 15, every slot verified. "
        "Outside fp32 the layers run compiled, as the worker runs them: a graph's own kernels "
        "and dynamo's dispatch to it are the column 'compiled graphs'.",
        "",
        "| precision | step | batch | wall ms | ops a step | "
        + " | ".join(GROUPS)
        + " | compiled graphs | other | unaccounted |",
        "|---|---|---:|---:|---:|" + "---:|" * (len(GROUPS) + 3),
    ]
    for precision in precisions:
        for mode, label in ((Mode.VANILLA, "plain"), (Mode.DCOCO, "DCOCO cycle")):
            for batch in (1, 8):
                wall, groups, ops = profile_steps(engine_for(precision, mode, batch), steps)
                profiled = sum(groups.values())
                shares = [groups.get(g, 0.0) * 1000 for g in (*GROUPS, "compiled graphs", "other")]
                cells = " | ".join(f"{ms:.1f}" for ms in shares)
                rest = max(0.0, wall - profiled) * 1000
                lines.append(
                    f"| {precision} | {label} | {batch} | {wall * 1000:.1f} | {ops} | {cells} "
                    f"| {rest:.1f} |"
                )
                print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--precision", nargs="+", type=Precision, default=[Precision.BF16, Precision.INT4]
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    text = "\n".join(run(args.precision, args.steps)) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
