import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from dcoco import precision
from dcoco.model.causal_lm import CausalLM
from dcoco.spec.drafter import DFlashDrafter
from factories import distill, make_drafter, make_target
from stack import RedisServer


@pytest.fixture(scope="session", autouse=True)
def precision_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`auto` precision caches its measurements: one fresh cache per test session (servers the
    tests start inherit it), so no test reads what an earlier run on this machine measured."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DCOCO_CACHE_DIR", str(tmp_path_factory.mktemp("dcoco-cache")))
    yield
    mp.undo()


@pytest.fixture
def any_load() -> Iterator[None]:
    """Caches every measurement however busy the machine: the tests that use it are about
    what is cached and read back, not about when a measurement is trusted."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "QUIET_SHARE", math.inf)
        yield


@pytest.fixture(scope="session", params=["qwen3", "llama"])
def pair(request: pytest.FixtureRequest) -> tuple[CausalLM, DFlashDrafter]:
    """A random target of each family with a distilled (always Qwen3) drafter whose corrector
    has random, non-zero scores."""
    target = make_target(family=request.param)
    drafter = distill(target, make_drafter(target, trained_delta=False))
    with torch.no_grad():
        assert drafter.corrector is not None
        drafter.corrector.delta_out.weight.normal_(
            0.0, 1.0, generator=torch.Generator().manual_seed(3)
        )
    return target, drafter


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, one per test module."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()
