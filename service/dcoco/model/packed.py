"""bf16 linears on weights packed once, for the fastest kernel this CPU has (`Kernel`).

`F.linear` in bf16 calls oneDNN, which reorders the weight into its blocked (AMX or
AVX512_BF16) layout on every call: for SmolLM2-135M that is a second pass over every weight a
step. Reordered once at load (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's
freezing does for constant weights), the same matmuls ran 1.5-1.8x faster at 1 to 256 rows on
an AMX CPU (docs/engine-profile.md).

Where oneDNN runs bf16 natively (`supported`) `F.linear` takes the same kernels, less the
reorder. Elsewhere (AVX2-only CPUs) bf16 matmuls are emulated: over SmolLM2's 3,072 x 576
weight one row costs less in bf16 than in fp32, but 16 rows cost 2.2x and 128 rows 6.8x the
fp32 matmul. There a `Bf16Linear` multiplies its rows upcast to fp32 by the same bf16 values
held in another type: in fp16, packed by fbgemm (whose fp16 GEMM is written for AVX2: it
widens the weights in registers and sums in fp32), or in fp32, packed for oneDNN, where some
value is beyond fp16's range. The sums are then a native bf16 matmul's, with fp32
accumulation, but for the values below 2^-14 in magnitude: fp16 keeps them to 2^-25 (3e-8),
where bf16 itself rounds any weight above 1.5e-5 by more. SmolLM2's target weights are all
exact in fp16; its drafters' are not. On an AVX2-only AMD EPYC fbgemm's fp16 ran 1.4-1.8x faster
than oneDNN's fp32 at 1 to 128 rows (docs/engine-profile.md).

A oneDNN-packed weight is oneDNN's opaque tensor (layout torch._mkldnn, shape [N, K]): plain
ops refuse it; `linear` multiplies by it and `to_dense()` reads it back. fbgemm's packed
weight is a TorchScript object, which no graph can take as an input: the linear keeps its fp16
weight as a tensor, and the packed copy is found by that tensor's address (`fbgemm_packed`).
inductor can lower neither linear over a weight that is a graph input (the compiled layers take
every weight as one), so compiled code calls them as the opaque ops `dcoco::packed_linear` and
`dcoco::fp16_linear`.
"""

import functools
import weakref
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import nn

# The row count oneDNN picks the packed layout for; the layout served 1 to 256 rows alike.
PACK_ROWS = 16


class Kernel(StrEnum):
    """How a `Bf16Linear` multiplies."""

    BF16 = "onednn-bf16"  # bf16 weights packed for oneDNN, which runs bf16 natively
    FP16 = "fbgemm-fp16"  # the bf16 values in fp16, packed by fbgemm; rows upcast
    FP32 = "onednn-fp32"  # the bf16 values in fp32, packed for oneDNN; rows upcast
    PLAIN = "plain"  # the bf16 values in fp32, for `F.linear` (a torch without oneDNN)


@functools.cache
def supported() -> bool:
    """Whether this CPU and torch build run bf16 matmuls in oneDNN natively."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@functools.cache
def fbgemm_runs() -> bool:
    """Whether torch's fbgemm runs here (an x86 CPU with AVX2 or more, a build with fbgemm)."""
    try:
        weight = torch.ops.quantized.linear_prepack_fp16(torch.ones(1, 8), None)
        return bool(torch.ops.quantized.linear_dynamic_fp16(torch.ones(1, 8), weight).sum() == 8)
    except RuntimeError:
        return False


def kernel_for(weight: torch.Tensor) -> Kernel:
    """The kernel a `Bf16Linear` of these bf16 values runs on this CPU."""
    if supported():
        return Kernel.BF16
    if fbgemm_runs() and weight.abs().max() <= torch.finfo(torch.float16).max:
        return Kernel.FP16
    return Kernel.FP32 if torch.backends.mkldnn.is_available() else Kernel.PLAIN


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 or fp32, contiguous -> the same weights in oneDNN's layout, for `linear`
    only."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)  # [N, K]


# The opaque ops compiled code calls (module docstring). Defined on a Library with a kernel for
# every backend rather than by `torch.library.custom_op`, whose Python wrapping cost about 30 us
# more a call in eager dispatch on the AVX2-only EPYC; compiled engines taking turns stepped
# 3-5% faster this way (bf16 at batch 1 28.0 against 29.4 ms, int4 at batch 8 45.8 against 47.3).
_OPS = torch.library.Library("dcoco", "DEF")
_OPS.define("packed_linear(Tensor x, Tensor weight) -> Tensor")
_OPS.define("fp16_linear(Tensor x, Tensor weight) -> Tensor")


def _packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] of x's dtype from `pack` -> [..., N]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")  # [..., N]


def _fake_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


torch.library.register_fake("dcoco::packed_linear", _fake_linear, lib=_OPS)
torch.library.register_fake("dcoco::fp16_linear", _fake_linear, lib=_OPS)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] of x's dtype from `pack` -> [..., N]."""
    if torch.compiler.is_compiling():
        return torch.ops.dcoco.packed_linear(x, weight)  # [..., N]
    return _packed_linear(x, weight)  # [..., N]


class _Fbgemm:
    """fbgemm's packed copy of one fp16 weight."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.packed = torch.ops.quantized.linear_prepack_fp16(weight.float(), None)
        self.shape = weight.shape


_FBGEMM: dict[int, _Fbgemm] = {}  # weight.data_ptr() -> its packed copy


def fbgemm_packed(weight: torch.Tensor) -> torch.ScriptObject:
    """fbgemm's packed copy of the fp16 `weight` [N, K], made on its first use and dropped with
    the tensor (a copy of the tensor, as `copy.deepcopy` of a model makes, packs its own).
    Keyed by address, so the weight must not change in place."""
    key = weight.data_ptr()
    entry = _FBGEMM.get(key)
    if entry is None or entry.shape != weight.shape:
        entry = _FBGEMM[key] = _Fbgemm(weight)
        weakref.finalize(weight, _forget, key, entry)
    return entry.packed


def _forget(key: int, entry: _Fbgemm) -> None:
    if _FBGEMM.get(key) is entry:
        del _FBGEMM[key]


def _fp16_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K] fp32, weight [N, K] fp16 -> [..., N] fp32."""
    return torch.ops.quantized.linear_dynamic_fp16(x, fbgemm_packed(weight))  # [..., N]


_OPS.impl("packed_linear", _packed_linear, "CompositeExplicitAutograd")
_OPS.impl("fp16_linear", _fp16_linear, "CompositeExplicitAutograd")


class Bf16Linear(nn.Module):
    """An inference-only bias-free linear with bf16 activations, on weights packed for
    `kernel` (module docstring)."""

    weight: torch.Tensor  # [N, K]: bf16, fp16 or fp32 (`Kernel`); oneDNN's opaque layout there

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        plain = weight.detach().bfloat16().contiguous()  # [N, K]
        self.kernel = kernel_for(plain)
        if self.kernel is Kernel.FP16:
            held = plain.half()  # [N, K]
            fbgemm_packed(held)
        elif self.kernel is Kernel.PLAIN:
            held = plain.float()  # [N, K]
        else:
            held = pack(plain.float() if self.kernel is Kernel.FP32 else plain)  # [N, K]
        self.register_buffer("weight", held)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is Kernel.BF16:
            return linear(x, self.weight)  # [..., N]
        rows = x.float()  # [..., K]
        if self.kernel is Kernel.PLAIN:
            out = F.linear(rows, self.weight)  # [..., N]
        elif self.kernel is Kernel.FP32:
            out = linear(rows, self.weight)  # [..., N]
        elif torch.compiler.is_compiling():
            out = torch.ops.dcoco.fp16_linear(rows, self.weight)  # [..., N]
        else:
            out = _fp16_linear(rows, self.weight)  # [..., N]
        return out.to(x.dtype)  # [..., N]


def pack_linears(module: nn.Module, keep: nn.Module | None = None) -> None:
    """Replaces every bias-free bf16 nn.Linear under `module` (in place) by a Bf16Linear,
    leaving the subtree `keep` (code that reads its weights) as it is. Ties between weights are
    not kept."""
    for name, child in module.named_children():
        if child is keep:
            continue
        if isinstance(child, nn.Linear) and child.bias is None:
            if child.weight.dtype == torch.bfloat16:
                setattr(module, name, Bf16Linear(child.weight))
        else:
            pack_linears(child, keep)
