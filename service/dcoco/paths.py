"""Where the embedded model pairs live, under `models/` at the repository root.

- `models/smollm2`: the default, SmolLM2-135M-Instruct (converted at setup into the git-ignored
  `target/`) with our drafters for it (`make train-smollm2`), served as `dcoco-smollm2`.
- `models/tiny`: a 4.2M-parameter Qwen3 pair trained from scratch (`make train-tiny`), served as
  `dcoco-tiny`: the fast fixture for tests, and a second model a worker can serve.

`dcoco generate`, `dcoco eval`, `dcoco worker` and `make serve` use the default when no model
is named.
"""

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
