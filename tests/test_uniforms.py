"""Uniforms keyed by output position: the same position of the same key always gets the same
uniform, however the positions are grouped into draws."""

import torch
from scipy.stats import kstest

from dcoco.engine.uniforms import position_uniforms, request_key


def test_a_position_s_uniform_does_not_depend_on_how_it_is_drawn() -> None:
    key = request_key(7, torch.Generator())
    whole = position_uniforms(key, 0, 20)  # [20]
    parts = torch.cat([position_uniforms(key, 0, 1), position_uniforms(key, 1, 15)])  # [16]
    parts = torch.cat([parts, position_uniforms(key, 16, 4)])  # [20]
    assert torch.equal(whole, parts)
    assert whole.dtype == torch.float32


def test_keys_separate_requests_and_seeds_ignore_the_engine_s_generator() -> None:
    one, other = torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)
    assert request_key(7, one) == request_key(7, other)
    assert request_key(-7, one) != request_key(7, one)  # any int64 seed is a key of its own
    drawn = {request_key(None, one) for _ in range(100)}
    assert len(drawn) == 100
    assert request_key(None, other) not in drawn
    first = position_uniforms(request_key(7, one), 0, 8)
    assert not torch.equal(first, position_uniforms(request_key(8, one), 0, 8))


def test_the_uniforms_are_uniform() -> None:
    values = position_uniforms(request_key(3, torch.Generator()), 0, 20_000)  # [20000]
    assert float(values.min()) >= 0.0
    assert float(values.max()) < 1.0
    assert kstest(values.double().numpy(), "uniform").pvalue > 1e-3
