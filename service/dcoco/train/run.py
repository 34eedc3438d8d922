"""`dcoco train-run`: one leg of the long run that continues the shipped SmolLM2 drafters.

A leg, for its wall-clock budget:
1. alternates making data and DFlash training: the target prefills the run's next prompts with
   their texts' answers (`run_teacher`), or, past `teacher_shards`, the engine answers them
   (`run_data.Distiller`); every full shard unlocks a DFlash step per `label_tokens_per_step`
   of its label tokens, each on a batch from one of the newest `window_shards` DFlash shards;
   every `corrector_every`-th shard is kept for the correctors instead;
2. checkpoints every `checkpoint_every_s` (`run_state`), so that a stopped leg resumes; a
   SIGTERM or SIGINT ends the leg after the batch or step at hand with a checkpoint, without
   the corrector refit or an export (the same command resumes it);
3. spends its last `corrector_share` refitting both correctors on the kept shards
   (`run_correctors`; joint: the averaged DFlash weights with the previous joint corrector,
   trained on together; frozen: the previous frozen corrector on the averaged DFlash weights),
   then exports the three drafters and the run summary beside them, ready to commit.
"""

import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, load_target, save_drafter
from dcoco.model.causal_lm import CausalLM
from dcoco.paths import REPO_ROOT
from dcoco.shared.errors import UsageError
from dcoco.spec.drafter import DFlashDrafter
from dcoco.tokenizer import Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.drafter_stage import Phase, phase_step
from dcoco.train.loop import EMA, MIN_LR_FRACTION
from dcoco.train.run_adopt import adopt
from dcoco.train.run_config import RunConfig
from dcoco.train.run_correctors import (
    CORRECTOR_SHARDS,
    drafting_vocab,
    refit_correctors,
    shipped,
)
from dcoco.train.run_data import (
    Position,
    answer_tokens,
    for_corrector,
    shard_file,
    write_shard,
)
from dcoco.train.run_prompts import digest, exhausted_domains, stream_of
from dcoco.train.run_sources import Source, Sources
from dcoco.train.run_state import fingerprint, load_state, read_summary, save_state, write_summary


def schedule(progress: float, since_resume: int, cfg: RunConfig) -> float:
    """The learning-rate factor: warm-up after every (re)start, then cosine over the leg's
    DFlash part (`progress` from 0 to 1): every leg warm-restarts and ends decayed, so the
    weights it exports have settled (weights taken mid-schedule, at the peak rate, accepted
    less than the drafter they started from in the source A/B, docs/ablations.md)."""
    warm = min(1.0, (since_resume + 1) / cfg.drafter.warmup_steps)
    progress = min(1.0, max(0.0, progress))
    return warm * (
        MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))
    )


class DFlashTrainer:
    """The DFlash phase's optimizer, step and weight average, with what a checkpoint holds."""

    def __init__(self, drafter: DFlashDrafter, target: CausalLM, cfg: RunConfig, step: int) -> None:
        vocab = drafting_vocab(drafter)
        self.step_fn, self.optimizer = phase_step(
            Phase.DFLASH, drafter, target, vocab, cfg.drafter, cfg.corrector, cfg.seed + step
        )
        self.drafter, self.cfg, self.step, self.resumed_at = drafter, cfg, step, step
        self.params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.average = [p.detach().clone() for p in self.params]
        self.peak = cfg.drafter.lr
        self.losses: dict[str, float] = {}

    def train(self, data: Continuations, progress: float) -> None:
        """One step at the rate `schedule` gives for `progress` through the schedule."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.peak * schedule(progress, self.step - self.resumed_at, self.cfg)
        self.optimizer.zero_grad(set_to_none=True)
        losses = self.step_fn(data)
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        torch._foreach_lerp_(self.average, [p.detach() for p in self.params], 1.0 - self.cfg.ema)
        self.step += 1
        for key, value in losses.items():  # plain moving averages for the log
            self.losses[key] = EMA * self.losses.get(key, float(value)) + (1 - EMA) * float(value)

    def averaged(self) -> DFlashDrafter:
        """A copy of the drafter holding the averaged weights, in eval mode."""
        copy = DFlashDrafter(self.drafter.config)
        copy.load_state_dict(self.drafter.state_dict())
        named = dict(copy.named_parameters())
        body = [n for n, _ in self.drafter.named_parameters() if _trained(n)]
        with torch.no_grad():
            for name, value in zip(body, self.average[:-1], strict=True):
                named[name].copy_(value)
        copy.mask_embedding = self.average[-1].detach().clone().view(-1)  # [H]
        return copy.eval()

    def state(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter.state_dict(),
            "mask": self.step_fn.mask.detach().clone(),
            "average": [a.clone() for a in self.average],
            "optimizer": self.optimizer.state_dict(),
            "generator": self.step_fn.generator.get_state(),
            "step": self.step,
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.drafter.load_state_dict(state["drafter"])
        with torch.no_grad():
            self.step_fn.mask.copy_(state["mask"])
            for mine, saved in zip(self.average, state["average"], strict=True):
                mine.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_fn.generator.set_state(state["generator"])
        self.step = self.resumed_at = int(state["step"])


def _trained(name: str) -> bool:
    """The parameters the DFlash phase trains, in `phase_optimizer`'s order."""
    return not name.startswith(("corrector.", "lm_head."))


def run_leg(
    cfg: RunConfig,
    work: Path,
    hours: float,
    shards: int | None = None,
    adopted: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """One leg of `hours`; returns the leg's record, also appended to `run.json`, or, when a
    signal stopped it (module docstring), the record so far with "stopped", run.json and the
    shipped drafters untouched. With `shards`, the DFlash part also ends once that many more
    shards are written (tests); `adopted` shards join the run first (`run_adopt`)."""
    torch.set_num_threads(cfg.threads)
    started, wall = datetime.now(UTC), time.perf_counter()
    deadline = wall + hours * 3600
    models = REPO_ROOT / cfg.models_path
    work.mkdir(parents=True, exist_ok=True)
    local, summary = load_state(work, cfg), read_summary(models, cfg)
    tokenizer = Tokenizer.from_dir(REPO_ROOT / cfg.target_path)
    target = load_target(REPO_ROOT / cfg.target_path)  # fp32: training's embedding and head
    drafter = load_drafter(models / Phase.DFLASH.value)
    carried = local or summary or {}
    position = Position(**carried.get("position", {}))
    trainer = DFlashTrainer(drafter, target, cfg, int(carried.get("step", 0)))
    if local is not None:
        trainer.restore(local["trainer"])
    legs: list[dict[str, Any]] = list(carried.get("legs", []))
    origin = "the local checkpoint" if local else "run.json" if summary else "the shipped drafters"
    print(
        f"[run] leg {len(legs) + 1}: step {trainer.step}, shard {position.shards}, prompt "
        f"{position.next_prompt}, from {origin}",
        flush=True,
    )
    prompts = stream_of(cfg)
    gone = exhausted_domains(prompts, position.next_prompt, cfg.weights)
    if gone:
        raise UsageError(
            f"the run's prompt stream has no {' or '.join(gone)} prompts left from prompt "
            f"{position.next_prompt:,} of {len(prompts):,}: a leg would answer the other "
            f"domains alone, against the weights {cfg.weights}, and the drafters would drift "
            "to them (docs/smollm2-model.md, leg 23); the stream needs more prompts first"
        )
    sources = Sources(
        REPO_ROOT / cfg.target_path,
        tokenizer,
        prompts,
        position,
        cfg,
        drafter.config.target_layer_ids,
    )
    record: dict[str, Any] = {
        "leg": len(legs) + 1,
        "started": started.isoformat(timespec="seconds"),
        "hours": hours,
        "from_step": trainer.step,
        "from_shard": position.shards,
        "from_tokens": position.label_tokens,
        "stream": {"prompts": len(prompts), "digest": digest(prompts)},
    }
    before = next((leg["stream"] for leg in reversed(legs) if "stream" in leg), None)
    if before is not None and before != record["stream"]:
        print(
            f"[run] warning: this machine's prompt stream ({record['stream']}) differs from the "
            f"last leg's ({before}): its positions name other prompts from here on",
            flush=True,
        )
    for path in adopted:
        layers = drafter.config.target_layer_ids
        answered = adopt(path, work, position, prompts, tokenizer, cfg, layers)
        record.setdefault("adopted", []).append({"file": str(path), "answers": answered})
        print(f"[run] adopted {path} as shard {position.shards - 1}", flush=True)

    def checkpoint() -> None:
        position.redo = sources.outstanding()
        save_state(
            work,
            {
                "fingerprint": fingerprint(cfg),
                "position": position.to_dict(),
                "step": trainer.step,
                "trainer": trainer.state(),
                "legs": legs,
            },
        )

    dflash_end = wall + hours * 3600 * (1 - cfg.corrector_share)
    last_save, training_s = time.perf_counter(), 0.0
    making = {source: [0.0, 0] for source in Source}  # seconds and label tokens, per source
    loaded: dict[int, Continuations] = {}
    last_shard = position.shards + shards if shards is not None else None
    with _stop_requests() as stopped:
        while time.perf_counter() < dflash_end and not stopped:
            window = _window(work, position.shards, cfg)
            trains = bool(window) and trainer.step < _unlocked_steps(position, cfg)
            if not trains and (position.shards == last_shard or sources.exhausted):
                break
            t0 = time.perf_counter()
            if trains:
                index = window[trainer.step % len(window)]
                if index not in loaded:
                    loaded = {i: d for i, d in loaded.items() if i in window}
                    loaded[index] = replace(
                        Continuations.load(shard_file(work, index)), labels=cfg.teacher_labels
                    )
                trainer.train(loaded[index], (t0 - wall) / (dflash_end - wall))
                training_s += time.perf_counter() - t0
            else:
                source = sources.current
                sources.step()
                shard = sources.take_shard()
                making[source][0] += time.perf_counter() - t0
                if shard is not None:
                    tokens = _written(work, shard, source, position, cfg)
                    making[source][1] += tokens
                    losses = ", ".join(f"{k} {v:.3f}" for k, v in trainer.losses.items())
                    print(
                        f"[run] shard {position.shards} ({source}): "
                        f"{position.label_tokens:,} label tokens; step {trainer.step} "
                        f"({losses}); {making[source][1] / max(making[source][0], 1e-9):.0f} "
                        f"{source} label tokens/s",
                        flush=True,
                    )
            if time.perf_counter() - last_save > cfg.checkpoint_every_s:
                checkpoint()
                last_save = time.perf_counter()
    checkpoint()
    if stopped:
        print(
            f"[run] stopped by {stopped[0].name}: checkpoint at step {trainer.step}, shard "
            f"{position.shards}; nothing exported; the same command resumes the leg",
            flush=True,
        )
        return record | {"stopped": stopped[0].name, "to_step": trainer.step}
    record |= {
        "to_step": trainer.step,
        "to_shard": position.shards,
        "to_tokens": position.label_tokens,
        "training_s": round(training_s),
        "sources": {
            str(source): {
                "seconds": round(seconds),
                "label_tokens": tokens,
                "label_tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
            }
            for source, (seconds, tokens) in making.items()
            if tokens
        },
        "dflash_steps_per_s": round(
            (trainer.step - record["from_step"]) / max(training_s, 1e-9), 3
        ),
        "dflash_losses": {k: round(v, 4) for k, v in trainer.losses.items()},
    }
    dflash = trainer.averaged()
    record |= refit_correctors(cfg, work, models, dflash, target, position, deadline)
    save_drafter(shipped(dflash), models / Phase.DFLASH.value)
    record["seconds"] = round(time.perf_counter() - wall)
    legs.append(record)
    checkpoint()
    write_summary(
        models,
        {
            "fingerprint": fingerprint(cfg),
            "config": cfg.to_dict(),
            "step": trainer.step,
            "position": position.to_dict(),
            "legs": legs,
        },
    )
    print(f"[run] leg {record['leg']} done: {record}", flush=True)
    return record


@contextmanager
def _stop_requests() -> Iterator[list[signal.Signals]]:
    """A list that SIGTERM and SIGINT append to while the block runs (in the main thread; a
    leg run from another thread stops only with its process)."""
    received: list[signal.Signals] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    handled = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in handled}
    for sig in handled:
        signal.signal(sig, lambda number, _frame: received.append(signal.Signals(number)))
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _unlocked_steps(position: Position, cfg: RunConfig) -> int:
    """DFlash steps the written DFlash shards pay for: one per label_tokens_per_step."""
    return (position.label_tokens - position.corrector_tokens) // cfg.label_tokens_per_step


def _written(
    work: Path, shard: Continuations, source: Source, position: Position, cfg: RunConfig
) -> int:
    """Writes the next shard, counts it in the position, drops shards no longer needed;
    returns its label tokens."""
    write_shard(work, position.shards, shard)
    tokens = answer_tokens(shard)
    position.answers += len(shard)
    position.label_tokens += tokens
    if source is Source.TEACHER:
        position.teacher_tokens += tokens
    if for_corrector(position.shards, cfg):
        position.corrector_tokens += tokens
    position.shards += 1
    _drop_old(work, position.shards, cfg)
    return tokens


def _window(work: Path, shards: int, cfg: RunConfig) -> list[int]:
    """The newest DFlash shards on this machine, at most window_shards."""
    found = [
        s
        for s in range(shards - 1, -1, -1)
        if not for_corrector(s, cfg) and shard_file(work, s).exists()
    ]
    return found[: cfg.window_shards]


def _drop_old(work: Path, shards: int, cfg: RunConfig) -> None:
    """Deletes DFlash shards past the window and kept shards past CORRECTOR_SHARDS."""
    dflash = [s for s in range(shards) if not for_corrector(s, cfg)]
    kept = [s for s in range(shards) if for_corrector(s, cfg)]
    for s in dflash[: -cfg.window_shards] + kept[:-CORRECTOR_SHARDS]:
        shard_file(work, s).unlink(missing_ok=True)
