"""Acceptance inside vLLM against the torch engine, on the same held-out prompts (greedy, fp32).

vLLM runs offline (`dcoco.vllm.offline`, one process per drafter, one at a time):
- DCOCO: the embedded DCOCO drafter through the plugin;
- DCOCO, K = 1: the same checkpoint with `dcoco_selection.top_k = 1`, i.e. plain top-1 DFlash
  drafting through our model class (per-layer k_norm);
- stock DFlash: the same weights exported as a plain DFlash drafter, through vLLM's own class.
The torch engine runs the same prompts in modes dcoco and dflash. Part of `make bench-vllm`.
"""

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from dcoco.paths import TINY_DCOCO, TINY_HELDOUT, TINY_TARGET
from dcoco.shared.options import Mode
from dcoco.vllm.export import ExportOptions, export_drafter


def suite_prompts(per_suite: int) -> list[list[int]]:
    from dcoco.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    prompts = []
    for suite in sorted(TINY_HELDOUT.glob("*.jsonl")):
        for line in suite.read_text().splitlines()[:per_suite]:
            chat = [{"role": "user", "content": json.loads(line)["prompt"]}]
            prompts.append(tokenizer.encode(tokenizer.render_chat(chat)))
    return prompts


def in_vllm(
    python: str, env: dict[str, str], drafter: Path, prompts: Path, max_tokens: int, folder: Path
) -> dict[str, Any]:
    out = folder / f"{drafter.name}.json"
    args = [python, "-m", "dcoco.vllm.offline", "--target", str(TINY_TARGET), "--drafter"]
    args += [str(drafter), "--prompts", str(prompts), "--out", str(out)]
    args += ["--max-tokens", str(max_tokens), "--gpu-memory-utilization", "0.3"]
    with (folder / f"{drafter.name}.log").open("w") as log:
        subprocess.run(args, stdout=log, stderr=log, env=env, check=True, timeout=900)
    return dict(json.loads(out.read_text()))


def in_torch(mode: Mode, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    from dcoco.engine.load import load_engine
    from dcoco.shared.engine_config import EngineConfig
    from dcoco.shared.sampling import SamplingParams
    from dcoco.tokenizer import Tokenizer

    eos = Tokenizer.from_dir(TINY_TARGET).eos_token_ids
    cfg = EngineConfig(mode=mode, max_batch_size=len(prompts), eos_token_ids=eos)
    engine = load_engine(TINY_TARGET, TINY_DCOCO, cfg)  # dflash mode: its top-1
    completions, cycles = engine.generate(prompts, SamplingParams(max_tokens=max_tokens))
    return {
        "token_ids": [c.token_ids for c in completions],
        "drafts": sum(c.verifications for c in cycles),
        "accepted_tokens": sum(c.accepted_tokens for c in cycles),
    }


def acceptance_rows(python: str, env: dict[str, str], per_suite: int, max_tokens: int) -> list[str]:
    prompts = suite_prompts(per_suite)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="dcoco-acceptance-") as work:
        folder = Path(work)
        prompt_file = folder / "prompts.jsonl"
        prompt_file.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
        top1, plain = folder / "dcoco-k1", folder / "dflash-export"
        export_drafter(TINY_DCOCO, top1, ExportOptions(top_k=1))
        export_drafter(TINY_DCOCO, plain, ExportOptions(format="dflash"))
        for name, drafter in (
            ("DCOCO", TINY_DCOCO),
            ("DCOCO, K = 1", top1),
            ("stock DFlash", plain),
        ):
            runs[f"vLLM: {name}"] = in_vllm(python, env, drafter, prompt_file, max_tokens, folder)
    runs["torch engine: dcoco"] = in_torch(Mode.DCOCO, prompts, max_tokens)
    runs["torch engine: dflash (same weights, top-1)"] = in_torch(Mode.DFLASH, prompts, max_tokens)
    vanilla = in_torch(Mode.VANILLA, prompts, max_tokens)["token_ids"]
    rows = [
        f"{len(prompts)} held-out prompts ({per_suite} each of code, math, prose), up to "
        f"{max_tokens} tokens, greedy, batch {len(prompts)}, fp32.",
        "",
        "| run | cycles | accepted drafted tokens | accepted length "
        "| output equals the target's greedy |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in runs.items():
        same = sum(a == b for a, b in zip(r["token_ids"], vanilla, strict=True))
        length = 1 + r["accepted_tokens"] / r["drafts"]
        rows.append(
            f"| {name} | {r['drafts']} | {r['accepted_tokens']} | {length:.3f} | "
            f"{same}/{len(prompts)} |"
        )
    return rows
