"""Attention that reads each row's own context: the same output as masked SDPA over every
row's keys up to the longest, and a clear refusal of a cache it does not cover."""

import pytest
import torch
import torch.nn.functional as F

from dcoco.model import flex


def test_each_row_reading_its_own_blocks_attends_as_masked_sdpa() -> None:
    torch.manual_seed(0)
    slots, capacity = torch.tensor([4, 0, 2, 5, 1]), 3 * flex.BLOCK
    limits = torch.tensor([3, 130, 299, 127, 128])  # [N]: block edges too
    q = torch.randn(5, 6, 1, 16)  # [N, Hq, 1, D]
    k, v = torch.randn(2, 7, 2, capacity, 16)  # [S, Hkv, C, D] each: every slot of a cache
    k[4, :, 5:] = float("nan")  # stale keys past a row's limit, in the block it reads
    v[4, :, flex.BLOCK :] = float("nan")  # and values in blocks it never reads
    v[3] = float("nan")  # a slot no row decodes in
    keys, values = k[slots].nan_to_num(), v[slots].nan_to_num()  # [N, Hkv, C, D] each
    visible = torch.arange(capacity).view(1, 1, 1, -1) <= limits.view(5, 1, 1, 1)
    expected = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, enable_gqa=True)
    got = flex.attend(q, k, v, flex.row_mask(slots, limits, 7, capacity))  # [N, Hq, 1, D]
    assert torch.allclose(got, expected, atol=1e-5)
    assert not got.isnan().any()


def test_a_cache_outside_whole_blocks_is_refused() -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        flex.row_mask(torch.tensor([0]), torch.tensor([3]), 2, flex.BLOCK + 1)
