"""The seed's corrector ablations, from the long run's machinery.

    python -m dcoco.train.run_ablate --ablation no-pair --steps 300 \\
        --shards build/train-run/shards/*.pt --out build/ablate/no-pair

trains a fresh corrector on top of the shipped DFlash drafter (frozen: only the corrector
learns, so arms differ in the corrector alone) on the given kept shards, for a fixed number of
steps (not seconds: other work on the machine would make a time budget unequal), and writes a
models folder whose `dcoco/` is the result (the other entries link to the shipped ones), for
`dcoco eval --variants dcoco-prefix`. An ablation removes a pathway by zeroing the weights
that carry it and freezing them at zero, so the shipped checkpoint format and every engine
read the ablated corrector unchanged:

- no-pair: the pair state s_p is zero (`pair` and `delta_pair`), so Delta sees the two
  candidates' representations only;
- no-rep: the candidate representation keeps the token and loses its slot's hidden state
  (`rep_slot`): z = silu(W_tok embed(c)), the token alone. Without any candidate
  representation Delta could not tell two candidates apart and would change nothing.
"""

import argparse
import json
import os
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, load_target, save_drafter
from dcoco.paths import REPO_ROOT
from dcoco.spec.corrector import Corrector
from dcoco.tokenizer import END_OF_TEXT, Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.drafter_stage import Phase, train_drafter, with_corrector
from dcoco.train.run_config import SMOLLM2_RUN, RunConfig
from dcoco.train.run_correctors import drafting_vocab, shipped
from dcoco.train.run_data import concat
from dcoco.train.run_measure import cpu_seconds

LINKED = ("target", "heldout", "dflash", "dcoco-frozen")


class Ablation(StrEnum):
    FULL = "full"
    NO_PAIR = "no-pair"
    NO_REP = "no-rep"


REMOVED = {
    Ablation.FULL: (),
    Ablation.NO_PAIR: ("pair.", "delta_pair."),
    Ablation.NO_REP: ("rep_slot.",),
}


def ablate(corrector: Corrector, ablation: Ablation) -> list[str]:
    """Zeroes and freezes the weights of the removed pathway; returns their names."""
    removed = [n for n, _ in corrector.named_parameters() if n.startswith(REMOVED[ablation])]
    with torch.no_grad():
        for name, param in corrector.named_parameters():
            if name in removed:
                param.zero_()
                param.requires_grad_(False)
    return removed


def train_ablation(
    cfg: RunConfig, shards: list[Path], ablation: Ablation, steps: int, out: Path
) -> dict[str, Any]:
    models = REPO_ROOT / cfg.models_path
    pad = Tokenizer.from_dir(REPO_ROOT / cfg.target_path).token_id(END_OF_TEXT)
    data = replace(concat([Continuations.load(s) for s in shards], pad), labels=cfg.teacher_labels)
    target = load_target(REPO_ROOT / cfg.target_path)
    drafter = with_corrector(load_drafter(models / "dflash"), cfg.corrector, cfg.seed)
    assert drafter.corrector is not None
    removed = ablate(drafter.corrector, ablation)
    ccfg = replace(cfg.corrector, frozen_budget_s=float("inf"), max_steps=steps)
    cpu = cpu_seconds()
    drafter, result = train_drafter(
        Phase.FROZEN,
        drafter,
        target,
        data,
        drafting_vocab(drafter),
        cfg.drafter,
        ccfg,
        cfg.seed,
    )
    out.mkdir(parents=True, exist_ok=True)
    save_drafter(shipped(drafter), out / "dcoco")
    for name in LINKED:
        if not (out / name).exists():
            os.symlink((models / name).resolve(), out / name)
    return {
        "ablation": str(ablation),
        "removed": removed,
        "shards": [str(s) for s in shards],
        "sequences": len(data),
        "steps": result.steps,
        "cpu_s": round(cpu_seconds() - cpu, 1),
        "metrics": {k: round(v, 4) for k, v in result.metrics.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dcoco.train.run_ablate")
    parser.add_argument("--ablation", choices=[a.value for a in Ablation], required=True)
    parser.add_argument("--shards", type=Path, nargs="+", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = replace(SMOLLM2_RUN, threads=args.threads)
    result = train_ablation(cfg, args.shards, Ablation(args.ablation), args.steps, args.out)
    (args.out / "ablation.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
