"""The long run's data: the target's greedy answers, generated as training goes, in shards.

A `Distiller` keeps one engine batch full of prompts from the run's stream and hands back each
finished answer with the target's features. Answers are written in shards of a fixed size;
a shard is a `Continuations` file, read back memory-mapped. The data position (`Position`) is
plain numbers and prompt indices, so that it can be checkpointed and committed.
"""

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import END_OF_TEXT, Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.distill_stage import Answer, pack
from dcoco.train.run_config import RunConfig
from dcoco.train.run_prompts import RunPrompt


@dataclass
class Position:
    """Where the run is in its prompt stream, and what it generated so far."""

    next_prompt: int = 0  # prompts before this index were handed to the engine
    redo: list[int] = field(default_factory=list)  # handed out, but in no written shard
    shards: int = 0  # shard files written, across all legs
    answers: int = 0
    answer_tokens: int = 0  # generated tokens in written shards: the label tokens
    corrector_tokens: int = 0  # of those, in shards kept for the correctors
    skipped: int = 0  # prompts longer than max_prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def for_corrector(shard: int, cfg: RunConfig) -> bool:
    return shard % cfg.corrector_every == cfg.corrector_every - 1


class Distiller:
    """Greedy answers from a continuously refilled engine batch."""

    def __init__(
        self,
        target: CausalLM,
        tokenizer: Tokenizer,
        prompts: list[RunPrompt],
        position: Position,
        cfg: RunConfig,
        feature_layers: tuple[int, ...],
    ) -> None:
        self.tokenizer, self.prompts, self.position, self.cfg = tokenizer, prompts, position, cfg
        self.feature_layers = feature_layers  # the drafter's target layers
        self.engine = Engine(
            target,
            None,
            EngineConfig(
                mode=Mode.VANILLA,
                max_batch_size=cfg.batch_size,
                max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
                eos_token_ids=tokenizer.eos_token_ids,
                precision=Precision(cfg.precision),
                feature_layers=feature_layers,
            ),
        )
        self.params = SamplingParams(max_tokens=cfg.max_new_tokens)
        self.queue = list(position.redo)  # first the prompts an earlier leg left unfinished
        self.running: dict[int, tuple[list[int], list[int], list[torch.Tensor]]] = {}
        self.finished: list[tuple[int, Answer]] = []

    @property
    def exhausted(self) -> bool:
        return not self.queue and self.position.next_prompt >= len(self.prompts)

    def step(self) -> None:
        """Tops the batch up, then runs one engine step."""
        self._fill()
        if not self.running:
            return
        for out in self.engine.step().outputs:
            index = int(out.request_id)
            prompt, tokens, features = self.running[index]
            tokens.extend(out.new_token_ids)
            if out.features is not None:
                features.append(out.features)  # [t, F]
            if out.finished:
                del self.running[index]
                if len(tokens) >= 2:  # a block needs at least one label
                    self.finished.append((index, Answer(prompt, tokens, torch.cat(features))))

    def take_shard(self) -> Continuations | None:
        """The next shard's answers, once enough have finished."""
        if len(self.finished) < self.cfg.shard_sequences:
            return None
        taken, self.finished = (
            self.finished[: self.cfg.shard_sequences],
            self.finished[self.cfg.shard_sequences :],
        )
        width = self.cfg.max_prompt_tokens + self.cfg.max_new_tokens
        pad = self.tokenizer.token_id(END_OF_TEXT)
        return pack([a for _, a in taken], width, pad, self.feature_layers)

    def outstanding(self) -> list[int]:
        """Prompts handed out that no written shard holds: the next leg's `redo`."""
        return sorted([*self.queue, *self.running, *(i for i, _ in self.finished)])

    def _fill(self) -> None:
        while len(self.running) < self.cfg.batch_size and not self.exhausted:
            if self.queue:
                index = self.queue.pop(0)
            else:
                index = self.position.next_prompt
                self.position.next_prompt += 1
            text = self.tokenizer.render_chat(list(self.prompts[index].messages))
            ids = self.tokenizer.encode(text)
            if len(ids) > self.cfg.max_prompt_tokens:
                self.position.skipped += 1
                continue
            self.engine.add_request(str(index), ids, self.params)
            self.running[index] = (ids, [], [])


def answer_tokens(shard: Continuations) -> int:
    return int((shard.lengths - shard.prompt_lens).sum())


def shard_file(work: Path, index: int) -> Path:
    return work / "shards" / f"{index:06d}.pt"


def write_shard(work: Path, index: int, shard: Continuations) -> Path:
    """Atomically: a shard file exists whole or not at all."""
    path = shard_file(work, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    shard.save(partial)
    partial.replace(path)
    return path


def concat(shards: list[Continuations], pad: int) -> Continuations:
    """Several shards with features as one table (features stacked, offsets shifted)."""
    width = max(s.tokens.shape[1] for s in shards)
    tokens = torch.cat(
        [F.pad(s.tokens, (0, width - s.tokens.shape[1]), value=pad) for s in shards]
    )  # [S, T]
    offsets, features, total = [], [], 0
    for s in shards:
        if s.features is None or s.offsets is None:
            raise ValueError("only shards with features can be concatenated")
        offsets.append(s.offsets + total)  # [S_i]
        features.append(s.features)  # [P_i, F]
        total += s.features.shape[0]
    return Continuations(
        tokens,
        torch.cat([s.prompt_lens for s in shards]),  # [S]
        torch.cat([s.lengths for s in shards]),  # [S]
        torch.cat(features),  # [P, F]
        torch.cat(offsets),  # [S]
        shards[0].feature_layers,
    )
