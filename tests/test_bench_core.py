"""The parts of `make bench-core` on a small random target: what they measure, not how fast."""

import copy
import sys
from collections import Counter
from pathlib import Path

import pytest

from dcoco.bench.core_parts import decode, gaps, plain_rates, time_llama, weight_bytes
from dcoco.engine.outputs import StepResult
from dcoco.model import packed
from dcoco.shared.options import Precision
from factories import make_target


def test_weight_bytes_count_what_decoding_reads() -> None:
    target = make_target(hidden=64, vocab=64)
    sizes = {
        p: weight_bytes(copy.deepcopy(target), p) for p in Precision if p is not Precision.AUTO
    }
    if packed.supported() or packed.fbgemm_runs():  # bf16 values held in bf16 or fp16
        assert sizes[Precision.FP32] == 2 * sizes[Precision.BF16]
    else:  # in fp32 where bf16 is emulated without fbgemm; only the norms stay bf16
        assert sizes[Precision.BF16] < sizes[Precision.FP32] < 1.01 * sizes[Precision.BF16]
    # Quantized: the dense bf16 copies for wide forwards are not read when decoding.
    assert sizes[Precision.INT4] < sizes[Precision.INT8] < sizes[Precision.BF16]


def test_decode_counts_the_tokens_after_every_prompts_first(monkeypatch) -> None:
    from dcoco.engine.engine import Engine
    from dcoco.shared.engine_config import EngineConfig
    from dcoco.shared.options import Mode

    engine = Engine(make_target(hidden=64, vocab=64), None, EngineConfig(mode=Mode.VANILLA))
    steps: list[Counter[str]] = []  # tokens each request got, step by step
    step = engine.step

    def recorded() -> StepResult:
        result = step()
        steps.append(Counter())
        for out in result.outputs:
            steps[-1][out.request_id] += len(out.new_token_ids)
        return result

    monkeypatch.setattr(engine, "step", recorded)
    decoded, seconds = decode(engine, [[1, 2, 3], [4, 5]], 8)
    assert sum(sum(s.values()) for s in steps) == 18  # each prompt's first token and 8 more
    both = next(i for i, s in enumerate(steps) if len(s) == 2)  # the first step giving both
    assert decoded == sum(sum(s.values()) for s in steps[both + 1 :])
    assert 0 < decoded < 18
    assert seconds > 0
    assert not engine.has_unfinished()


def test_plain_rate_and_the_gaps_of_a_joining_prompt() -> None:
    target = make_target(hidden=64, vocab=64)
    rates = plain_rates(target, (Precision.FP32, Precision.INT4), [[1, 2, 3]] * 2, 8, passes=2)
    assert all(rate > 0 for rate in rates.values())
    for cycles, alongside in ((2.0, None), (2.0, True), (0.0, False)):
        seen = gaps(
            copy.deepcopy(target), Precision.FP32, [1, 2, 3], [5] * 200, 32, cycles, alongside
        )
        assert 0 < seen.median <= seen.quiet
        assert 0 < seen.median <= seen.joining <= seen.first


def test_speculation_rows_come_out_for_every_variant_against_plain() -> None:
    from dcoco.bench.core_parts import spec_rates
    from dcoco.checkpoint import load_drafter, load_target
    from dcoco.paths import TINY_MODELS

    drafters = {name: load_drafter(TINY_MODELS / name) for name in ("dflash", "dcoco")}
    target = load_target(TINY_MODELS / "target")
    rows = spec_rates(target, drafters, Precision.FP32, [[5, 6, 7], [8, 9]], 8, passes=2)
    names = ["vanilla", "ngram", "dflash", "dcoco", "dcoco-adaptive", "dcoco-lookup"]
    assert [r.variant for r in rows] == names
    assert rows[0].over_plain == 1.0
    assert rows[0].accepted_length == 1.0
    assert all(r.tokens_per_s > 0 and r.accepted_length >= 1.0 for r in rows)


CRASHES_WITH_EXTRA = """
import os, signal, sys
if sys.argv[-1] == "extra":
    os.kill(os.getpid(), signal.SIGSEGV)
print(float(sys.argv[2]) / 10)
"""


def test_llama_cpp_is_timed_again_without_its_extra_kernels_where_they_crash(
    tmp_path: Path,
) -> None:
    script = tmp_path / "timing.py"
    script.write_text(CRASHES_WITH_EXTRA)
    timing = time_llama([sys.executable, str(script)], ["model.gguf", "64", "2"], [1, 2, 3])
    assert timing.ms == pytest.approx(6.4)
    assert not timing.extra
    assert timing.notes == ["llama.cpp with extra buffer types failed (signal 11)"]
    script.write_text("import sys; sys.exit(3)")
    with pytest.raises(RuntimeError, match="plain buffer types failed \\(exit 3\\)"):
        time_llama([sys.executable, str(script)], ["model.gguf", "64", "2"], [1, 2, 3])
