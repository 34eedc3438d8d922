"""The choices that name how a cycle drafts and picks its draft."""

from enum import StrEnum


class Mode(StrEnum):
    VANILLA = "vanilla"  # target only, one token per step
    DFLASH = "dflash"  # the drafter's top-1 at every slot
    DCOCO = "dcoco"  # top-K per slot, corrector scores, a selection rule picks the draft


class Rule(StrEnum):
    PREFIX = "prefix"  # prefix-first walk: the paper's default
    GLOBAL = "global"  # Viterbi over the summed transition scores (ablation)
    DISCOUNTED = "discounted"  # Viterbi with slot p weighted by gamma**p (ablation)


class Precision(StrEnum):
    """Weights, activations and KV caches of an engine."""

    FP32 = "fp32"  # the exact mode: greedy speculation reproduces plain greedy decoding
    BF16 = "bf16"  # the fast mode; kernel shapes change rounding, so outputs may differ
