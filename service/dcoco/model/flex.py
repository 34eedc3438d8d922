"""Attention over cached keys that reads each row's own context only (torch's FlexAttention).

SDPA over a batch reads every row's keys up to the longest row's, masked. Where the rows'
lengths differ widely (the long run's distiller: 128 rows of 60 to 770 positions) most of what
it reads is masked: at batch 128 attention took 38% of a decoding step. FlexAttention skips
every block of `BLOCK` keys that a row's mask leaves empty, so a row reads its own context
rounded up to a block.

The kernel runs over the whole cache, every slot and every position, so that its shapes never
change: inductor compiles it once per model (about 7 s on 2 cores), where shapes that vary
would need its dynamic-shape code, which failed to compile for some of them (torch 2.13).
Slots that decode nothing read no block. It runs in fp32: in bf16 it was slower than fp32
SDPA on an AVX512_BF16 CPU without AMX.
"""

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128  # keys per block
_flex = torch.compile(flex_attention, dynamic=False)


@dataclass(frozen=True)
class RowMask:
    """Which cache slots the rows decode in, and the blocks of keys each slot reads."""

    slots: torch.Tensor  # [N] the rows' slots
    blocks: BlockMask  # over every slot of the cache, one query each


def padded_length(length: int) -> int:
    """`length` rounded up to whole blocks."""
    return -(-length // BLOCK) * BLOCK


def row_mask(slots: torch.Tensor, limits: torch.Tensor, num_slots: int, capacity: int) -> RowMask:
    """slots, limits [N]: each row's slot and the last key position its query sees; the
    cache holds `num_slots` slots of `capacity` positions, a multiple of BLOCK."""
    if capacity % BLOCK:
        raise ValueError(f"a row mask needs whole blocks of {BLOCK} keys, not {capacity}")
    last = torch.full((num_slots,), -1, dtype=limits.dtype)  # [S]; -1: reads nothing
    last[slots] = limits

    def visible(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return kv <= last[b]

    blocks = capacity // BLOCK
    counts = ((last + BLOCK) // BLOCK).to(torch.int32).view(num_slots, 1, 1)  # [S, 1, 1]
    order = torch.arange(blocks, dtype=torch.int32).expand(num_slots, 1, 1, blocks)  # [S, 1, 1, KB]
    mask = BlockMask.from_kv_blocks(
        counts,
        order.contiguous(),
        BLOCK_SIZE=BLOCK,
        mask_mod=visible,
        seq_lengths=(1, capacity),
    )
    return RowMask(slots, mask)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: RowMask) -> torch.Tensor:
    """q [N, Hq, 1, D], the whole cache's k and v [S, Hkv, C, D], one float dtype ->
    [N, Hq, 1, D]."""
    every = q.new_zeros(k.shape[0], *q.shape[1:])  # [S, Hq, 1, D]
    every[mask.slots] = q
    out = _flex(every, k, v, block_mask=mask.blocks, enable_gqa=True)  # [S, Hq, 1, D]
    assert isinstance(out, torch.Tensor)
    return out[mask.slots]  # [N, Hq, 1, D]
