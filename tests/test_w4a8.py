"""The w4a8 precision: 4-bit weights times activations quantized to 8 bits per group of 32, on
our own kernel (dcoco/model/w4a8.cpp)."""

import copy
import logging
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dcoco import precision
from dcoco.engine.engine import Engine
from dcoco.model import w4a8_kernel
from dcoco.model.quant import GROUP, W4A8Linear, four_bit_grid
from dcoco.precision import apply_precision, current_precision
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from factories import make_target

pytestmark = pytest.mark.skipif(
    w4a8_kernel.unavailable() is not None, reason=str(w4a8_kernel.unavailable())
)


def quantized(linear: W4A8Linear) -> W4A8Linear:
    linear.dense_from = 10**9  # the kernel at every row count
    return linear


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x quantized to 8 bits per group of 32 (scale
    max|x| / 127, rounded half to even) times the weights on their fp16-held 4-bit grid."""
    levels, scale, low = four_bit_grid(weight)  # [N, G, 32], [N, G], [N, G]
    grid = levels * scale.half().float()[..., None] + low.half().float()[..., None]  # [N, G, 32]
    groups = x.float().view(x.shape[0], -1, GROUP)  # [M, G, 32]
    step = groups.abs().amax(-1, keepdim=True) / 127  # [M, G, 1]
    q = torch.where(step > 0, groups / step, 0).round()  # [M, G, 32]
    return (q * step).view(x.shape).double() @ grid.view(weight.shape).double().T  # [M, N]


def test_the_kernel_sums_the_quantized_products_exactly_but_for_float_rounding() -> None:
    torch.manual_seed(0)
    weight = torch.randn(72, 96) * torch.logspace(-2, 0, 72).unsqueeze(1)  # [N, K]
    x = torch.randn(7, 96) * 3  # [M, K] fp32
    x[2, :GROUP] = 0  # a group of zeros quantizes to zeros
    out = quantized(W4A8Linear(weight))(x)  # [M, N]
    assert out.dtype == torch.float32
    assert out.shape == (7, 72)
    expected = reference(x, weight)  # [M, N]
    assert float((out.double() - expected).abs().max()) < 1e-5 * float(expected.abs().max())
    # and close to the unquantized product: 4-bit weights, 8-bit activations
    exact = F.linear(x, weight)  # [M, N]
    assert float((out - exact).abs().max()) < 0.1 * float(exact.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_comes_out_the_same_whatever_rows_and_threads_run_beside_it(
    dtype: torch.dtype,
) -> None:
    """Speculation verifies several rows in one call where plain decoding runs one: a row's
    result must not depend on the others (rows go through the kernel four at a time)."""
    torch.manual_seed(1)
    linear = quantized(W4A8Linear(torch.randn(50, 64) * 0.1))
    x = torch.randn(9, 64).to(dtype)  # [M, K]
    alone = torch.cat([linear(x[i : i + 1]) for i in range(9)])  # [M, N]
    assert alone.dtype == dtype
    for rows in range(1, 10):
        assert torch.equal(linear(x[:rows]), alone[:rows])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(linear(x), alone)
    finally:
        torch.set_num_threads(threads)


def test_leading_shapes_and_the_dense_weights_from_many_rows() -> None:
    torch.manual_seed(2)
    linear = W4A8Linear(torch.randn(40, 64) * 0.1)
    x = torch.randn(2, 3, 64).bfloat16()  # [N, T, K]
    assert linear(x).shape == (2, 3, 40)
    linear.dense_from = 4
    many = torch.randn(5, 64).bfloat16()  # [M, K]
    torch.testing.assert_close(linear(many), linear.dense(many), rtol=0, atol=0)
    few = torch.cat([linear(many[:3]), linear(many[3:])])  # [M, N], quantized
    torch.testing.assert_close(linear(many), few, rtol=0, atol=0.05)


def test_bad_shapes_and_weights_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        W4A8Linear(torch.randn(8, 40))
    with pytest.raises(ValueError, match="fp16"):
        W4A8Linear(torch.full((4, 32), 1e6))
    linear = W4A8Linear(torch.randn(8, 64))
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.dcoco.w4a8_linear(torch.randn(2, 40), linear.weight)
    with pytest.raises(RuntimeError, match="needs 40"):
        torch.ops.dcoco.w4a8_linear(torch.randn(2, 64), linear.weight[:, :20].contiguous())
    with pytest.raises(RuntimeError, match="bf16 or fp32"):
        torch.ops.dcoco.w4a8_linear(torch.randn(2, 64).double(), linear.weight)


def test_compiled_code_calls_the_kernel_as_an_opaque_op() -> None:
    torch.manual_seed(3)
    linear = quantized(W4A8Linear(torch.randn(24, 32) * 0.1))

    def layer(x: torch.Tensor) -> torch.Tensor:
        return F.silu(linear(x * 2))  # [M, N]

    compiled = torch.compile(layer, dynamic=True, fullgraph=True)
    for rows in (2, 3, 5):
        x = torch.randn(rows, 32).bfloat16()  # [M, K]
        assert torch.equal(compiled(x), layer(x))


def test_a_target_in_w4a8_decodes_close_to_int4() -> None:
    prompts, params = [[1, 2, 3], [4, 5]], SamplingParams(max_tokens=12)
    answers = {}
    for chosen in (Precision.INT4, Precision.W4A8):
        target = make_target(hidden=64, vocab=64)
        apply_precision(target, chosen)
        assert current_precision(target) is chosen
        cfg = EngineConfig(mode=Mode.VANILLA, max_batch_size=2, max_model_len=32, precision=chosen)
        done, _ = Engine(target, None, cfg).generate(prompts, params)
        answers[chosen] = [c.token_ids for c in done]
    same = sum(
        a == b
        for p, q in zip(answers[Precision.INT4], answers[Precision.W4A8], strict=True)
        for a, b in zip(p, q, strict=True)
    )
    assert same >= 0.7 * params.max_tokens * len(prompts)


def test_without_the_kernel_auto_leaves_w4a8_out_and_asking_for_it_fails_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reason = "w4a8 needs an x86 CPU with AVX2; torch reports DEFAULT"
    monkeypatch.setattr(precision, "unavailable", lambda: reason)
    monkeypatch.setattr("dcoco.model.quant.unavailable", lambda: reason)
    with caplog.at_level(logging.WARNING):
        assert Precision.W4A8 not in precision.measured()
    assert reason in caplog.text
    assert Precision.INT4 in precision.measured()
    target = make_target()
    with pytest.raises(ValueError, match="AVX2"):
        apply_precision(copy.deepcopy(target), Precision.W4A8)


def test_the_kernel_reports_a_cpu_without_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert w4a8_kernel.unavailable.__wrapped__() == (
        "w4a8 needs an x86 CPU with AVX2; torch reports DEFAULT"
    )


def test_a_kernel_that_cannot_build_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-compiler-here"))
    why = w4a8_kernel.unavailable.__wrapped__()
    assert why is not None
    assert why.startswith(f"the w4a8 kernel did not build or load in {tmp_path}")
    assert os.environ["PATH"] == str(tmp_path / "no-compiler-here")  # put back as it was
