"""Generation through vLLM's offline `LLM` (greedy by default), with its spec-decode counters.

    python -m dcoco.vllm.offline --target T [--drafter D] --prompts FILE.jsonl --out OUT.json

Each prompt line is {"prompt_ids": [...]}. The tests, `make gpu-check` and `make bench-vllm`
use it to run vLLM in a process of its own (vLLM's venv), and compare the result with the torch
engine's. OUT holds the token ids per prompt and the counters: drafts, draft tokens, accepted
tokens, acceptance per position and prefix-cache hits. With `--passes N` the prompts are
generated N times in turn, and OUT adds `passes`: each pass's token ids and counters.

vLLM's engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` unless set): an
offline run has no API to overlap with it, and on CPU vLLM otherwise starts two more processes
(its engine core and a worker), each importing vLLM again: 45 s to generate the tiny pair's 8
test prompts on 2 cores (AMD EPYC), 19 s in one process, the same tokens and counters.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dcoco.vllm.spec_config import speculative_config

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}
COUNTED = tuple(COUNTERS.values())


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [json.loads(line)["prompt_ids"] for line in args.prompts.read_text().splitlines()]
    spec = (
        speculative_config(
            args.drafter,
            args.num_speculative_tokens,
            draft_sample_method=args.draft_sample_method,
        )
        if args.drafter
        else None
    )
    llm = LLM(
        model=str(args.target),
        speculative_config=spec,
        dtype="float32",
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        seed=0,
        disable_log_stats=False,
        enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    params = SamplingParams(
        temperature=args.temperature,
        seed=args.seed,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
    requests = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    seen = [counters(llm)]  # the counters before each pass, and after the last
    passes = []
    for _ in range(args.passes):
        started = time.perf_counter()
        outputs = llm.generate(requests, params)
        elapsed = time.perf_counter() - started
        seen.append(counters(llm))
        passes.append(
            {
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                "seconds": elapsed,
            }
            | {name: seen[-1][name] - seen[-2][name] for name in COUNTED}
        )
    first = passes[0]
    result = {"token_ids": first["token_ids"], "seconds": first["seconds"]} | seen[-1]
    if args.passes > 1:
        result["passes"] = passes
    return result


def counters(llm: Any) -> dict[str, Any]:
    """vLLM's counters so far: drafts, draft tokens, accepted tokens, prefix-cache hits."""
    found: dict[str, Any] = dict.fromkeys(COUNTED, 0) | {"accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in COUNTERS:
            found[COUNTERS[metric.name]] = int(metric.value)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["accepted_per_position"] = [int(v) for v in metric.values]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m dcoco.vllm.offline")
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--num-speculative-tokens", type=int, default=15)
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, help="per request; default: none")
    parser.add_argument(
        "--draft-sample-method", choices=["greedy", "probabilistic"], default="greedy"
    )
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--passes", type=int, default=1, help="generate the prompts this many times, in turn"
    )
    # On CPU this only sizes a start-up check of free memory (the KV cache is
    # VLLM_CPU_KVCACHE_SPACE); vLLM's 0.92 default fails on a shared machine.
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    args = parser.parse_args()
    if args.passes < 1:
        parser.error("--passes must be at least 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # one process (above)
    args.out.write_text(json.dumps(run(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
