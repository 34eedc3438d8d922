"""bf16 linears on weights packed once for oneDNN (`model/packed.py`)."""

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dcoco.model import packed
from dcoco.model.packed import Bf16Linear, Kernel, pack_linears
from dcoco.precision import apply_precision, current_precision
from dcoco.shared.options import Precision
from factories import make_target


def runnable(kernel: Kernel) -> bool:
    return {
        Kernel.BF16: packed.supported(),
        Kernel.FP16: packed.fbgemm_runs(),
        Kernel.FP32: torch.backends.mkldnn.is_available(),
        Kernel.PLAIN: True,
    }[kernel]


@pytest.fixture(params=list(Kernel))
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Kernel:
    """Each kernel this CPU runs, forced on the Bf16Linears the test makes."""
    chosen = Kernel(request.param)
    if not runnable(chosen):
        pytest.skip(f"{chosen} does not run on this CPU")
    monkeypatch.setattr(packed, "kernel_for", lambda weight: chosen)
    return chosen


def bf16_weight(rows: int, cols: int) -> torch.Tensor:
    """[rows, cols] bf16 values of magnitude 0.1 to 1, all exact in fp16."""
    generator = torch.Generator().manual_seed(rows * cols)
    magnitude = torch.rand(rows, cols, generator=generator) * 0.9 + 0.1  # [rows, cols]
    sign = torch.randint(0, 2, (rows, cols), generator=generator) * 2 - 1  # [rows, cols]
    return (magnitude * sign).bfloat16()  # [rows, cols]


@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (16, 96), (2, 3, 96)])
def test_a_bf16_linear_computes_what_f_linear_does(kernel: Kernel, shape: tuple[int, ...]) -> None:
    weight = bf16_weight(40, 96)  # [N, K]
    x = torch.randn(*shape).bfloat16()  # [..., K]
    linear = Bf16Linear(weight)
    assert linear.kernel is kernel
    out = linear(x)  # [..., N]
    assert out.shape == (*shape[:-1], 40)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), F.linear(x.float(), weight.float()), rtol=2e-2, atol=5e-2
    )


def test_the_weight_holds_the_bf16_values_in_the_kernel_s_type(kernel: Kernel) -> None:
    """oneDNN's packed weight is its opaque tensor, which plain ops refuse to read; fbgemm's
    fp16 weight stays a plain tensor. Each holds the bf16 values exactly."""
    weight = bf16_weight(64, 128)  # [N, K]
    linear = Bf16Linear(weight)
    held = {Kernel.BF16: torch.bfloat16, Kernel.FP16: torch.float16}.get(kernel, torch.float32)
    assert linear.weight.is_mkldnn == (kernel in (Kernel.BF16, Kernel.FP32))
    assert linear.weight.to_dense().dtype == held
    assert torch.equal(linear.weight.to_dense().float(), weight.float())


def test_compiled_code_runs_the_same_linear(kernel: Kernel) -> None:
    """inductor cannot lower oneDNN's or fbgemm's linear over a weight that is an input (as the
    compiled layers take them); the opaque ops take their place and compute the same."""
    linear = Bf16Linear(bf16_weight(48, 64))

    def mlp(layer: Bf16Linear, x: torch.Tensor) -> torch.Tensor:
        return F.silu(layer(x))  # [M, N]

    x = torch.randn(7, 64).bfloat16()  # [M, K]
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True)
    # Compiled, the upcast paths may apply silu before rounding to bf16: a bf16 step apart.
    close = {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(compiled(linear, x), mlp(linear, x), **close)
    torch.testing.assert_close(compiled(linear, x[:3]), mlp(linear, x[:3]), **close)


@pytest.mark.skipif(not packed.fbgemm_runs(), reason="fbgemm does not run on this CPU")
def test_fbgemm_s_packed_copy_is_made_once_and_dropped_with_its_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fp16 linear finds fbgemm's packed copy by its weight's address: eager and compiled
    calls reuse the one made at load, a deep copy packs its own, and a dropped model's copies
    go with it."""
    monkeypatch.setattr(packed, "kernel_for", lambda weight: Kernel.FP16)
    linear = Bf16Linear(bf16_weight(48, 64))
    made = packed._FBGEMM[linear.weight.data_ptr()]
    x = torch.randn(5, 64).bfloat16()  # [M, K]
    compiled = torch.compile(lambda layer, rows: layer(rows), fullgraph=True, dynamic=True)
    with torch.inference_mode():
        for rows in (x, x[:2], x[:1]):
            torch.testing.assert_close(compiled(linear, rows), linear(rows))
    assert packed._FBGEMM[linear.weight.data_ptr()] is made
    twin = copy.deepcopy(linear)
    assert twin.weight.data_ptr() != linear.weight.data_ptr()
    torch.testing.assert_close(twin(x), linear(x), rtol=0, atol=0)
    assert packed._FBGEMM[twin.weight.data_ptr()] is not made
    keys = {linear.weight.data_ptr(), twin.weight.data_ptr()}
    del linear, twin, compiled
    gc.collect()
    assert not keys & set(packed._FBGEMM)


class Parts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plain = nn.Linear(32, 16, bias=False).bfloat16()
        self.biased = nn.Linear(32, 16).bfloat16()
        self.float32 = nn.Linear(32, 16, bias=False)
        self.nested = nn.Sequential(nn.Linear(32, 32, bias=False).bfloat16())
        self.kept = nn.Sequential(nn.Linear(32, 32, bias=False).bfloat16())


def test_pack_linears_packs_bias_free_bf16_linears_outside_the_kept_part() -> None:
    parts = Parts()
    pack_linears(parts, keep=parts.kept)
    assert isinstance(parts.plain, Bf16Linear)
    assert isinstance(parts.nested[0], Bf16Linear)
    assert type(parts.biased) is nn.Linear
    assert type(parts.float32) is nn.Linear
    assert type(parts.kept[0]) is nn.Linear


def test_where_bf16_is_emulated_the_linears_multiply_wider_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where oneDNN has no native bf16, a Bf16Linear holds its weights' bf16 values in fp16
    for fbgemm (in fp32 where one is beyond fp16's range), and upcasts its rows."""
    monkeypatch.setattr(packed, "supported", lambda: False)
    parts = Parts()
    weight = parts.plain.weight.detach().clone()  # [16, 32] bf16
    pack_linears(parts)
    assert isinstance(parts.plain, Bf16Linear)
    assert parts.plain.kernel is (Kernel.FP16 if packed.fbgemm_runs() else Kernel.FP32)
    assert torch.equal(parts.plain.weight.to_dense().float(), weight.float())
    x = torch.randn(24, 32).bfloat16()  # [M, K]
    out = parts.plain(x)  # [M, 16]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x.float(), weight.float()).bfloat16())
    wide = bf16_weight(8, 32)  # [8, 32]
    wide[0, 0] = 1e5  # beyond fp16
    assert Bf16Linear(wide).kernel is Kernel.FP32
    assert torch.equal(Bf16Linear(wide).weight.to_dense(), wide.float())
    dense = Bf16Linear(torch.randn(8, 32)).weight.to_dense()  # a quantized linear's dense copy
    assert torch.equal(dense, dense.bfloat16().to(dense.dtype))  # bf16 values


@pytest.mark.skipif(not packed.fbgemm_runs(), reason="fbgemm does not run on this CPU")
def test_fp16_keeps_tiny_bf16_values_to_within_3e_8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packed, "supported", lambda: False)
    weight = bf16_weight(8, 32)  # [8, 32]
    weight[0, :4] = torch.tensor([3e-7, -1e-6, 2e-8, 5e-9]).bfloat16()  # fp16 subnormals or less
    linear = Bf16Linear(weight)
    assert linear.kernel is Kernel.FP16
    error = (linear.weight.float() - weight.float()).abs()  # [8, 32]
    assert 0 < error.max() <= 2**-25
    assert torch.equal(error[:, 4:], torch.zeros_like(error[:, 4:]))


def test_a_packed_target_computes_what_it_did_and_stays_bf16() -> None:
    target = make_target(hidden=64, vocab=64).bfloat16()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])  # [1, T]
    positions = torch.arange(ids.shape[1]).unsqueeze(0)  # [1, T]
    target.fuse_projections()
    with torch.inference_mode():
        hidden, _ = target(ids, positions)  # [1, T, H]
        before = target.logits(hidden)  # [1, T, V]
    apply_precision(target, Precision.BF16)
    assert isinstance(target.lm_head, Bf16Linear)
    assert current_precision(target) is Precision.BF16
    with torch.inference_mode():
        hidden, _ = target(ids, positions)  # [1, T, H]
        after = target.logits(hidden)  # [1, T, V]
    torch.testing.assert_close(after.float(), before.float(), rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match="already bf16"):
        apply_precision(target, Precision.INT4)
