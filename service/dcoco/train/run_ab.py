"""A small A/B of the long run's data sources: DFlash continued from the shipped drafter on
each source's shards, exported as model folders for `dcoco eval`.

    python -m dcoco.train.run_ab teacher --sequences 1024 --out build/ab/teacher
    python -m dcoco.train.run_ab train --shards build/ab/teacher/shards/*.pt --labels argmax \\
        --steps 240 --export-at 60 240 --out build/ab/argmax
    python -m dcoco.train.run_ab summary argmax=build/ab/argmax/step-240/eval/eval-results.json

`teacher` prefills the run's first prompts with their texts' answers (argmax kept, so one set
of shards serves every label mode) and records its CPU seconds; `train` runs the leg's DFlash
step on the given shards (self-distilled ones from `dcoco train-run`, or teacher-forced ones)
and exports the weights as trained, not averaged (an average over a few hundred steps would
still be mostly the shipped weights), at each `--export-at` step into `<out>/step-<n>/`, a
models folder whose other entries link to the shipped ones. Each writes a JSON record of what
it did and the CPU seconds it took, so that arms can be compared at equal CPU time. `summary`
reads each arm's `dcoco eval` results into one line of figures.
"""

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, load_target, save_drafter
from dcoco.paths import REPO_ROOT
from dcoco.spec.drafter import DFlashDrafter
from dcoco.tokenizer import END_OF_TEXT, Tokenizer
from dcoco.train.data import Continuations, Labels
from dcoco.train.run import DFlashTrainer
from dcoco.train.run_config import SMOLLM2_RUN, RunConfig
from dcoco.train.run_correctors import shipped
from dcoco.train.run_data import answer_tokens, concat, write_shard
from dcoco.train.run_measure import cpu_seconds
from dcoco.train.run_prompts import stream_of
from dcoco.train.run_teacher import Prefiller

LINKED = ("target", "heldout", "dcoco", "dcoco-frozen")  # shared by every arm's models folder


def make_teacher(cfg: RunConfig, sequences: int, out: Path) -> dict[str, Any]:
    """Teacher-forced shards of the stream's first prompts, in `out`."""
    models = REPO_ROOT / cfg.models_path
    tokenizer = Tokenizer.from_dir(REPO_ROOT / cfg.target_path)
    layers = load_drafter(models / "dflash").config.target_layer_ids
    prompts = stream_of(cfg)
    target = load_target(REPO_ROOT / cfg.target_path)
    prefiller = Prefiller(target, tokenizer, prompts, 0, cfg, layers, argmax=True)
    cpu, written, tokens = cpu_seconds(), 0, 0
    while written * cfg.shard_sequences < sequences and not prefiller.exhausted:
        prefiller.step()
        taken = prefiller.take_shard()
        if taken is not None:
            write_shard(out, written, taken[0])
            tokens += answer_tokens(taken[0])
            written += 1
    return {
        "shards": written,
        "next_text": prefiller.cursor,
        "label_tokens": tokens,
        "cpu_s": round(cpu_seconds() - cpu, 1),
        "threads": cfg.threads,
    }


def train_arm(
    cfg: RunConfig, shards: list[Path], labels: Labels, steps: int, export_at: list[int], out: Path
) -> dict[str, Any]:
    """`steps` DFlash steps from the shipped drafter on the shards, exported at `export_at`."""
    models = REPO_ROOT / cfg.models_path
    pad = Tokenizer.from_dir(REPO_ROOT / cfg.target_path).token_id(END_OF_TEXT)
    data = replace(concat([Continuations.load(s) for s in shards], pad), labels=labels)
    target = load_target(REPO_ROOT / cfg.target_path)
    trainer = DFlashTrainer(load_drafter(models / "dflash"), target, cfg, 0)
    cpu, record = cpu_seconds(), {}
    while trainer.step < steps:
        trainer.train(data, trainer.step / steps)
        if trainer.step % 20 == 0:
            print(f"[ab] step {trainer.step}, {cpu_seconds() - cpu:.0f} CPU-s", flush=True)
        if trainer.step in export_at:
            folder = out / f"step-{trainer.step}"
            _models_folder(models, folder, _trained(trainer))
            record[str(trainer.step)] = {
                "cpu_s": round(cpu_seconds() - cpu, 1),
                "losses": {k: round(v, 4) for k, v in trainer.losses.items()},
            }
    return {
        "shards": [str(s) for s in shards],
        "labels": str(labels),
        "sequences": len(data),
        "label_tokens": answer_tokens(data),
        "steps": steps,
        "threads": cfg.threads,
        "exports": record,
    }


def _trained(trainer: DFlashTrainer) -> DFlashDrafter:
    """The drafter's weights as trained, with the trained mask vector, in eval mode."""
    copy = DFlashDrafter(trainer.drafter.config)
    copy.load_state_dict(trainer.drafter.state_dict())
    copy.mask_embedding = trainer.step_fn.mask.detach().clone().view(-1)  # [H]
    return copy.eval()


def _models_folder(models: Path, folder: Path, dflash: DFlashDrafter) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_drafter(shipped(dflash), folder / "dflash")
    for name in LINKED:
        link = folder / name
        if not link.exists():
            os.symlink((models / name).resolve(), link)


def summary(name: str, results: dict[str, Any], drafter: str = "dflash") -> dict[str, Any]:
    """One arm's figures from a `dcoco eval` results file: the drafter's accepted length per
    suite (greedy, batch 1) and their mean, and coverage at slots 1 and B averaged over suites."""
    lengths = {
        r["suite"]: r["accepted_length"]
        for r in results["runs"]
        if r["variant"] == drafter and r["setting"] == "greedy-b1"
    }
    coverage = list(results["coverage"][drafter].values())

    def mean(key: str, at: int) -> float:
        return round(sum(c[key][at] for c in coverage) / len(coverage), 3)

    return {
        "arm": name,
        "accepted_length": {k: round(v, 3) for k, v in lengths.items()},
        "mean_accepted_length": round(sum(lengths.values()) / len(lengths), 3),
        "top1_slot1": mean("top1_by_depth", 0),
        "topk_slot1": mean("topk_by_depth", 0),
        "top1_slot15": mean("top1_by_depth", -1),
        "topk_slot15": mean("topk_by_depth", -1),
        "teacher_forced_accepted_length": round(
            sum(c["teacher_forced_accepted_length_top1"] for c in coverage) / len(coverage), 3
        ),
        "oracle_walk": round(
            sum(c["teacher_forced_accepted_length_oracle"] for c in coverage) / len(coverage), 3
        ),
    }


def ab_config(steps: int, threads: int) -> RunConfig:
    """The leg's DFlash settings, the schedule fitted to an arm of `steps` steps."""
    base = SMOLLM2_RUN
    warmup = max(1, min(base.drafter.warmup_steps, steps // 5))
    return replace(base, threads=threads, drafter=replace(base.drafter, warmup_steps=warmup))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m dcoco.train.run_ab")
    parser.add_argument("--threads", type=int, default=1)
    commands = parser.add_subparsers(dest="command", required=True)
    teacher = commands.add_parser("teacher", help="teacher-forced shards of the first prompts")
    teacher.add_argument("--sequences", type=int, required=True)
    teacher.add_argument("--out", type=Path, required=True)
    train = commands.add_parser("train", help="one arm: DFlash steps on the given shards")
    train.add_argument("--shards", type=Path, nargs="+", required=True)
    train.add_argument("--labels", choices=[m.value for m in Labels], default=Labels.TEXT.value)
    train.add_argument("--steps", type=int, required=True)
    train.add_argument("--export-at", type=int, nargs="+", required=True)
    train.add_argument("--out", type=Path, required=True)
    report = commands.add_parser("summary", help="each arm's figures from its eval results")
    report.add_argument("arms", nargs="+", help="NAME=path/to/eval-results.json")
    args = parser.parse_args()
    if args.command == "summary":
        for arm in args.arms:
            name, path = arm.split("=", 1)
            print(json.dumps(summary(name, json.loads(Path(path).read_text()))))
        return
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "teacher":
        cfg = replace(SMOLLM2_RUN, threads=args.threads)
        result = make_teacher(cfg, args.sequences, args.out)
    else:
        cfg = ab_config(args.steps, args.threads)
        labels = Labels(args.labels)
        result = train_arm(cfg, args.shards, labels, args.steps, args.export_at, args.out)
    (args.out / f"{args.command}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
