"""What each of the long run's data sources costs here: label tokens a second, wall and CPU.

Each source runs from the start of the run's prompt stream for a fixed wall time after its
first step, nothing written: teacher forcing without and with the argmax (text labels need only
the layers), and self-distillation at the run's batch (its tokens counted as they are generated,
finished or not).
"""

import platform
import resource
import time
from dataclasses import replace
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, load_target
from dcoco.paths import REPO_ROOT
from dcoco.shared.cpu import cpu_flags
from dcoco.tokenizer import Tokenizer
from dcoco.train.data import Labels
from dcoco.train.run_config import RunConfig
from dcoco.train.run_data import Distiller, Position
from dcoco.train.run_prompts import stream_of
from dcoco.train.run_teacher import Prefiller


def cpu_seconds() -> float:
    """CPU time of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure_sources(cfg: RunConfig, seconds: float) -> dict[str, Any]:
    torch.set_num_threads(cfg.threads)
    models = REPO_ROOT / cfg.models_path
    tokenizer = Tokenizer.from_dir(REPO_ROOT / cfg.target_path)
    layers = load_drafter(models / "dflash").config.target_layer_ids
    prompts = stream_of(cfg)
    found: dict[str, Any] = {
        "threads": cfg.threads,
        "seconds": seconds,
        "machine": platform.processor() or platform.machine(),
        "cpu_flags": cpu_flags(),
    }
    for name, argmax in (("teacher-text", False), ("teacher-argmax", True)):
        labels = Labels.ARGMAX if argmax else Labels.TEXT
        prefiller = Prefiller(
            load_target(REPO_ROOT / cfg.target_path),
            tokenizer,
            prompts,
            0,
            replace(cfg, teacher_labels=labels),
            layers,
            argmax,
        )
        found[name] = _run(prefiller, seconds)
    distiller = Distiller(
        load_target(REPO_ROOT / cfg.target_path), tokenizer, prompts, Position(), cfg, layers
    )
    found["distilled"] = _run(distiller, seconds)
    return found


def _run(source: Prefiller | Distiller, seconds: float) -> dict[str, float]:
    """The source's rate after its first step: that one fills the engine's empty batch (a
    prefill of batch_size prompts at once, minutes on one core), which a long run pays once;
    the refills of finished answers are counted."""
    source.step()
    wall, cpu, before = time.perf_counter(), cpu_seconds(), source.made
    while time.perf_counter() - wall < seconds:
        source.step()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    count = source.made - before
    return {
        "label_tokens": count,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "label_tokens_per_s": round(count / wall, 1),
        "label_tokens_per_cpu_s": round(count / cpu, 1),
    }
