"""Weight-only quantized linears for the engine, on torch's own CPU kernels.

- int8: one scale per output channel (`torch._weight_int8pack_mm`).
- int4: asymmetric, a scale and a minimum per group of 32 input channels
  (`torch._weight_int4pack_mm_for_cpu`). That is GGUF's Q4_1 layout, the one SmolLM2's linears
  ship in: their dequantized weights sit on this grid, so requantizing recovers the shipped
  4-bit values; only the group's scale and minimum are rounded to bf16.
- w4a8: the same 4-bit grid (scale and minimum in fp16, as Q4_1 holds them), multiplied by
  activations quantized to 8 bits per group of 32 (a scale per group, round to nearest), summed
  as integers: the arithmetic of llama.cpp's Q4_1 kernel, on our own (`w4a8_kernel.py`).

Activations stay bf16 between the linears: torch's kernels are fast only there (int4 with fp32
activations runs 17x slower). The LM head is int8 in every mode (it ships as Q8_0); the
embedding it may be tied to stays as it was, since lookups need whole rows.

The kernels are built for a few rows: from `dense_from` rows on (prefills, wide
verifications) matmuls over the same weights, dequantized, are faster, so each linear also
keeps them dequantized (a `Bf16Linear`: bf16 packed for oneDNN where it runs bf16 natively,
fp16 for fbgemm or fp32 for oneDNN where bf16 is emulated) and switches. Decoding reads only
the quantized bytes; memory holds both. Where the switch pays depends on the CPU (with AMX a
16-row bf16 matmul costs what a 1-row one does) and on the kernel: engines measure it
(`precision.dense_crossover`); DENSE_FROM is the default until then.
"""

import torch
from torch import nn

from dcoco.model.packed import Bf16Linear
from dcoco.model.w4a8_kernel import unavailable

GROUP = 32  # int4 input channels per scale: Q4_1's block
DENSE_FROM = 17  # rows from which a forward multiplies the dequantized bf16 weights, unmeasured
TINY = 1e-12  # the smallest scale: an all-zero row or group quantizes to zeros


class QuantizedLinear(nn.Module):
    """A quantized linear: its own kernel below `dense_from` rows, from there on the dense copy
    of its weights (`dense`, set by each kind with `dense_from`)."""

    dense: Bf16Linear  # the same weights dequantized
    dense_from: int

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        """flat [M, K] bf16 -> [M, N], on the quantized weights."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K] bf16
        if flat.shape[0] >= self.dense_from:
            return self.dense(x)  # [..., N]
        out = self.kernel(flat)  # [M, N]
        return out.view(*x.shape[:-1], out.shape[-1])  # [..., N]


class Int8Linear(QuantizedLinear):
    weight: torch.Tensor  # [N, K] int8
    scale: torch.Tensor  # [N] bf16

    def __init__(self, weight: torch.Tensor) -> None:
        """weight [N, K] in any float dtype."""
        super().__init__()
        w = weight.detach().float()  # [N, K]
        scale = w.abs().amax(1).clamp(min=TINY) / 127  # [N]
        self.register_buffer("weight", (w / scale[:, None]).round().to(torch.int8))  # [N, K]
        self.register_buffer("scale", scale.bfloat16())  # [N]
        self.dense = Bf16Linear(self.weight * self.scale[:, None])  # [N, K]
        self.dense_from = DENSE_FROM

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(flat, self.weight, self.scale)  # [M, N]


def four_bit_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [N, K], K a multiple of GROUP -> levels [N, K/32, 32] in 0..15 (float), and each
    group's scale and minimum [N, K/32]: weight ~ levels * scale + minimum."""
    n, k = weight.shape
    if k % GROUP:
        raise ValueError(f"4-bit weights need input widths divisible by {GROUP}; this one is {k}")
    groups = weight.detach().float().view(n, k // GROUP, GROUP)  # [N, G, 32]
    low, high = groups.amin(-1), groups.amax(-1)  # [N, G] each
    scale = ((high - low) / 15).clamp(min=TINY)  # [N, G]
    levels = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)  # [N, G, 32]
    return levels, scale, low


class Int4Linear(QuantizedLinear):
    packed: torch.Tensor  # [N, K/2] uint8, the kernel's layout
    scale_zero: torch.Tensor  # [K/32, N, 2] bf16

    def __init__(self, weight: torch.Tensor) -> None:
        """weight [N, K] in any float dtype, K a multiple of GROUP."""
        super().__init__()
        n, k = weight.shape
        levels, scale, low = four_bit_grid(weight)  # [N, G, 32], [N, G], [N, G]
        self.register_buffer(
            "packed",
            torch._convert_weight_to_int4pack_for_cpu(levels.to(torch.int32).view(n, k), 1),
        )  # [N, K/2] uint8
        # The kernel computes (level - 8) * scale + zero, so zero = low + 8 * scale.
        scale_zero = torch.stack([scale, low + 8 * scale], dim=-1)  # [N, G, 2]
        self.register_buffer(
            "scale_zero", scale_zero.transpose(0, 1).contiguous().bfloat16()
        )  # [G, N, 2]
        scale, zero = self.scale_zero.float().transpose(0, 1).unbind(-1)  # [N, G] each
        dense = (levels - 8) * scale[..., None] + zero[..., None]  # [N, G, 32]
        self.dense = Bf16Linear(dense.view(n, k))  # [N, K]
        self.dense_from = DENSE_FROM

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(
            flat, self.packed, GROUP, self.scale_zero
        )  # [M, N]


class W4A8Linear(QuantizedLinear):
    weight: torch.Tensor  # [N, K/32 * 20] uint8: per group, scale and minimum (fp16), 16 bytes

    def __init__(self, weight: torch.Tensor) -> None:
        """weight [N, K] in any float dtype, K a multiple of GROUP. Raises ValueError where the
        kernel cannot run here (`w4a8_kernel.unavailable`)."""
        super().__init__()
        why = unavailable()
        if why is not None:
            raise ValueError(why)
        n, k = weight.shape
        levels, scale, low = four_bit_grid(weight)  # [N, G, 32], [N, G], [N, G]
        scale_low = torch.stack([scale, low], dim=-1).half()  # [N, G, 2]
        if not scale_low.isfinite().all():
            raise ValueError("w4a8 holds each group's scale and minimum in fp16; these overflow")
        nibbles = levels.to(torch.uint8)  # [N, G, 32]
        packed = nibbles[..., :16] | (nibbles[..., 16:] << 4)  # [N, G, 16]
        groups = torch.cat([scale_low.view(torch.uint8), packed], dim=-1)  # [N, G, 20]
        self.register_buffer("weight", groups.view(n, -1).contiguous())  # [N, G * 20]
        scale, low = scale_low.float().unbind(-1)  # [N, G] each
        self.dense = Bf16Linear((levels * scale[..., None] + low[..., None]).view(n, k))  # [N, K]
        self.dense_from = DENSE_FROM

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.dcoco.w4a8_linear(flat, self.weight)  # [M, N]


def quantize_linears(module: nn.Module, kind: type[QuantizedLinear]) -> None:
    """Replaces every nn.Linear under `module` (in place) by a `kind` of its weight."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            if child.bias is not None:
                raise ValueError(f"{name}: quantized linears carry no bias")
            setattr(module, name, kind(child.weight))
        else:
            quantize_linears(child, kind)


def quantized_linears(module: nn.Module) -> list[QuantizedLinear]:
    return [m for m in module.modules() if isinstance(m, QuantizedLinear)]
