"""The parts of `make bench-core` on a small random target: what they measure, not how fast."""

import copy

from dcoco.bench.core_parts import gaps, plain_rate, weight_bytes
from dcoco.shared.options import Precision
from factories import make_target


def test_weight_bytes_count_what_decoding_reads() -> None:
    target = make_target(hidden=64, vocab=64)
    sizes = {
        p: weight_bytes(copy.deepcopy(target), p) for p in Precision if p is not Precision.AUTO
    }
    assert sizes[Precision.FP32] == 2 * sizes[Precision.BF16]
    # Quantized: the dense bf16 copies for wide forwards are not read when decoding.
    assert sizes[Precision.INT4] < sizes[Precision.INT8] < sizes[Precision.BF16]


def test_plain_rate_and_the_gaps_of_a_joining_prompt() -> None:
    target = make_target(hidden=64, vocab=64)
    assert plain_rate(copy.deepcopy(target), Precision.FP32, [[1, 2, 3]] * 2, 8) > 0
    median, largest = gaps(copy.deepcopy(target), Precision.FP32, [1, 2, 3], [5] * 200, 32)
    assert 0 < median <= largest
