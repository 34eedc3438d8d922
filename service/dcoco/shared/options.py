"""The choices that name how a cycle drafts and picks its draft."""

from enum import StrEnum


class Mode(StrEnum):
    """Ordered by what an engine needs: each mode's engine also runs the modes before it."""

    VANILLA = "vanilla"  # target only, one token per step
    NGRAM = "ngram"  # prompt lookup: the sequence's own earlier tokens (no drafter, no training)
    DFLASH = "dflash"  # the drafter's top-1 at every slot
    DCOCO = "dcoco"  # top-K per slot, corrector scores, a selection rule picks the draft

    @property
    def speculation(self) -> str:
        """The name requests and metrics use: off, ngram, dflash or dcoco."""
        return "off" if self is Mode.VANILLA else self.value

    @property
    def needs_drafter(self) -> bool:
        return self in (Mode.DFLASH, Mode.DCOCO)

    def runnable(self) -> tuple["Mode", ...]:
        """What an engine in this mode runs per request: itself and every mode before it (a
        DCOCO engine all four)."""
        modes = tuple(Mode)
        return modes[: modes.index(self) + 1]

    @classmethod
    def of_speculation(cls, name: str) -> "Mode":
        return cls.VANILLA if name == "off" else cls(name)


class Rule(StrEnum):
    PREFIX = "prefix"  # prefix-first walk: the paper's default
    GLOBAL = "global"  # Viterbi over the summed transition scores (ablation)
    DISCOUNTED = "discounted"  # Viterbi with slot p weighted by gamma**p (ablation)


class Precision(StrEnum):
    """Weights, activations and KV caches of an engine.

    Only fp32 is exact: in the others, kernel shapes change rounding, so greedy speculation can
    differ from plain greedy decoding where two tokens' logits nearly tie.
    """

    AUTO = "auto"  # the fastest of the others on this CPU, measured at start
    FP32 = "fp32"  # the exact mode: greedy speculation reproduces plain greedy decoding
    BF16 = "bf16"  # bf16 weights, activations and caches
    INT8 = "int8"  # int8 weights (a scale per output channel); bf16 activations and caches
    INT4 = "int4"  # 4-bit weights in groups of 32 (the shipped Q4_1 grid), int8 LM head; bf16
    # int4's weights times activations quantized to 8 bits per group of 32 in each linear
    # (llama.cpp's Q4_1 arithmetic); bf16 between them. Needs AVX2 and a C++ compiler.
    W4A8 = "w4a8"


# What `dcoco worker`, `serve`, `generate`, `eval` and `bench --embedded` run with unless told.
DEFAULT_PRECISION = Precision.AUTO
PRECISION_HELP = (
    "auto (default): the fastest of the others on this CPU, measured at start and cached; "
    "fp32: exact (greedy speculation equals plain greedy decoding); bf16; int8 and int4: "
    "weight-only quantized, bf16 activations; w4a8: int4's weights times activations "
    "quantized to 8 bits in each linear (llama.cpp's Q4_1 arithmetic; AVX2)"
)
