"""Where the embedded model pairs live, under `models/` at the repository root.

- `models/default`: the 4.2M-parameter Qwen3 pair trained from scratch (`make train-default`);
  the fast fixture for tests, and a second model a worker can serve.
- `models/smollm2`: SmolLM2-135M-Instruct (converted at setup into the git-ignored `target/`)
  with our drafters for it (`make train-smollm2`).
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = REPO_ROOT / "models" / "default"
DEFAULT_TARGET = DEFAULT_MODELS / "target"
DEFAULT_DFLASH = DEFAULT_MODELS / "dflash"
DEFAULT_DCOCO = DEFAULT_MODELS / "dcoco"
DEFAULT_DCOCO_FROZEN = DEFAULT_MODELS / "dcoco-frozen"
DEFAULT_HELDOUT = DEFAULT_MODELS / "heldout"

SMOLLM2_MODELS = REPO_ROOT / "models" / "smollm2"
SMOLLM2_TARGET = SMOLLM2_MODELS / "target"
