"""bf16 linears on weights packed once for oneDNN (`model/packed.py`)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dcoco.model import packed
from dcoco.model.packed import Bf16Linear, pack_linears
from dcoco.precision import apply_precision, current_precision
from dcoco.shared.options import Precision
from factories import make_target


@pytest.mark.parametrize("shape", [(1, 96), (5, 96), (16, 96), (2, 3, 96)])
def test_a_bf16_linear_computes_what_f_linear_does(shape: tuple[int, ...]) -> None:
    weight = torch.randn(40, 96).bfloat16()  # [N, K]
    x = torch.randn(*shape).bfloat16()  # [..., K]
    linear = Bf16Linear(weight)
    assert linear.packed == torch.backends.mkldnn.is_available()
    assert linear.fp32 == (not packed.supported())
    out = linear(x)  # [..., N]
    assert out.shape == (*shape[:-1], 40)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), F.linear(x.float(), weight.float()), rtol=2e-2, atol=5e-2
    )


def test_the_packed_weight_is_opaque() -> None:
    """Packed, the weight is oneDNN's opaque tensor, which plain ops refuse to read; where
    bf16 is emulated it holds the bf16 values in fp32."""
    weight = torch.randn(64, 128).bfloat16()  # [N, K]
    linear = Bf16Linear(weight)
    assert linear.packed
    assert linear.weight.is_mkldnn
    held = torch.float32 if linear.fp32 else torch.bfloat16
    assert torch.equal(linear.weight.to_dense(), weight.to(held))


def test_compiled_code_runs_the_same_linear() -> None:
    """inductor cannot lower oneDNN's linear over a weight that is an input; the opaque op
    takes its place and computes the same."""
    linear = Bf16Linear(torch.randn(48, 64).bfloat16())

    def mlp(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = x.float() if linear.fp32 else x  # [M, K]
        return F.silu(packed.linear(rows, weight).to(x.dtype))  # [M, N]

    x = torch.randn(7, 64).bfloat16()  # [M, K]
    compiled = torch.compile(mlp, fullgraph=True, dynamic=True)
    # Compiled, the upcast path may apply silu before rounding to bf16: a bf16 step apart.
    close = {"rtol": 2e-2, "atol": 1e-3}
    torch.testing.assert_close(compiled(x, linear.weight), mlp(x, linear.weight), **close)
    torch.testing.assert_close(compiled(x[:3], linear.weight), mlp(x[:3], linear.weight), **close)


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


def test_where_bf16_is_emulated_the_linears_multiply_fp32_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where oneDNN has no native bf16, a Bf16Linear holds its weights in fp32 (their bf16
    values) and upcasts its rows."""
    monkeypatch.setattr(packed, "supported", lambda: False)
    parts = Parts()
    weight = parts.plain.weight.detach().clone()  # [16, 32] bf16
    pack_linears(parts)
    assert isinstance(parts.plain, Bf16Linear)
    assert parts.plain.fp32
    assert torch.equal(parts.plain.weight.to_dense(), weight.float())
    x = torch.randn(24, 32).bfloat16()  # [M, K]
    out = parts.plain(x)  # [M, 16]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x.float(), weight.float()).bfloat16())
    dense = Bf16Linear(torch.randn(8, 32)).weight.to_dense()  # a quantized linear's dense copy
    assert dense.dtype == torch.float32
    assert torch.equal(dense, dense.bfloat16().float())  # bf16 values


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
