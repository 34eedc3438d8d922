"""The training pipeline: seven resumable stages in a work folder, then an export.

Each stage writes `<work>/<stage>/` and, last, `<work>/<stage>/stage.json` with a fingerprint
of its settings and of every stage it depends on. A rerun skips a stage whose fingerprint
still matches, so an interrupted run resumes at the stage it was in, and changing a setting
reruns that stage and everything after it.
"""

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from dcoco.train.config import PipelineConfig
from dcoco.train.drafter_stage import Phase
from dcoco.train.stages import (
    Facts,
    build_corpus,
    build_distill,
    build_drafter,
    build_target,
    build_tokenizer,
    export,
)

MARKER = "stage.json"
StageFn = Callable[[PipelineConfig, Path, Path], Facts]


def _drafter(phase: Phase) -> StageFn:
    return lambda cfg, work, out: build_drafter(cfg, work, out, phase)


Stage = tuple[str, StageFn, Callable[[PipelineConfig], Any], str | None]


def _distill_settings(c: PipelineConfig) -> Any:
    """Kept features come from the drafter's target layers; a pretrained target is named."""
    layers = c.drafter.target_layer_ids if c.distill.keep_features else ()
    return (asdict(c.distill), layers, c.target_path)


# name, function, what its fingerprint covers, the stage before it
STAGES: tuple[Stage, ...] = (
    ("corpus", build_corpus, lambda c: (c.seed, asdict(c.corpus)), None),
    ("tokenizer", build_tokenizer, lambda c: asdict(c.tokenizer), "corpus"),
    ("target", build_target, lambda c: asdict(c.target), "tokenizer"),
    ("distill", build_distill, _distill_settings, "target"),
    ("dflash", _drafter(Phase.DFLASH), lambda c: (asdict(c.drafter), c.mask_token), "distill"),
    ("dcoco", _drafter(Phase.JOINT), lambda c: asdict(c.corrector), "dflash"),
    ("dcoco-frozen", _drafter(Phase.FROZEN), lambda c: asdict(c.corrector), "dflash"),
)
STAGE_NAMES = tuple(name for name, *_ in STAGES)
TRAINS_A_TARGET = ("tokenizer", "target")


def stages(cfg: PipelineConfig) -> tuple[Stage, ...]:
    """All stages, or without the target's own when the target is pretrained."""
    if not cfg.target_path:
        return STAGES
    kept = tuple(s for s in STAGES if s[0] not in TRAINS_A_TARGET)
    return tuple((n, f, k, "corpus" if b in TRAINS_A_TARGET else b) for n, f, k, b in kept)


def budgets(cfg: PipelineConfig) -> dict[str, float]:
    return {
        "corpus": cfg.corpus.budget_s,
        "tokenizer": cfg.tokenizer.budget_s,
        "target": cfg.target.budget_s,
        "distill": cfg.distill.budget_s,
        "dflash": cfg.drafter.budget_s,
        "dcoco": cfg.corrector.joint_budget_s,
        "dcoco-frozen": cfg.corrector.frozen_budget_s,
    }


def fingerprint(settings: Any, upstream: str | None) -> str:
    text = json.dumps([settings, upstream], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        raw = json.loads((folder / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return raw if isinstance(raw, dict) else None


def run_pipeline(
    cfg: PipelineConfig, work: Path, dest: Path, rerun: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Runs the stages that are not up to date, then exports to `dest`; returns the manifest.

    `rerun` names stages to run again even if they are up to date (and so all after them).
    """
    torch.set_num_threads(cfg.threads)
    limits = budgets(cfg)
    prints: dict[str, str] = {}
    done: dict[str, Any] = {}
    started = time.perf_counter()
    for name, build, settings, before in stages(cfg):
        prints[name] = fingerprint(settings(cfg), prints[before] if before else None)
        folder = work / name
        marker = read_marker(folder)
        if marker and marker.get("fingerprint") == prints[name] and name not in rerun:
            print(f"[{name}] up to date ({marker['seconds']:.0f} s when it ran)", flush=True)
            done[name] = marker
            continue
        rerun = rerun + tuple(n for n, *_, b in stages(cfg) if b == name)  # dependants rerun
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        print(f"[{name}] running, budget {limits[name]:.0f} s", flush=True)
        t0 = time.perf_counter()
        facts = build(cfg, work, folder)
        done[name] = {
            "fingerprint": prints[name],
            "seconds": round(time.perf_counter() - t0, 1),
            "budget_s": limits[name],
            "facts": facts,
        }
        (folder / MARKER).write_text(json.dumps(done[name], indent=2) + "\n")
        print(f"[{name}] done in {done[name]['seconds']:.0f} s: {facts}", flush=True)
    manifest = {
        "config": cfg.to_dict(),
        "stages": done,
        "this_run_seconds": round(time.perf_counter() - started, 1),
    }
    export(cfg, work, dest, manifest)
    print(f"[export] wrote {dest}", flush=True)
    return manifest
