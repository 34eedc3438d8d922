"""The engine's precisions: weight-only int8 and int4 linears, and `auto`'s measured choice."""

import copy
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dcoco import precision
from dcoco.engine.engine import Engine
from dcoco.engine.runner import ModelRunner
from dcoco.model.causal_lm import CausalLM
from dcoco.model.layers import set_attention_upcast
from dcoco.model.quant import DENSE_FROM, GROUP, Int4Linear, Int8Linear, quantized_linears
from dcoco.model.w4a8_kernel import unavailable
from dcoco.precision import (
    CROSSOVER_ROWS,
    UPCAST_SHAPES,
    WIDTHS,
    CostTable,
    apply_precision,
    attention_upcast,
    cache_file,
    cache_key,
    cached,
    cost_table,
    current_precision,
    dense_crossover,
    widths,
)
from dcoco.shared.contention import waited_seconds
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter
from factories import make_drafter, make_target

# What auto times: w4a8 too where its kernel runs (tests/test_w4a8.py: where it does not).
TIMED = {"fp32", "bf16", "int8", "int4"} | ({"w4a8"} if unavailable() is None else set())


def q4_1_grid(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights as GGUF's Q4_1 stores them: levels 0..15 (both ends used) times a scale plus a
    minimum per group of 32; returns the dequantized weights and the levels."""
    g = torch.Generator().manual_seed(0)
    levels = torch.randint(0, 16, (rows, cols // GROUP, GROUP), generator=g)  # [N, G, 32]
    levels[..., 0], levels[..., 1] = 0, 15
    scale = torch.rand(rows, cols // GROUP, 1, generator=g).bfloat16().float() / 50  # [N, G, 1]
    low = -8 * scale  # [N, G, 1]: zero = low + 8 * scale = 0, exact in bf16
    return (levels * scale + low).view(rows, cols), levels.view(rows, cols)


def test_int4_recovers_weights_on_the_q4_1_grid_exactly() -> None:
    weight, _ = q4_1_grid(64, 96)  # [N, K]
    x = torch.randn(5, 96).bfloat16()  # [M, K]
    out = Int4Linear(weight)(x)  # [M, N]
    exact = F.linear(x.float(), weight)  # [M, N]
    assert out.shape == (5, 64)
    # Only the bf16 output rounds: the weights themselves came back exactly.
    torch.testing.assert_close(out.float(), exact, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out, F.linear(x, weight.bfloat16()), rtol=0, atol=2e-2)


def test_int8_is_close_per_channel_and_keeps_leading_shapes() -> None:
    torch.manual_seed(0)
    weight = torch.randn(48, 64) * torch.logspace(-2, 0, 48).unsqueeze(1)  # rows of every scale
    x = torch.randn(2, 3, 64).bfloat16()  # [N, T, K]
    out = Int8Linear(weight)(x)  # [N, T, 48]
    assert out.shape == (2, 3, 48)
    exact = F.linear(x.float(), weight)  # [N, T, 48]
    error = (out.float() - exact).abs().amax(-1) / exact.abs().amax(-1)  # [N, T]
    assert float(error.max()) < 0.03


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear])
def test_many_rows_take_the_dense_weights_and_agree(kind: type[Int8Linear | Int4Linear]) -> None:
    """From `dense_from` rows on, the same weights dequantized to bf16 multiply instead."""
    weight, _ = q4_1_grid(64, 96)  # [N, K]
    linear = kind(weight)
    assert linear.dense_from == DENSE_FROM  # until an engine measures it
    linear.dense_from = 9
    x = torch.randn(12, 96).bfloat16()  # [M, K]
    few = torch.cat([linear(x[:8]), linear(x[8:])])  # [M, N], quantized
    many = linear(x)  # [M, N], dense
    torch.testing.assert_close(many, linear.dense(x), rtol=0, atol=0)
    torch.testing.assert_close(many, few, rtol=0, atol=3e-2)


def test_int4_refuses_widths_off_its_groups() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        Int4Linear(torch.randn(8, 40))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fused_projections_compute_what_the_separate_ones_do(family: str) -> None:
    target = make_target(family=family)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])  # [1, T]
    positions = torch.arange(ids.shape[1]).unsqueeze(0)  # [1, T]
    layers = (0,)  # a layer's output, the drafter's features
    with torch.no_grad():
        before, feats_before = target(ids, positions, feature_layers=layers)  # [1, T, H]
        target.fuse_projections()
        target.fuse_projections()  # a second call changes nothing
        after, feats_after = target(ids, positions, feature_layers=layers)  # [1, T, H]
    names = set(target.state_dict())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names
    assert "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any(n.endswith(("q_proj.weight", "gate_proj.weight")) for n in names)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(feats_after, feats_before, rtol=1e-5, atol=1e-5)


def test_quantizing_is_one_way() -> None:
    target = make_target(hidden=64, vocab=64)
    apply_precision(target, Precision.INT4)
    assert current_precision(target) is Precision.INT4
    assert isinstance(target.lm_head, Int8Linear)
    assert target.model.embed_tokens.weight.dtype == torch.bfloat16  # lookups stay whole
    apply_precision(target, Precision.INT4)  # already there: nothing happens
    with pytest.raises(ValueError, match="already int4"):
        apply_precision(target, Precision.FP32)


@pytest.mark.parametrize("precision", [Precision(p) for p in sorted(TIMED - {"fp32", "bf16"})])
def test_speculation_runs_and_mostly_matches_plain_decoding(
    pair: tuple[CausalLM, DFlashDrafter], precision: Precision
) -> None:
    """Not exact outside fp32 (kernel shapes change rounding), but a random model's greedy
    output barely moves, and drafts are verified by the same quantized target."""
    prompts = [[1, 2, 3], [5, 6, 7, 8], [9]]
    params = SamplingParams(max_tokens=24)

    def run(mode: Mode) -> tuple[list[list[int]], int]:
        cfg = EngineConfig(mode=mode, max_batch_size=3, max_model_len=64, precision=precision)
        target, drafter = copy.deepcopy(pair)
        engine = Engine(target, drafter if mode is not Mode.VANILLA else None, cfg)
        completions, cycles = engine.generate(prompts, params)
        return [c.token_ids for c in completions], sum(c.accepted_tokens for c in cycles)

    (plain, _), (speculated, accepted) = run(Mode.VANILLA), run(Mode.DCOCO)
    assert accepted > 0
    pairs = zip(plain, speculated, strict=True)
    same = sum(a == b for p, s in pairs for a, b in zip(p, s, strict=True))
    assert same >= 0.8 * sum(len(p) for p in plain)


def test_a_quantized_engine_s_drafter_layers_take_the_target_s_kind_and_crossover(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    """The drafter's decoder layers quantized as the target's, switching to dense weights from
    the same row count, and nothing else of it; a bf16 engine quantizes nothing."""
    for served, kind in ((Precision.INT4, Int4Linear), (Precision.BF16, None)):
        target, drafter = copy.deepcopy(pair)
        cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=1, max_model_len=64, precision=served)
        Engine(target, drafter, cfg)
        mine, theirs = quantized_linears(drafter.layers), quantized_linears(target.model.layers)
        if kind is None:
            assert not mine
            continue
        assert mine
        assert all(type(m) is kind for m in mine)
        assert {m.dense_from for m in mine} == {theirs[0].dense_from}
        assert quantized_linears(drafter) == mine  # nothing outside the layers


def test_the_fastest_has_the_lowest_geometric_mean_of_its_matmuls() -> None:
    matmuls = {
        "fp32": {1: 0.060, 16: 0.140},  # geometric mean 0.092
        "bf16": {1: 0.024, 16: 0.280},  # 0.082
        "int4": {1: 0.010, 16: 0.900},  # 0.095: fastest alone, slowest verifying
    }
    # whole forwards, a shared 0.2 s around the matmuls: nearly alike, and not what decides
    forwards = {p: {w: s + 0.2 for w, s in row.items()} for p, row in matmuls.items()}
    forwards["fp32"] = {1: 0.2, 16: 0.2}
    table = CostTable(forwards, matmuls, threads=2)
    assert table.fastest() is Precision.BF16
    assert table.fastest(among=(Precision.FP32, Precision.INT4)) is Precision.FP32
    assert widths(4 * 16) == (1, 2, 4, 8, 16, 32)
    assert widths(3) == (1, 2)


@pytest.mark.usefixtures("any_load")
def test_auto_measures_once_caches_and_survives_a_corrupt_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = make_target(hidden=64, vocab=64)
    cfg = EngineConfig(mode=Mode.VANILLA, max_batch_size=2, max_model_len=32, cache_dir=tmp_path)
    engine = Engine(copy.deepcopy(target), None, replace(cfg, precision=Precision.AUTO))
    assert engine.costs is not None
    assert engine.cfg.precision is engine.costs.fastest()
    assert set(engine.costs.seconds) == TIMED
    assert tuple(engine.costs.seconds["fp32"]) == WIDTHS
    for name, row in engine.costs.matmuls.items():  # a part of each forward
        assert tuple(row) == WIDTHS
        assert all(0 < row[w] < engine.costs.seconds[name][w] for w in WIDTHS)
    cached = json.loads(cache_file(tmp_path).read_text())
    assert sum("seconds" in entry for entry in cached.values()) == 1  # besides attention's
    for kind in TIMED - {"fp32", "bf16"}:  # timed with the kernels their engines run
        assert cache_key(target, ("dense", kind, CROSSOVER_ROWS)) in cached

    # Another batch size (or mode) reads the same entry: one choice per CPU and model.
    wider = Engine(
        copy.deepcopy(target), None, replace(cfg, precision=Precision.AUTO, max_batch_size=8)
    )
    assert wider.costs == engine.costs
    again = cost_table(target, WIDTHS, tmp_path)
    assert again == engine.costs  # read back, not measured

    cache_file(tmp_path).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        fresh = cost_table(target, (1, 2), tmp_path)
    assert "unreadable" in caplog.text
    assert set(fresh.seconds) == TIMED
    assert json.loads(cache_file(tmp_path).read_text())  # rewritten whole


def small_engine(mode: Mode, chosen: Precision, cache_dir: Path) -> EngineConfig:
    return EngineConfig(
        mode=mode, max_batch_size=2, max_model_len=32, precision=chosen, cache_dir=cache_dir
    )


def put_entry(cache_dir: Path, key: str, entry: dict[str, object]) -> None:
    """Replaces one entry of the measurement cache, as another start would have written it."""
    cached = json.loads(cache_file(cache_dir).read_text())
    cache_file(cache_dir).write_text(json.dumps(cached | {key: entry}))


def test_small_bf16_attention_in_fp32_or_bf16_gives_the_same_answer_within_rounding() -> None:
    target = make_target(hidden=64, vocab=64).bfloat16()
    ids = torch.randint(0, 64, (2, 5))  # [N, T]
    positions = torch.arange(5).expand(2, 5)  # [N, T]
    mask = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5)  # [N, 1, T, L]
    with torch.inference_mode():
        set_attention_upcast(target, True)
        upcast, _ = target(ids, positions, mask=mask)  # [N, T, H]
        set_attention_upcast(target, False)
        bf16, _ = target(ids, positions, mask=mask)  # [N, T, H]
        unmasked, _ = target(ids, positions)  # [N, T, H], causal SDPA in bf16 either way
    assert not torch.equal(upcast, bf16)  # two kernels ran
    torch.testing.assert_close(upcast, bf16, rtol=0.05, atol=0.05)
    torch.testing.assert_close(bf16, unmasked, rtol=0.05, atol=0.05)


@pytest.mark.usefixtures("any_load")
def test_the_attention_choice_is_measured_once_cached_and_sets_the_engines_attention_and_caches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_target(hidden=64, vocab=64)
    first = attention_upcast(target, tmp_path)
    key = cache_key(target, ("attention", *UPCAST_SHAPES))
    entry = json.loads(cache_file(tmp_path).read_text())[key]
    assert set(entry) == {"bf16", "fp32"}
    assert all(s > 0 for s in entry.values())
    assert first == (entry["fp32"] < entry["bf16"])

    def fail(_: CausalLM) -> dict[str, float]:
        raise AssertionError("measured again")

    monkeypatch.setattr(precision, "measure_upcast", fail)
    monkeypatch.setattr(ModelRunner, "_start_compiling", lambda *_: None)  # the choice alone
    cfg = small_engine(Mode.DCOCO, Precision.BF16, tmp_path)
    for bf16_seconds, upcast in ((1.0, True), (0.5, False)):
        put_entry(tmp_path, key, {"bf16": bf16_seconds, "fp32": 0.75})
        engine = Engine(copy.deepcopy(target), make_drafter(target), cfg)
        assert engine.runner.drafter is not None
        models = (engine.runner.target, engine.runner.drafter)
        flags = {m.upcast for model in models for m in model.modules() if hasattr(m, "upcast")}
        assert flags == {upcast}
        for compile in (False, True):
            drafter = make_drafter(target)
            engine = Engine(copy.deepcopy(target), drafter, replace(cfg, compile=compile))
            caches = (engine.runner.target_cache, engine.runner.drafter_cache)
            held = {t.dtype for c in caches if c is not None for t in (c.k, c.v)}
            # eager layers read the cache as it is; compiled ones convert as they gather it
            assert held == {torch.float32 if upcast and not compile else torch.bfloat16}
    fp32 = Engine(
        copy.deepcopy(target), None, replace(cfg, mode=Mode.VANILLA, precision=Precision.FP32)
    )
    assert not any(getattr(m, "upcast", False) for m in fp32.runner.target.modules())

    monkeypatch.undo()
    cache_file(tmp_path).write_text("[]")
    with caplog.at_level(logging.WARNING):
        assert attention_upcast(target, tmp_path) in (True, False)
    assert "unreadable" in caplog.text
    assert key in json.loads(cache_file(tmp_path).read_text())


@pytest.mark.usefixtures("any_load")
def test_the_dense_crossover_is_measured_once_cached_and_applied_by_engines(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_target(hidden=64, vocab=64)
    quantized = copy.deepcopy(target)
    apply_precision(quantized, Precision.INT4)
    dense_crossover(quantized, tmp_path)
    key = cache_key(quantized, ("dense", "int4", CROSSOVER_ROWS))
    entry = json.loads(cache_file(tmp_path).read_text())[key]
    assert set(entry) == {"layers", "head"}
    allowed = {*CROSSOVER_ROWS, CROSSOVER_ROWS[-1] + 1}
    assert {linear.dense_from for linear in quantized_linears(quantized)} <= allowed

    def fail(_: CausalLM) -> dict[str, int]:
        raise AssertionError("measured again")

    monkeypatch.setattr(precision, "measure_crossover", fail)
    put_entry(tmp_path, key, {"layers": 5, "head": 3})
    engine = Engine(
        copy.deepcopy(target), None, small_engine(Mode.VANILLA, Precision.INT4, tmp_path)
    )
    served = engine.runner.target
    assert {m.dense_from for m in quantized_linears(served.model.layers)} == {5}
    assert served.lm_head.dense_from == 3

    monkeypatch.undo()
    put_entry(tmp_path, key, {"layers": "many"})
    with caplog.at_level(logging.WARNING):
        dense_crossover(quantized, tmp_path)
    assert "unreadable" in caplog.text
    assert json.loads(cache_file(tmp_path).read_text())[key]["layers"] in allowed


def spin(seconds: float) -> dict[str, int]:
    """A measurement's stand-in: one thread busy for `seconds`."""
    end, turns = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        turns += 1
    return {"turns": turns}


@pytest.mark.skipif(waited_seconds() is None, reason="this kernel does not report run-queue time")
def test_a_measurement_that_waited_for_its_cpu_serves_this_start_but_is_not_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    hog = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    )
    os.sched_setaffinity(0, {cpu})  # this thread only: it shares its one CPU with the hog
    try:
        with caplog.at_level(logging.WARNING):
            value = cached(tmp_path, "busy", lambda: spin(0.6), dict, dict)
    finally:
        os.sched_setaffinity(0, mine)
        hog.kill()
        hog.wait()
    assert value["turns"] > 0  # the busy measurement still serves
    assert "not cached" in caplog.text
    assert "waited for a CPU" in caplog.text
    assert not cache_file(tmp_path).exists()

    def fail() -> dict[str, int]:
        raise AssertionError("measured again")

    # the rest of this process reads the same measurement: its engines run one precision
    assert cached(tmp_path, "busy", fail, dict, dict) == value
