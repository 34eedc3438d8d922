"""Per-sequence key/value storage: one row per KV slot, indexed by absolute position.

Rolling back rejected tokens costs nothing: a sequence's `num_cached` is the only truth, stale
entries past it are masked out and overwritten by the next write. The last position is a
scratch cell where padded tokens write; it is never visible to a real query.

A forward's rows usually hold consecutive slots (the scheduler keeps running sequences so),
and a read is then a view of the cache, with no copy: SDPA reads the strided slice as fast as
a contiguous copy, and skipping the copy made steps 1.0-1.2x faster (int4, bf16 and fp32, AMX
Xeon). Rows that do not (a draft for some of the running sequences only) are gathered.
"""

import math
import mmap
from dataclasses import dataclass

import torch

from dcoco.engine.scheduler import Move
from dcoco.model import flex
from dcoco.model.layers import AttentionMask, KVSource
from dcoco.shared.errors import UsageError


@dataclass(frozen=True)
class CacheView:
    """Where one batched forward writes and what each of its queries may read."""

    slots: torch.Tensor  # [N] KV slot of each row
    span: slice | None  # the same slots as a slice, when they are consecutive
    positions: torch.Tensor  # [N, T] absolute position of each token (scratch for padding)
    mask: AttentionMask  # [N, 1, T, L] bool, key j visible to query t; or a row mask
    length: int  # L, keys read per row

    @classmethod
    def build(
        cls, slots: list[int], positions: torch.Tensor, limits: torch.Tensor, length: int
    ) -> "CacheView":
        """limits [N, T]: the last key position each query may see, all below `length`."""
        keys = torch.arange(length)  # [L]
        mask = (keys.view(1, 1, length) <= limits.unsqueeze(-1)).unsqueeze(1)  # [N, 1, T, L]
        first = slots[0]
        consecutive = slots == list(range(first, first + len(slots)))
        span = slice(first, first + len(slots)) if consecutive else None
        return cls(torch.tensor(slots), span, positions, mask, length)


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Zeros whose memory the kernel commits page by page as it is written: an anonymous
    mapping reads as zeros without holding memory. A cache sized for every slot at full
    context (SmolLM2: 33 x 8,192 positions, 6 GB in bf16) then holds what its sequences wrote,
    not its size; reading a page never written (the masked keys past a shorter row's end)
    maps the kernel's shared zero page rather than a page of its own."""
    count = math.prod(shape)
    size, flags = max(count * dtype.itemsize, 1), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    pages = mmap.mmap(-1, size, flags=flags)  # zero-filled by the kernel
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (num_layers, num_slots, kv_heads, capacity, head_dim)
        try:
            self.k = lazy_zeros(shape, dtype)  # [layers, S, Hkv, C, D]
            self.v = lazy_zeros(shape, dtype)  # [layers, S, Hkv, C, D]
        except OSError as failure:
            size = 2 * math.prod(shape) * dtype.itemsize / 1e9
            raise UsageError(
                f"the KV cache for {num_slots} sequences of {capacity} positions ({size:.1f} GB "
                f"of address space) cannot be reserved ({failure.strerror}): lower the batch "
                "size or the context length (DCOCO_MAX_BATCH_SIZE, DCOCO_MAX_MODEL_LEN)"
            ) from failure
        self.scratch = capacity - 1

    def write(self, layer: int, view: CacheView, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [N, Hkv, T, D] stored at view.positions of view.slots."""
        rows = view.slots.unsqueeze(1)  # [N, 1]
        dtype = self.k.dtype  # the attention's, which may be wider than the activations'
        self.k[layer][rows, :, view.positions] = k.transpose(1, 2).to(dtype)  # [N, T, Hkv, D]
        self.v[layer][rows, :, view.positions] = v.transpose(1, 2).to(dtype)  # [N, T, Hkv, D]

    def own_rows(self, slots: list[int], positions: torch.Tensor) -> CacheView:
        """A decoding view (positions [N, 1]) whose rows each read only their own keys
        (`model/flex.py`): attention then reads the whole cache, [S, Hkv, C, D]."""
        index = torch.tensor(slots)  # [N]
        _, num_slots, _, capacity, _ = self.k.shape
        mask = flex.row_mask(index, positions[:, 0], num_slots, capacity)
        return CacheView(index, None, positions, mask, capacity)

    def read(self, layer: int, view: CacheView) -> tuple[torch.Tensor, torch.Tensor]:
        """The first view.length positions of view.slots: [N, Hkv, L, D] each; the whole
        layer [S, Hkv, C, D] for a view of rows that read their own keys."""
        if isinstance(view.mask, flex.RowMask):
            return self.k[layer], self.v[layer]  # [S, Hkv, C, D] each, views
        if view.span is None:
            k = self.k[layer, :, :, : view.length].index_select(0, view.slots)  # [N, Hkv, L, D]
            v = self.v[layer, :, :, : view.length].index_select(0, view.slots)  # [N, Hkv, L, D]
            return k, v
        k = self.k[layer, view.span, :, : view.length]  # [N, Hkv, L, D], a view
        v = self.v[layer, view.span, :, : view.length]  # [N, Hkv, L, D], a view
        return k, v

    def move(self, moves: list[Move]) -> None:
        """Copies each moved sequence's cached positions to its new slot."""
        for m in moves:
            self.k[:, m.target, :, : m.length] = self.k[:, m.source, :, : m.length]
            self.v[:, m.target, :, : m.length] = self.v[:, m.source, :, : m.length]

    def source(self, view: CacheView) -> KVSource:
        """A KV source that stores a layer's new keys and values, then reads the row back."""

        def update(
            layer: int, k: torch.Tensor, v: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            self.write(layer, view, k, v)
            return self.read(layer, view)

        return update
