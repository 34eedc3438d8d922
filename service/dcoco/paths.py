"""Where the embedded default model pair lives: `models/default` at the repository root.

`make train-default` (`dcoco train`) writes it; `dcoco generate`, `dcoco eval` and `make serve`
read it when no other model is named.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = REPO_ROOT / "models" / "default"
DEFAULT_TARGET = DEFAULT_MODELS / "target"
DEFAULT_DFLASH = DEFAULT_MODELS / "dflash"
DEFAULT_DCOCO = DEFAULT_MODELS / "dcoco"
DEFAULT_DCOCO_FROZEN = DEFAULT_MODELS / "dcoco-frozen"
DEFAULT_HELDOUT = DEFAULT_MODELS / "heldout"
