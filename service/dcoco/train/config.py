"""Hyperparameters of every stage, with the reason for each default beside it.

`TINY` is what `make train-tiny` runs and what shipped in `models/tiny`; `SMOLLM2`
is what `make train-smollm2` runs for the pretrained SmolLM2-135M-Instruct target and shipped in
`models/smollm2`; `SMOKE` is the tiny pipeline shrunk to seconds, for tests.

Each stage's budget is wall-clock seconds: a training stage anneals its learning rate against
max(steps done / max_steps, time used / budget), so it finishes on time on a slow or busy
machine and stops early on a fast one.
"""

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class CorpusConfig:
    test_percent: float = 5.0  # held-out share of each domain; ~250 code functions for eval
    math_problems: int = 30_000  # ~2.5M tokens; the templates saturate well before that
    max_files: int = 100_000  # every stdlib file (~560); small runs take the first few
    max_chars: int = 2_400  # a longer function no longer fits the 512-token window
    # > 0: the prose domain is this many ShareGPT first turns (prompts only: a pretrained
    # target answers them) instead of standard-library docstrings.
    chat_prompts: int = 0
    budget_s: float = 180.0


@dataclass(frozen=True)
class TokenizerConfig:
    vocab_size: int = 4096  # small vocabulary: the lm_head and top-K stay cheap on CPU
    sample_records: int = 40_000  # enough text for stable merges; more only costs time
    budget_s: float = 120.0


@dataclass(frozen=True)
class TargetConfig:
    hidden_size: int = 256  # ~4M parameters: trains to plausible text in ~20 CPU minutes
    num_layers: int = 4
    num_heads: int = 4  # head_dim 64, as in Qwen3
    num_kv_heads: int = 2  # grouped-query attention, as in Qwen3
    intermediate_size: int = 768  # 3x hidden
    rope_theta: float = 10_000.0  # short contexts; Qwen3's 1e6 targets 32k+ tokens
    max_position_embeddings: int = 1024  # eval prompts plus generations stay below this
    seq_len: int = 512  # training window; code functions and their requests fit
    batch_size: int = 16  # 8k tokens per step
    lr: float = 3e-3  # high, as usual for models this small; cosine to 10%
    warmup_steps: int = 100
    weight_decay: float = 0.1
    max_steps: int = 20_000  # far beyond the budget: time decides
    compile: bool = True  # about 1.6x faster after ~40 s of compilation
    budget_s: float = 1320.0


@dataclass(frozen=True)
class DistillConfig:
    max_prompts: int = 24_000  # more than fit the budget; unfinished ones are dropped
    max_prompt_tokens: int = 160  # longer requests are skipped
    max_new_tokens: int = 128  # what evaluation generates too
    batch_size: int = 256  # below ~256 the engine is overhead-bound on CPU
    corrector_share: float = 0.25  # kept away from the drafter for the corrector stages
    precision: str = "fp32"  # what inference runs; bf16 for a target whose step it speeds up
    # Keep the target's features (at the drafter's target_layer_ids) computed while generating,
    # so that the drafter stages need no target pass: worth it when the target is large.
    keep_features: bool = False
    budget_s: float = 360.0


@dataclass(frozen=True)
class DrafterTrainConfig:
    num_layers: int = 2  # one pass of 2 layers costs about one target decode step
    target_layer_ids: tuple[int, ...] = (1, 3)  # a middle and the last target layer
    block_size: int = 15  # B, as in the released DFlash and DCOCO drafters
    batch_size: int = 16  # sequences per step
    anchors: int = 16  # blocks per sequence per step
    lr: float = 2e-3  # ~1.7M parameters and ~1k steps: a fast rate, clipped at norm 1
    warmup_steps: int = 50
    depth_decay: float = 7.0  # slot p weighs exp(-p / 7): deep slots rarely get verified
    # > 0: the drafting vocabulary, this many most frequent answer tokens: the training softmax
    # ranges over them and the exported drafters draft over them (the lm_head dominates a
    # drafter's cost for large vocabularies); 0: the whole vocabulary.
    train_vocab: int = 0
    max_steps: int = 100_000  # time decides
    budget_s: float = 720.0


@dataclass(frozen=True)
class CorrectorTrainConfig:
    top_k: int = 16  # K, the paper's top-16
    rep_dim: int = 64
    pair_dim: int = 64
    mlp_dim: int = 16  # Delta runs (B-1)K^2 times per cycle: keep it narrow
    drafter_lr: float = 3e-4  # joint mode continues the DFlash checkpoint gently
    corrector_lr: float = 1e-3
    warmup_steps: int = 50
    correction_decay: float = 0.8  # pair p weighs 0.8**p: only an accepted prefix pays
    correction_weight: float = 1.0  # against the block cross-entropy, in joint mode
    batch_size: int = 16
    anchors: int = 16
    max_steps: int = 100_000
    joint_budget_s: float = 480.0
    frozen_budget_s: float = 300.0


@dataclass(frozen=True)
class PipelineConfig:
    seed: int = 0
    threads: int = 2  # the machine's cores
    # A pretrained target folder, relative to the repository: no tokenizer or target stage,
    # and only drafters are exported. None trains the target from scratch.
    target_path: str | None = None
    mask_token: str = "<|mask|>"  # the reserved special token the drafter's slots start from
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    drafter: DrafterTrainConfig = field(default_factory=DrafterTrainConfig)
    corrector: CorrectorTrainConfig = field(default_factory=CorrectorTrainConfig)
    heldout_prompts: int = 64  # per domain, exported beside the models for `dcoco eval`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TINY = PipelineConfig()

# Smoke runs end on their step counts, never on time, so they are reproducible on a busy
# machine; each stage takes a few seconds.
SMOKE_BUDGET_S = 600.0
SMOKE = PipelineConfig(
    corpus=CorpusConfig(math_problems=300, max_files=6, test_percent=10.0, budget_s=SMOKE_BUDGET_S),
    tokenizer=TokenizerConfig(vocab_size=384, sample_records=2_000, budget_s=SMOKE_BUDGET_S),
    target=TargetConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        max_position_embeddings=256,
        seq_len=64,
        batch_size=8,
        warmup_steps=2,
        max_steps=30,
        compile=False,
        budget_s=SMOKE_BUDGET_S,
    ),
    distill=DistillConfig(
        max_prompts=48,
        max_prompt_tokens=96,
        max_new_tokens=24,
        batch_size=16,
        budget_s=SMOKE_BUDGET_S,
    ),
    drafter=DrafterTrainConfig(
        num_layers=1,
        target_layer_ids=(0, 1),
        block_size=4,
        batch_size=8,
        anchors=4,
        warmup_steps=2,
        max_steps=20,
        budget_s=SMOKE_BUDGET_S,
    ),
    corrector=CorrectorTrainConfig(
        top_k=4,
        rep_dim=8,
        pair_dim=8,
        mlp_dim=4,
        batch_size=8,
        anchors=4,
        warmup_steps=2,
        max_steps=10,
        joint_budget_s=SMOKE_BUDGET_S,
        frozen_budget_s=SMOKE_BUDGET_S,
    ),
    heldout_prompts=8,
)

# SmolLM2-135M-Instruct (30 layers, hidden 576, vocabulary 49,152), about 2 hours on 2 cores.
# Its step is bound by reading 135M weights, so the drafter can afford 2 layers; a verify pass
# costs about a step in bf16, so the data is generated, and the drafter trained, in bf16.
SMOLLM2 = PipelineConfig(
    target_path="models/smollm2/target",
    mask_token="<empty_output>",  # a notebook marker a chat model never writes
    corpus=CorpusConfig(
        math_problems=6_000,  # templated: a few thousand teach the drafter the pattern
        chat_prompts=9_000,  # every usable first turn of the packaged ShareGPT file
        test_percent=3.0,
        budget_s=300.0,
    ),
    distill=DistillConfig(
        max_prompts=12_000,
        max_prompt_tokens=256,
        max_new_tokens=256,  # answers of a chat model run longer than the 4M target's
        batch_size=64,
        corrector_share=0.25,
        precision="bf16",
        keep_features=True,
        budget_s=2_700.0,
    ),
    drafter=DrafterTrainConfig(
        num_layers=2,
        target_layer_ids=(1, 15, 28),  # shallow, middle and deep, as DFlash spreads them
        block_size=15,
        batch_size=8,
        anchors=24,
        lr=1e-3,
        warmup_steps=30,
        train_vocab=8_192,  # a sixth of the vocabulary; the answers' most frequent tokens
        budget_s=2_400.0,
    ),
    corrector=CorrectorTrainConfig(
        rep_dim=64,
        pair_dim=64,
        mlp_dim=32,
        batch_size=8,
        anchors=24,
        warmup_steps=20,
        joint_budget_s=1_200.0,
        frozen_budget_s=600.0,
    ),
    heldout_prompts=64,
)

PRESETS = {"tiny": TINY, "smollm2": SMOLLM2, "smoke": SMOKE}
