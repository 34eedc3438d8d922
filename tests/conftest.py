import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from dcoco.model.qwen3 import Qwen3ForCausalLM
from dcoco.spec.drafter import DFlashDrafter
from factories import distill, make_drafter, make_target


@pytest.fixture(scope="session")
def pair() -> tuple[Qwen3ForCausalLM, DFlashDrafter]:
    """A random target with a distilled drafter whose corrector has random, non-zero scores."""
    target = make_target()
    drafter = distill(target, make_drafter(target, trained_delta=False))
    with torch.no_grad():
        assert drafter.corrector is not None
        drafter.corrector.delta_out.weight.normal_(
            0.0, 1.0, generator=torch.Generator().manual_seed(3)
        )
    return target, drafter
