"""The engine's KV cache holds memory for what its sequences wrote, not for its size."""

import mmap
from pathlib import Path

import pytest
import torch

from dcoco.engine.engine import Engine
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.errors import UsageError
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from factories import make_target


def resident_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def test_a_cache_sized_for_every_slot_at_full_context_holds_only_what_was_written() -> None:
    target = make_target(vocab=64, hidden=64, layers=4)
    cfg = EngineConfig(
        mode=Mode.VANILLA, max_batch_size=64, max_model_len=4096, precision=Precision.FP32
    )
    before = resident_bytes()
    engine = Engine(target, None, cfg)
    cache = engine.runner.target_cache
    size = 2 * cache.k.numel() * cache.k.element_size()  # keys and values: 0.27 GB here
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=8))
    engine.add_request("b", list(range(1, 40)), SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        engine.step()
    grown = resident_bytes() - before
    assert size > 250e6
    assert grown < size / 8, (grown, size)
    assert torch.count_nonzero(cache.k[:, :, :, :47]) > 0  # the sequences' 39 + 8 positions
    assert torch.count_nonzero(cache.k[:, :, :, 47 : cache.scratch]) == 0  # never written: zeros


def test_a_cache_the_system_cannot_reserve_fails_start_with_one_line_naming_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object, **__: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(mmap, "mmap", refuse)
    cfg = EngineConfig(mode=Mode.VANILLA, max_batch_size=4, max_model_len=64)
    with pytest.raises(UsageError, match="DCOCO_MAX_BATCH_SIZE, DCOCO_MAX_MODEL_LEN") as raised:
        Engine(make_target(vocab=64), None, cfg)
    assert "5 sequences of" in str(raised.value)  # the batch and the swap slot
    assert "Cannot allocate memory" in str(raised.value)
