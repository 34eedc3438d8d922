"""Which source makes each of the long run's shards, and the two sources behind one face.

Shard s is teacher-forced while s < `teacher_shards`, self-distilled after: a fixed rule of
the shard index, so that a resumed run makes the same kinds of shards. Each source is built
the first time a shard needs it (the engine's KV cache for a batch of 128 is gigabytes).
"""

from enum import StrEnum
from pathlib import Path

from dcoco.checkpoint import load_target
from dcoco.model.causal_lm import CausalLM
from dcoco.tokenizer import Tokenizer
from dcoco.train.data import Continuations, Labels
from dcoco.train.run_config import RunConfig
from dcoco.train.run_data import Distiller, Position
from dcoco.train.run_prompts import RunPrompt
from dcoco.train.run_teacher import Prefiller


class Source(StrEnum):
    TEACHER = "teacher"
    DISTILLED = "distilled"


def source_of(shard: int, cfg: RunConfig) -> Source:
    return Source.TEACHER if shard < cfg.teacher_shards else Source.DISTILLED


class Sources:
    """Steps the source of the next shard (`position.shards`) and hands over its shards."""

    def __init__(
        self,
        target_path: Path,
        tokenizer: Tokenizer,
        prompts: list[RunPrompt],
        position: Position,
        cfg: RunConfig,
        feature_layers: tuple[int, ...],
    ) -> None:
        self.target_path, self.tokenizer, self.prompts = target_path, tokenizer, prompts
        self.position, self.cfg, self.feature_layers = position, cfg, feature_layers
        self._target: CausalLM | None = None  # one copy in the inference precision, shared
        self._prefiller: Prefiller | None = None
        self._distiller: Distiller | None = None

    @property
    def current(self) -> Source:
        return source_of(self.position.shards, self.cfg)

    @property
    def exhausted(self) -> bool:
        if self.current is Source.TEACHER:
            return self.prefiller.exhausted
        return self.distiller.exhausted

    def step(self) -> None:
        if self.current is Source.TEACHER:
            self.prefiller.step()
        else:
            self.distiller.step()

    def take_shard(self) -> Continuations | None:
        """The next shard once it is complete; the cursor of its source moves past it."""
        if self.current is Source.DISTILLED:
            return self.distiller.take_shard()
        taken = self.prefiller.take_shard()
        if taken is None:
            return None
        shard, skipped = taken
        self.position.next_text = self.prefiller.cursor
        self.position.skipped += skipped
        return shard

    def outstanding(self) -> list[int]:
        """The prompts to generate again after a stop (`Position.redo`)."""
        return self.position.redo if self._distiller is None else self._distiller.outstanding()

    @property
    def prefiller(self) -> Prefiller:
        if self._prefiller is None:
            argmax = self.cfg.teacher_labels is not Labels.TEXT
            self._prefiller = Prefiller(
                self.target,
                self.tokenizer,
                self.prompts,
                self.position.next_text,
                self.cfg,
                self.feature_layers,
                argmax,
            )
        return self._prefiller

    @property
    def distiller(self) -> Distiller:
        if self._distiller is None:
            self._distiller = Distiller(
                self.target,
                self.tokenizer,
                self.prompts,
                self.position,
                self.cfg,
                self.feature_layers,
            )
        return self._distiller

    @property
    def target(self) -> CausalLM:
        if self._target is None:
            self._target = load_target(self.target_path)
        return self._target
