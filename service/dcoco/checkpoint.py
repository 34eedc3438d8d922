"""Reading and writing model folders: a Hugging Face Qwen3 or Llama target and a vLLM-format
drafter.

Every problem with a folder (missing file, bad JSON, unsupported config, missing or misshapen
weights) raises CheckpointError naming the file and the problem.
"""

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from dcoco.model.causal_lm import CausalLM
from dcoco.model.layers import TransformerConfig
from dcoco.spec.drafter import DFlashDrafter, DrafterConfig

MASK_EMBEDDING_FILE = "mask_embedding.pt"


class CheckpointError(ValueError):
    pass


def load_target(path: str | Path) -> CausalLM:
    folder = Path(path)
    raw = read_config(folder)
    try:
        config = TransformerConfig.from_hf(raw)
    except ValueError as bad:
        raise CheckpointError(f"{folder / 'config.json'}: {bad}") from None
    if raw.get("architectures", [config.architecture]) != [config.architecture]:
        raise CheckpointError(
            f"{folder}: architectures {raw['architectures']} is not [{config.architecture!r}]"
        )
    model = CausalLM(config)
    state = _read_weights(folder)
    if model.config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state.get("model.embed_tokens.weight", torch.empty(0)))
    _load_state(model, state, folder)
    return model.eval()


def save_target(model: CausalLM, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    """Writes config.json and model.safetensors; `extra` adds config fields such as eos_token_id."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    raw = model.config.to_hf() | {"architectures": [model.config.architecture]} | (extra or {})
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))


def load_drafter(path: str | Path) -> DFlashDrafter:
    folder = Path(path)
    raw = read_config(folder)
    try:
        cfg = DrafterConfig.from_hf(raw)
    except ValueError as bad:
        raise CheckpointError(f"{folder / 'config.json'}: {bad}") from None
    drafter = DFlashDrafter(cfg)
    _load_state(drafter, _read_weights(folder), folder)
    if drafter.vocab_ids is not None:
        check_vocab_ids(drafter.vocab_ids, cfg.model.vocab_size, folder)
    mask_file = folder / MASK_EMBEDDING_FILE
    if mask_file.exists():
        drafter.mask_embedding = _read_mask_embedding(mask_file, cfg)
    return drafter.eval()


def check_vocab_ids(ids: torch.Tensor, vocab_size: int, folder: Path) -> None:
    """Refuses a drafting vocabulary ids [V'] that is not V' distinct tokens of the target's."""
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size or len(ids.unique()) < len(ids):
        raise CheckpointError(
            f"{folder}: d2t maps columns outside the vocabulary, or two to one token"
        )


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> None:
    """Writes the vLLM DFlash layout: config.json, model.safetensors with `layers.N.*`, `fc`,
    `hidden_norm`, `norm` (plus `corrector.*` for DCOCO), and mask_embedding.pt if learned."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(drafter.config.to_hf(), indent=2) + "\n")
    state = {k: v.contiguous() for k, v in drafter.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    if drafter.mask_embedding is not None:
        torch.save(
            {"mask_token_id": drafter.config.mask_token_id, "embedding": drafter.mask_embedding},
            folder / MASK_EMBEDDING_FILE,
        )


def read_config(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a directory")
    try:
        raw = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as bad:
        raise CheckpointError(f"{file}: not valid JSON ({bad})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return raw


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    file = folder / "model.safetensors"
    if not file.exists():
        sharded = (folder / "model.safetensors.index.json").exists()
        raise CheckpointError(
            f"{folder}: no model.safetensors"
            + (" (sharded checkpoints are not supported)" if sharded else "")
        )
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as bad:
        raise CheckpointError(f"{file}: unreadable ({bad})") from None


def _load_state(module: nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    expected = module.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{folder}: weights do not match the config"
            + (f"; missing {missing[:5]}" if missing else "")
            + (f"; unexpected {unexpected[:5]}" if unexpected else "")
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(
                f"{folder}: {name} has shape {tuple(tensor.shape)}, the config needs "
                f"{tuple(expected[name].shape)}"
            )
    floats = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}  # d2t: ids
    module.load_state_dict(floats)


def _read_mask_embedding(file: Path, cfg: DrafterConfig) -> torch.Tensor:
    try:
        raw = torch.load(file, weights_only=True)
    except (OSError, RuntimeError) as bad:
        raise CheckpointError(f"{file}: unreadable ({bad})") from None
    if isinstance(raw, dict):
        if raw.get("mask_token_id", cfg.mask_token_id) != cfg.mask_token_id:
            raise CheckpointError(f"{file}: mask_token_id differs from the config's")
        raw = raw.get("embedding")
    if not isinstance(raw, torch.Tensor) or raw.numel() != cfg.model.hidden_size:
        raise CheckpointError(f"{file}: expected {cfg.model.hidden_size} values")
    return raw.reshape(-1).float()
