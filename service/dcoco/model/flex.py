"""Attention over cached keys that reads each row's own context only (torch's FlexAttention).

SDPA over a batch reads every row's keys up to the longest row's, masked. Where the rows'
lengths differ widely (the long run's distiller: 128 rows of 60 to 770 positions) most of what
it reads is masked: at batch 128 attention took 38% of a decoding step. FlexAttention skips
every block of `BLOCK` keys that a row's mask leaves empty, so a row reads its own context
rounded up to a block. Its kernel is compiled by inductor once per query width (dynamic in
rows and keys, about 7 s the first time) and runs in fp32: in bf16 it was slower than fp32
SDPA on an AVX512_BF16 CPU without AMX.
"""

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

BLOCK = 128  # keys per block, and queries per block: a view's queries fit in one
_flex = torch.compile(flex_attention, dynamic=True)


def padded_length(length: int) -> int:
    """Keys a view spans: `length` rounded up to whole blocks."""
    return -(-length // BLOCK) * BLOCK


def row_mask(limits: torch.Tensor, length: int) -> BlockMask:
    """limits [N, T]: the last key each query sees, T <= BLOCK; length: keys the view spans,
    a multiple of BLOCK. Each row reads its blocks up to its last visible key."""
    rows, width = limits.shape
    if width > BLOCK or length % BLOCK:
        raise ValueError(f"a row mask needs at most {BLOCK} queries and whole blocks of keys")

    def visible(
        b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return kv <= limits[b, q]

    blocks = length // BLOCK
    counts = (limits.amax(1) // BLOCK + 1).to(torch.int32).view(rows, 1, 1)  # [N, 1, 1]
    order = torch.arange(blocks, dtype=torch.int32).expand(rows, 1, 1, blocks)  # [N, 1, 1, KB]
    return BlockMask.from_kv_blocks(
        counts,
        order.contiguous(),
        BLOCK_SIZE=BLOCK,
        mask_mod=visible,
        seq_lengths=(width, length),
    )


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask) -> torch.Tensor:
    """q [N, Hq, T, D], k and v [N, Hkv, L, D] in one float dtype -> [N, Hq, T, D]."""
    out = _flex(q, k, v, block_mask=mask, enable_gqa=True)  # [N, Hq, T, D]
    assert isinstance(out, torch.Tensor)
    return out
