"""Engine configuration: which drafting mode, and the shapes every cycle uses."""

from dataclasses import dataclass, field
from pathlib import Path

from dcoco.shared.options import Mode, Precision, Rule

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "dcoco"


@dataclass(frozen=True)
class EngineConfig:
    mode: Mode = Mode.DCOCO
    rule: Rule = Rule.PREFIX  # the paper's default; global and discounted are ablations
    gamma: float = 0.5  # the discounted rule's weight decay per slot
    num_speculative_tokens: int | None = None  # B; None takes the drafter's trained block size
    top_k: int | None = None  # K; None takes the corrector's trained K
    max_batch_size: int = 32  # sequences sharing one cycle; also the KV-cache slot count
    # At most this many prompt tokens one step may prefill while other sequences are decoding,
    # shared among the prompts being prefilled: a long prompt joins over several steps instead
    # of stalling every stream for its whole prefill. With nothing decoding, prompts are
    # prefilled whole. Within the cap, each step's chunk is steered to take about
    # `prefill_cycles` decoding cycles (engine/prefill.py); 0 takes the cap every step.
    prefill_tokens: int = 256
    prefill_cycles: float = 2.0
    # Where the prompts' chunk runs when the streams take a plain step: in their forward
    # (True, `ModelRunner.decode_with_chunks`), in its own (False), or whichever adds less to
    # their step, measured (None, `prefill.ChunkPlacement`). Forced ways are comparisons
    # (`make bench-core`).
    prefill_alongside: bool | None = None
    max_model_len: int | None = None  # prompt plus generated tokens; None: the target's limit
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)  # end a sequence on these
    seed: int = 0  # for sampled requests that bring no seed of their own
    precision: Precision = Precision.FP32  # fp32 is exact; the others are faster somewhere
    cache_dir: Path = DEFAULT_CACHE_DIR  # where `auto` precision keeps its measured costs
    # Vanilla mode only: target layers whose outputs every step hands back with its tokens,
    # the features a drafter learns from (training data); empty when serving.
    feature_layers: tuple[int, ...] = ()
    # Verify, each cycle, the prefix of the draft that maximises expected tokens per second
    # (see dcoco.spec.planner); False verifies all B drafted tokens, for fixed-B comparisons.
    adaptive: bool = False
    # Adaptive engines: let the planner verify a row's prompt-lookup draft (`spec/ngram.py`)
    # instead of the drafter's where it expects more tokens a second from it.
    lookup: bool = False
    # Run the target's decoder layers compiled by inductor once they are compiled, on a
    # background thread; eager until then (engine/compiled.py). Never in fp32, the exact mode.
    compile: bool = False
    # Eager engines with fp32 caches: each decoding row's plain step reads its own
    # context, not every row's up to the longest (`model/flex.py`). For many rows of mixed
    # lengths (the long run's distiller); measured on one CPU only, so off by default.
    own_rows: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        if self.prefill_tokens < 1:
            raise ValueError("prefill_tokens must be at least 1")
        if self.prefill_cycles < 0:
            raise ValueError("prefill_cycles must not be negative")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be at least 1")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError("top_k must be at least 1")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError("gamma must be in (0, 1]")
        if self.feature_layers and self.mode is not Mode.VANILLA:
            raise ValueError("feature_layers is for vanilla mode (a drafter reads its own)")
