"""From worker settings to vLLM engine arguments, and the drafter folder vLLM should load.

vLLM's speculative config takes no DCOCO fields, so what the settings change about drafting
(mode dflash on a DCOCO checkpoint, another rule, gamma or K) becomes a derived drafter folder
written by `export_drafter` into the client's scratch folder; an unchanged checkpoint is used
as it is.
"""

import dataclasses
import logging
from pathlib import Path
from typing import Any

from dcoco.checkpoint import CheckpointError, check_vocab_ids, read_config
from dcoco.settings import WorkerSettings
from dcoco.shared.options import Mode, Precision
from dcoco.spec.drafter import (
    DCOCO_ARCHITECTURE,
    DFLASH_ARCHITECTURE,
    DFlashDrafter,
    DrafterConfig,
    column_ids,
)
from dcoco.vllm.export import ExportOptions, export_drafter
from dcoco.vllm.runtime import SelectionConfig
from dcoco.vllm.spec_config import speculative_config

log = logging.getLogger(__name__)

# Engine arguments the worker derives from DCOCO_* settings; DCOCO_VLLM_ARGS may not set them.
OWNED = {
    "model": "DCOCO_TARGET",
    "tokenizer": "DCOCO_TARGET",
    "served_model_name": "DCOCO_MODEL_NAME",
    "speculative_config": "DCOCO_DRAFTER and DCOCO_MODE",
    "max_model_len": "DCOCO_MAX_MODEL_LEN",
    "max_num_seqs": "DCOCO_MAX_BATCH_SIZE",
}


def max_model_len(settings: WorkerSettings) -> int:
    limit = int(read_config(settings.target).get("max_position_embeddings", 4096))
    if settings.max_model_len is not None and settings.max_model_len > limit:
        raise ValueError(
            f"max_model_len {settings.max_model_len} exceeds the target's limit "
            f"(max_position_embeddings {limit})"
        )
    return settings.max_model_len or limit


def check_drafter(folder: Path) -> dict[str, Any]:
    """The drafter's config, after checking it and its weights' names and shapes against each
    other, and its drafting vocabulary (d2t), without loading another tensor; raises
    CheckpointError, so that a malformed folder is one line here rather than a failure deep
    inside vLLM's worker process."""
    import torch
    from safetensors import SafetensorError, safe_open

    raw = read_config(folder)
    try:
        cfg = DrafterConfig.from_hf(raw)
    except ValueError as bad:
        raise CheckpointError(f"{folder / 'config.json'}: {bad}") from None
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in DFlashDrafter(cfg).state_dict().items()}
    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
            found = {k: tuple(weights.get_slice(k).get_shape()) for k in weights.keys()}  # noqa: SIM118
            d2t = weights.get_tensor("d2t") if "d2t" in found else None  # [V'] or None
    except (SafetensorError, OSError) as bad:
        raise CheckpointError(f"{folder / 'model.safetensors'}: unreadable ({bad})") from None
    if found != expected:
        wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        raise CheckpointError(f"{folder}: weights do not match the config: {wrong[:4]}")
    if d2t is not None:
        check_vocab_ids(column_ids(d2t), cfg.model.vocab_size, folder)
    return raw


def prepare_drafter(settings: WorkerSettings, scratch: Path) -> tuple[Path, int] | None:
    """The drafter folder vLLM loads and B; None in vanilla mode."""
    if settings.mode is Mode.VANILLA:
        return None
    if settings.mode is Mode.NGRAM:
        raise ValueError(
            "DCOCO_MODE ngram is the torch engine's; the vllm engine runs dflash or dcoco"
        )
    if settings.drafter is None:
        raise ValueError(f"mode {settings.mode} needs a drafter folder (DCOCO_DRAFTER)")
    raw = check_drafter(settings.drafter)
    archs = raw.get("architectures")
    block = settings.num_speculative_tokens or int(raw.get("block_size") or 0)
    if block < 1:
        raise CheckpointError(f"{settings.drafter}: config.json has no block_size")
    if settings.mode is Mode.DFLASH:
        if archs == [DFLASH_ARCHITECTURE]:
            return settings.drafter, block
        folder = scratch / "dflash"
        export_drafter(settings.drafter, folder, ExportOptions(format="dflash"), overwrite=True)
        return folder, block
    if archs != [DCOCO_ARCHITECTURE]:
        raise ValueError(f"mode dcoco needs a {DCOCO_ARCHITECTURE} drafter, got {archs!r}")
    try:
        current = SelectionConfig.from_hf(raw)
    except ValueError as bad:
        raise CheckpointError(f"{settings.drafter / 'config.json'}: {bad}") from None
    wanted = SelectionConfig(settings.top_k or current.top_k, settings.rule, settings.gamma)
    if wanted == current:
        return settings.drafter, block
    folder = scratch / "dcoco"
    options = ExportOptions("dcoco", wanted.top_k, wanted.rule, wanted.gamma)
    export_drafter(settings.drafter, folder, options, overwrite=True)
    return folder, block


# The weight-only int8 and int4 precisions are the embedded engine's; vLLM quantizes through its
# own arguments.
DTYPES = {Precision.FP32: "float32", Precision.BF16: "bfloat16"}


def vllm_dtype(settings: WorkerSettings) -> str:
    """DCOCO_PRECISION as vLLM's dtype. auto is bf16 on a GPU; on a CPU it is fp32 or bf16,
    whichever the embedded engine's measured forwards favour here (bf16 is emulated, and far
    slower from a few rows on, where the CPU lacks AVX512_BF16)."""
    import torch

    from dcoco.checkpoint import load_target
    from dcoco.precision import WIDTHS, cost_table

    if settings.precision is Precision.AUTO:
        if torch.cuda.is_available():
            return DTYPES[Precision.BF16]
        target = load_target(settings.target)
        table = cost_table(target, WIDTHS, settings.cache_dir)
        chosen = table.fastest(among=(Precision.FP32, Precision.BF16))
        log.info("precision auto: vLLM runs %s, from forward seconds %s", chosen, table.seconds)
        return DTYPES[chosen]
    if settings.precision not in DTYPES:
        raise ValueError(
            f"DCOCO_PRECISION {settings.precision} is the torch engine's; with vLLM use "
            f"auto, fp32 or bf16 (and vLLM's quantization arguments in DCOCO_VLLM_ARGS)"
        )
    return DTYPES[settings.precision]


def engine_kwargs(settings: WorkerSettings, scratch: Path) -> dict[str, Any]:
    """AsyncEngineArgs fields: ours, then DCOCO_VLLM_ARGS; raises ValueError for a conflict or
    an argument vLLM does not have."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(settings.vllm_args) - known)
    if unknown:
        raise ValueError(f"DCOCO_VLLM_ARGS: vLLM has no engine argument {', '.join(unknown)}")
    clash = sorted(set(settings.vllm_args) & set(OWNED))
    if clash:
        raise ValueError(f"DCOCO_VLLM_ARGS may not set {clash[0]}; use {OWNED[clash[0]]} instead")
    dtype = vllm_dtype(settings)
    drafter = prepare_drafter(settings, scratch)
    kwargs: dict[str, Any] = {
        # DCOCO_PRECISION, never vLLM's "auto", which would run a float32 checkpoint in half
        # precision, so that greedy output is the target's own in fp32.
        "dtype": dtype,
        "model": str(settings.target),
        "tokenizer": str(settings.target),
        "served_model_name": settings.model_name,
        "max_model_len": max_model_len(settings),
        "max_num_seqs": settings.max_batch_size,
        "seed": 0,
        "disable_log_stats": False,  # the spec-decode counters come through the stat loggers
        "per_request_spec_decode_metrics": "summary",  # per-request speculation for usage
    }
    if drafter is not None:
        folder, block = drafter
        kwargs["speculative_config"] = speculative_config(folder, block)
    return kwargs | settings.vllm_args
