"""Settings of the long training run (`dcoco train-run`), with the reason for each default.

A run continues the shipped drafters for far longer than one session: each invocation (a leg)
makes fresh data (teacher-forced shards first, then self-distilled ones) and trains on it,
checkpointing as it goes, and ends by refitting both correctors and exporting all three
drafters. See `dcoco.train.run`.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

from dcoco.train.config import SMOLLM2, CorrectorTrainConfig, DrafterTrainConfig
from dcoco.train.data import Labels

# Installed packages whose functions extend the code prompts beyond the standard library, each
# pinned in pyproject.toml, so that every machine that runs `make setup` reads the same files.
CODE_PACKAGES = ("torch", "mypy", "mypyc", "schemathesis", "selenium", "locust", "gguf")


@dataclass(frozen=True)
class StreamGrowth:
    """The prompt stream before it grew: the grown stream keeps that stream's first `at`
    prompts (those its legs answered), and interleaves every other prompt after them."""

    at: int
    math_problems: int
    code_packages: tuple[str, ...]


@dataclass(frozen=True)
class Resample:
    """Once a domain's prompts have all been answered greedily, the stream goes on with the
    same prompts again, `passes` times, each pass in a fresh order and answered by sampling
    at `temperature` (each request seeded by its stream index): the target's own answers
    still, new sequences for the drafter, and those sampled decoding verifies."""

    temperature: float = 1.0
    passes: int = 2


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    threads: int = 2  # the machine's cores
    target_path: str = "models/smollm2/target"
    models_path: str = "models/smollm2"  # where the drafters start from and are exported to
    # The prompt stream (`run_prompts.stream_of`): chat turns matter most for MT-Bench-like
    # use, code and math are where speculation pays; the split and seed are the corpus
    # stage's, so the shipped held-out files stay held out.
    weights: dict[str, float] = field(
        default_factory=lambda: {"prose": 0.5, "code": 0.25, "math": 0.25}
    )
    math_problems: int = 120_000  # 64k distinct after deduplication
    code_packages: tuple[str, ...] = CODE_PACKAGES  # after the standard library's functions
    # Legs 1-23 ran on a stream of 30,000 math draws and the standard library alone, which
    # ran out of code at prompt 44,749 and of math at 66,893 (docs/smollm2-model.md, leg 23);
    # it grew where leg 21 began.
    grown: StreamGrowth | None = StreamGrowth(at=70_352, math_problems=30_000, code_packages=())
    # The packaged ShareGPT file holds 17,671 conversations, 54,919 usable turns: prose ran
    # out first, at prompt 93,323 of the greedy stream. The stream is unchanged up to there.
    resample: Resample | None = Resample()
    max_chars: int = 2_400  # code requests, as the corpus stage builds them
    test_percent: float = 3.0  # the corpus stage's held-out share: the same split
    # Generation: the target's own greedy answers in the precision it serves in, with its
    # features at the drafter's layers. At batch 128 a bf16 decode step is compute-bound and
    # produces labels at 40% of a teacher-forced prefill's rate (docs/smollm2-model.md).
    batch_size: int = 128
    max_prompt_tokens: int = 512  # chat histories run long; longer ones are skipped
    max_new_tokens: int = 256  # also where a teacher-forced answer is cut
    precision: str = "bf16"
    # Teacher forcing (`run_teacher`): the target's prefill over each prompt and the text's own
    # answer. The first `teacher_shards` shards are teacher-forced, the rest self-distilled.
    # Teacher forcing makes 2.5 times the label tokens a second, but a 2-hour leg of it (1.24M
    # argmax-labelled tokens, continuing the shipped drafter) made the drafter worse: its
    # teacher-forced accepted length fell from 1.60 to 1.42 (docs/smollm2-model.md). The run
    # self-distils throughout.
    teacher_shards: int = 0
    # The target's argmax after the text's prefix: at slot 1 exactly the label the verifier
    # checks, where the text's own tokens are not.
    teacher_labels: Labels = Labels.ARGMAX
    prefill_tokens: int = 4_096  # padded tokens per prefill pass
    shard_sequences: int = 256  # answers per shard file (about 0.2-0.4 GB with features)
    corrector_every: int = 4  # every 4th shard is kept from DFlash for the correctors
    window_shards: int = 8  # DFlash steps sample from the newest 8 DFlash shards
    # One DFlash step per this many label tokens in DFlash shards: a step draws 8 x 24 anchors,
    # so each label token is an anchor about 0.3 times.
    label_tokens_per_step: int = 600
    # The exported DFlash weights average the last ~200 steps: a leg on a shared machine makes
    # several hundred, and a longer average would still hold much of the leg's starting point.
    ema: float = 0.995
    checkpoint_every_s: float = 300.0
    corrector_share: float = 0.2  # of a leg's time, at its end: joint 60%, frozen 40% of it
    drafter: DrafterTrainConfig = field(
        default_factory=lambda: DrafterTrainConfig(
            num_layers=SMOLLM2.drafter.num_layers,
            target_layer_ids=SMOLLM2.drafter.target_layer_ids,
            block_size=SMOLLM2.drafter.block_size,
            batch_size=8,
            anchors=24,
            lr=5e-4,  # continues a trained drafter: half the first run's peak
            warmup_steps=100,  # also after a cross-session resume, whose moments restart
            train_vocab=SMOLLM2.drafter.train_vocab,
        )
    )
    corrector: CorrectorTrainConfig = field(default_factory=lambda: SMOLLM2.corrector)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed: everything but time and threads."""
        raw = self.to_dict()
        for name in ("threads", "checkpoint_every_s", "corrector_share"):
            raw.pop(name)
        raw["corrector"] = {k: v for k, v in raw["corrector"].items() if "budget" not in k}
        raw["drafter"] = {k: v for k, v in raw["drafter"].items() if "budget" not in k}
        return raw


SMOLLM2_RUN = RunConfig()
