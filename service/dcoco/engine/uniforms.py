"""Randomness keyed by output position: the uniform a request samples its n-th output token
with is a function of the request's key and n alone (numpy's counter-based Philox generator).
The key is the request's seed, or one drawn at admission when it has none.

With the verification rule in `spec/verify.py`, a sampled request's output then depends on its
key alone: not on what shares its batch, on how many drafted tokens a cycle verified, or on
whether it was speculated at all. A seeded request replays exactly on any worker, and the
adaptive planner may verify any prefix of a seeded request's draft.
"""

import numpy as np
import torch

SEEDED, DRAWN = 0, 1  # the key's high word: a seed and a drawn key never share a stream
WORDS = 4  # Philox yields four 64-bit words per counter value; a position uses the first
BITS = 24  # a float32 uniform holds 24 random bits, as torch.rand's do


def request_key(seed: int | None, generator: torch.Generator) -> int:
    """A 128-bit Philox key: the seed (any int64, taken mod 2**64), else a draw."""
    if seed is not None:
        return (SEEDED << 64) | (seed % 2**64)
    drawn = int(torch.randint(0, 2**63 - 1, (1,), generator=generator))
    return (DRAWN << 64) | drawn


def position_uniforms(key: int, start: int, width: int) -> torch.Tensor:
    """Uniforms in [0, 1) for output positions start..start+width-1: [width] float32."""
    words = np.random.Philox(key=key, counter=start).random_raw(WORDS * width)[::WORDS]  # [width]
    return torch.from_numpy((words >> (64 - BITS)).astype(np.float32) * np.float32(2.0**-BITS))
