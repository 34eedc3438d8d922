"""Attention that reads each row's own context: the same output as masked SDPA over every
row's keys up to the longest, and a clear refusal of shapes it does not cover."""

import pytest
import torch
import torch.nn.functional as F

from dcoco.model import flex


def test_each_row_reading_its_own_blocks_attends_as_masked_sdpa() -> None:
    torch.manual_seed(0)
    rows, length = 6, flex.padded_length(300)
    limits = torch.tensor([[3], [130], [299], [0], [127], [128]])  # [N, 1]: block edges too
    q = torch.randn(rows, 6, 1, 16)  # [N, Hq, T, D]
    k, v = torch.randn(2, rows, 2, length, 16)  # [N, Hkv, L, D] each
    k[0, :, 5:] = float("nan")  # stale keys past a row's limit, in the block it reads
    v[0, :, flex.BLOCK :] = float("nan")  # and values in blocks it never reads
    visible = torch.arange(length).view(1, 1, 1, length) <= limits.view(rows, 1, 1, 1)
    expected = F.scaled_dot_product_attention(
        q, k.nan_to_num(), v.nan_to_num(), attn_mask=visible, enable_gqa=True
    )
    got = flex.attend(q, k, v, flex.row_mask(limits, length))  # [N, Hq, 1, D]
    assert torch.allclose(got, expected, atol=1e-5)
    assert not got.isnan().any()


@pytest.mark.parametrize(("width", "length"), [(flex.BLOCK + 1, flex.BLOCK), (1, 200)])
def test_shapes_outside_whole_blocks_are_refused(width: int, length: int) -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        flex.row_mask(torch.zeros(2, width, dtype=torch.long), length)
