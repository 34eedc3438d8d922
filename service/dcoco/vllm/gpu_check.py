"""`make gpu-check`: DCOCO on a CUDA GPU with CUDA vLLM, in one compact report (no downloads).

1. The V2 runner serves the embedded pair; its greedy output equals plain vLLM's.
2. DCOCO's accepted length against the same weights run as plain DFlash, on the held-out
   prompts (`models/tiny/heldout/*.jsonl`).
3. Correction cost (top-K, corrector scores, walk) against the drafting step at Qwen3-8B
   dimensions (hidden 4096, vocabulary 151,936, B = 15, K = 16, batch 1 to 32, random
   weights, bf16). Goal: under 3% of the step, and under 50 us at batch 32. The step here is
   the drafter's forward, its LM head and the correction: the target's verification is not
   run, so the share reported is an upper bound of the share of a whole cycle.

Without a GPU (or without vLLM) it prints one line and exits 2. Budget: about 8 minutes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcoco.paths import TINY_DCOCO, TINY_HELDOUT, TINY_TARGET

PROMPTS_PER_SUITE = 16
MAX_TOKENS = 128
RUN_TIMEOUT_S = 150


class CheckFailed(Exception):
    """The machine cannot run the check; one line for the user."""


def require_gpu() -> None:
    try:
        import torch
    except ImportError:
        raise CheckFailed("torch is not installed in this interpreter") from None
    if not torch.cuda.is_available():
        raise CheckFailed(
            "no CUDA GPU visible (torch.cuda.is_available() is False); this check needs an "
            "NVIDIA GPU and a CUDA build of vLLM"
        )
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise CheckFailed("vLLM is not installed in this interpreter") from None


def heldout_prompts() -> list[list[int]]:
    from dcoco.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    prompts = []
    for suite in sorted(TINY_HELDOUT.glob("*.jsonl")):
        for line in suite.read_text().splitlines()[:PROMPTS_PER_SUITE]:
            chat = [{"role": "user", "content": json.loads(line)["prompt"]}]
            prompts.append(tokenizer.encode(tokenizer.render_chat(chat)))
    return prompts


def offline(root: Path, name: str, drafter: Path | None) -> dict[str, Any]:
    """One vLLM process (V2 runner), greedy over the prompt file in `root`."""
    out = root / f"{name}.json"
    args = [sys.executable, "-m", "dcoco.vllm.offline", "--target", str(TINY_TARGET)]
    args += ["--prompts", str(root / "prompts.jsonl"), "--out", str(out)]
    args += ["--max-tokens", str(MAX_TOKENS), "--max-num-seqs", "64"]
    args += ["--drafter", str(drafter)] if drafter else []
    env = dict(os.environ) | {"VLLM_USE_V2_MODEL_RUNNER": "1", "HF_HUB_OFFLINE": "1"}
    with (root / f"{name}.log").open("w") as log:
        done = subprocess.run(args, stdout=log, stderr=log, env=env, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise CheckFailed(f"vLLM ({name}) failed; see {root / (name + '.log')}")
    return dict(json.loads(out.read_text()))


@dataclass(frozen=True)
class Dims:
    """The model card's Qwen3-8B drafter: 5 layers at hidden 4096, corrector 128/128/256."""

    hidden: int = 4096
    vocab: int = 151_936
    layers: int = 5
    intermediate: int = 12_288
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    block: int = 15  # B
    top_k: int = 16  # K
    context: int = 1024  # context tokens the drafter attends to
    corrector: tuple[int, int, int] = (128, 128, 256)  # rep_dim, pair_dim, mlp_dim


def timed_ms(fn: Callable[[], object], device: str, repeats: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    if device != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) * 1000 / repeats
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(begin.elapsed_time(end)) / repeats


def correction_cost(
    batches: list[int], dims: Dims = Dims(), device: str = "cuda"
) -> list[dict[str, float]]:
    """Per batch: milliseconds of the drafting step (forward and LM head) and of the
    correction after it (top-K, corrector scores, the walk), random bf16 weights."""
    import torch

    from dcoco.model.layers import TransformerConfig
    from dcoco.spec.corrector import CorrectorConfig
    from dcoco.spec.drafter import DFlashDrafter, DrafterConfig
    from dcoco.vllm.runtime import DCOCORuntime, SelectionConfig

    d = dims
    shape = TransformerConfig(
        d.vocab, d.hidden, d.intermediate, d.layers, d.heads, d.kv_heads, d.head_dim
    )
    cfg = DrafterConfig(
        shape, d.block, d.vocab - 1, (1, 2), d.hidden, CorrectorConfig(d.top_k, *d.corrector)
    )
    with torch.device(device):
        drafter = DFlashDrafter(cfg).to(torch.bfloat16).eval()
        lm_head = torch.randn(d.vocab, d.hidden, dtype=torch.bfloat16) * 0.02  # [V, H]
        embed = torch.randn(d.vocab, d.hidden, dtype=torch.bfloat16) * 0.02  # [V, H]
    assert drafter.corrector is not None
    runtime = DCOCORuntime(drafter.corrector, SelectionConfig(d.top_k))
    drafter.rotary.reserve(d.context + d.block + 1)
    runtime.corrector.build_token_table(embed)
    with torch.inference_mode():
        return [_one_batch(drafter, runtime, lm_head, embed, d, batch, device) for batch in batches]


def _one_batch(
    drafter: Any, runtime: Any, lm_head: Any, embed: Any, d: Dims, batch: int, device: str
) -> dict[str, float]:
    import torch

    bf16 = torch.bfloat16
    shape = (batch, d.kv_heads, d.context, d.head_dim)
    ctx = torch.randn(shape, dtype=bf16, device=device)  # [R, Hkv, C, D] cached context
    embeds = torch.randn(batch, d.block + 1, d.hidden, dtype=bf16, device=device)  # [R, B+1, H]
    slots = torch.arange(d.block + 1, device=device)  # [B+1]
    positions = (d.context + slots).expand(batch, -1)  # [R, B+1]
    rows = torch.arange(batch, device=device)  # [R]

    def kv(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([ctx, k], dim=2), torch.cat([ctx, v], dim=2)  # [R, Hkv, C+B+1, D]

    def draft() -> tuple[torch.Tensor, torch.Tensor]:
        states = drafter(embeds, positions, kv, None)[:, 1:]  # [R, B, H]
        return states, states @ lm_head.T  # [R, B, V]

    states, logits = draft()

    def correct() -> torch.Tensor:
        values, ids = logits.topk(d.top_k, dim=-1)  # [R, B, K] each
        scores = runtime.transition_scores(states, ids, values, embed)  # [R, B, K, K]
        index = torch.zeros(batch, dtype=torch.long, device=device)  # [R]
        for p in range(d.block):  # the walk, as vLLM's kernel does it: no host sync
            index = scores[rows, p, index].argmax(-1)  # [R]
        return index

    return {
        "batch": batch,
        "draft_ms": timed_ms(draft, device),
        "correct_ms": timed_ms(correct, device),
    }


def run(work: Path) -> tuple[list[str], bool]:
    from dcoco.vllm.export import ExportOptions, export_drafter

    lines, ok = ["DCOCO gpu-check"], True
    prompts = heldout_prompts()
    (work / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts)
    )
    plain = offline(work, "plain", None)
    dcoco = offline(work, "dcoco", TINY_DCOCO)
    same = sum(a == b for a, b in zip(plain["token_ids"], dcoco["token_ids"], strict=True))
    ok &= same == len(prompts)
    lines.append(f"1. V2 greedy output equals plain vLLM: {same}/{len(prompts)} prompts")
    export_drafter(TINY_DCOCO, work / "dflash-drafter", ExportOptions(format="dflash"))
    dflash = offline(work, "dflash", work / "dflash-drafter")
    lengths = {
        n: 1 + r["accepted_tokens"] / max(r["drafts"], 1)
        for n, r in (("dcoco", dcoco), ("dflash", dflash))
    }
    lines.append(
        f"2. accepted length, held-out ({len(prompts)} prompts): DCOCO {lengths['dcoco']:.3f}, "
        f"plain DFlash {lengths['dflash']:.3f} (x{lengths['dcoco'] / lengths['dflash']:.3f})"
    )
    lines.append("3. correction at Qwen3-8B dims (bf16): batch, step ms, correction us, share")
    for row in correction_cost([1, 2, 4, 8, 16, 32]):
        step = row["draft_ms"] + row["correct_ms"]
        share = row["correct_ms"] / step
        us = row["correct_ms"] * 1000
        lines.append(f"   {row['batch']:>2}  {step:8.3f}  {us:8.1f}  {share:6.2%}")
        if row["batch"] == 32:
            goal = share < 0.03 and row["correct_ms"] * 1000 < 50
            lines.append(f"   goal (< 3% and < 50 us at batch 32): {'met' if goal else 'NOT met'}")
            ok &= goal
    return lines, ok


def main() -> int:
    argparse.ArgumentParser(prog="make gpu-check", description=__doc__).parse_args()
    started = time.monotonic()
    try:
        require_gpu()
        with tempfile.TemporaryDirectory(prefix="dcoco-gpu-check-") as work:
            lines, ok = run(Path(work))
    except (CheckFailed, subprocess.TimeoutExpired) as problem:
        print(f"gpu-check: {problem}", file=sys.stderr)
        return 2
    lines.append(f"{'PASS' if ok else 'FAIL'} in {time.monotonic() - started:.0f} s")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
