"""Writing drafter folders that vLLM loads with `method: "dflash"`.

A DCOCO folder is a DFlash folder (config.json, model.safetensors with `layers.N.*`, `fc`,
`hidden_norm`, `norm`, optional mask_embedding.pt) whose config names exactly one architecture,
`DCOCODraftModel`, and adds:

- `dcoco_config`: the corrector's geometry (`top_k`, `rep_dim`, `pair_dim`, `mlp_dim`); its
  weights are the `corrector.*` tensors beside the DFlash ones;
- `dcoco_selection`: how vLLM picks the draft (`top_k` <= the trained K, `rule`, `gamma`),
  because vLLM's speculative config takes no extra fields.

The plain-DFlash format drops both and the corrector weights: the same drafter for stock vLLM.
Reading goes through `dcoco.checkpoint`, so a malformed source fails as CheckpointError.
"""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from dcoco.checkpoint import CheckpointError, load_drafter, save_drafter
from dcoco.shared.options import Rule
from dcoco.spec.drafter import DFlashDrafter


@dataclass(frozen=True)
class ExportOptions:
    format: str = "dcoco"  # "dcoco" or "dflash"
    top_k: int | None = None  # None: the corrector's trained K
    rule: Rule = Rule.PREFIX
    gamma: float = 0.5

    def __post_init__(self) -> None:
        if self.format not in ("dcoco", "dflash"):
            raise ValueError(f"format must be dcoco or dflash, got {self.format!r}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {self.top_k}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")


def export_drafter(
    source: Path, out: Path, options: ExportOptions, overwrite: bool = False
) -> None:
    """Raises CheckpointError for a bad source and ValueError for options it cannot honour."""
    drafter = load_drafter(source)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{out} exists and is not empty")
    if out.resolve() == source.resolve():
        raise ValueError("the output folder is the source folder")
    if options.format == "dflash":
        _write_plain(drafter, out)
        return
    corrector = drafter.config.corrector
    if corrector is None:
        raise CheckpointError(f"{source}: a DFlash drafter has no corrector to export as DCOCO")
    top_k = options.top_k or corrector.top_k
    if top_k > corrector.top_k:
        raise ValueError(
            f"top_k {top_k} exceeds the {corrector.top_k} the corrector was trained on"
        )
    if drafter.config.block_size < 2:
        raise ValueError("DCOCO needs a block of at least 2 slots")
    _clear(out)
    save_drafter(drafter, out)
    config_file = out / "config.json"
    raw = json.loads(config_file.read_text())
    raw["dcoco_selection"] = {"top_k": top_k, "rule": str(options.rule), "gamma": options.gamma}
    config_file.write_text(json.dumps(raw, indent=2) + "\n")


def _write_plain(drafter: DFlashDrafter, out: Path) -> None:
    plain = DFlashDrafter(drafter.config.without_corrector())
    state = {k: v for k, v in drafter.state_dict().items() if not k.startswith("corrector.")}
    plain.load_state_dict(state)
    plain.mask_embedding = drafter.mask_embedding
    _clear(out)
    save_drafter(plain, out)


def _clear(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
