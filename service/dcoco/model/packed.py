"""bf16 linears on weights packed once into oneDNN's blocked layout.

`F.linear` in bf16 calls oneDNN, which reorders the weight into its blocked (AMX or
AVX512_BF16) layout on every call: for SmolLM2-135M that is a second pass over every weight a
step. Reordered once at load (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's
freezing does for constant weights), the same matmuls ran 1.5-1.8x faster at 1 to 256 rows on
an AMX CPU (docs/engine-profile.md).

Where oneDNN runs bf16 natively (`supported`) `F.linear` takes the same kernels, less the
reorder. Elsewhere (AVX2-only CPUs) bf16 matmuls are emulated: over SmolLM2's 3,072 x 576
weight one row costs less in bf16 than in fp32, but 16 rows cost 2.2x and 128 rows 6.8x the
fp32 matmul. There a `Bf16Linear` keeps its bf16-valued weights in fp32, packed for oneDNN's
fp32 kernels alike (on an AVX2-only AMD EPYC 1.5x faster than `F.linear`'s MKL at one row, 2.2x
at 16), and multiplies bf16 rows upcast: the same sums, with fp32 accumulation, as a native
bf16 matmul. A bf16 engine's plain steps at batch 1 are then about 2x dearer there, its
verifies, batches, drafts and prefills 2-5x cheaper (docs/engine-profile.md).

A packed weight is oneDNN's opaque tensor (layout torch._mkldnn, shape [N, K]): plain ops
refuse it; `linear` multiplies by it and `to_dense()` reads it back. inductor cannot lower
oneDNN's linear over a weight that is a graph input (the compiled layers take every weight as
one), so compiled code calls it as the opaque op `dcoco::packed_linear`.
"""

import functools

import torch
import torch.nn.functional as F
from torch import nn

# The row count oneDNN picks the packed layout for; the layout served 1 to 256 rows alike.
PACK_ROWS = 16


@functools.cache
def supported() -> bool:
    """Whether this CPU and torch build run bf16 matmuls in oneDNN natively."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 or fp32, contiguous -> the same weights in oneDNN's layout, for `linear`
    only."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)  # [N, K]


@torch.library.custom_op("dcoco::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] of x's dtype from `pack` -> [..., N]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")  # [..., N]


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))  # [..., N]


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., K], weight [N, K] of x's dtype from `pack` -> [..., N]."""
    if torch.compiler.is_compiling():
        return packed_linear(x, weight)  # [..., N]
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")  # [..., N]


class Bf16Linear(nn.Module):
    """An inference-only bias-free linear with bf16 activations: its weights packed for oneDNN,
    in bf16 where `supported`, elsewhere in fp32 (the same bf16 values), where rows are
    upcast. Unpacked where torch has no oneDNN."""

    weight: torch.Tensor  # [N, K] bf16, or fp32 where self.fp32; packed where self.packed

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.fp32 = not supported()
        self.packed = torch.backends.mkldnn.is_available()
        plain = weight.detach().bfloat16().contiguous()  # [N, K]
        if self.fp32:
            plain = plain.float()  # [N, K]
        self.register_buffer("weight", pack(plain) if self.packed else plain)  # [N, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.float() if self.fp32 else x  # [..., K]
        out = linear(rows, self.weight) if self.packed else F.linear(rows, self.weight)  # [..., N]
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
