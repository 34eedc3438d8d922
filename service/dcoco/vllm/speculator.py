"""The V2 runner's DCOCO speculator (GPU), in the pattern of vLLM's LiLiCorr.

`DFlash2Speculator._generate_draft` runs the drafter, takes the top-K candidates per slot
(`compute_candidates`), asks `_score_candidates` for [R, N, K, K] transition scores and walks
them with its Triton kernel from candidate 0: an argmax at temperature 0, a Gumbel sample
otherwise, caching the realised draft distribution for the rejection sampler. DCOCO only
supplies the scores, from the same `dcoco.spec` corrector the torch engine uses. Everything
here runs inside a full CUDA graph: static shapes, no host syncs.

Importing this module needs Triton with a GPU backend; `plugin.register` imports it only when
a DCOCO checkpoint meets the V2 runner. It has not been run on a GPU here (see README).
"""

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator

from dcoco.vllm.runtime import SelectionConfig

TOP_K_KEY = "dcoco_top_k"


class DCOCOSpeculator(DFlash2Speculator):
    _speculator_name = "DCOCO"
    _candidate_top_k_key = TOP_K_KEY

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        spec = vllm_config.speculative_config
        assert spec is not None
        hf_config = spec.draft_model_config.hf_config
        # DFlash2 reads K from dflash_config; DCOCO keeps it in dcoco_config / dcoco_selection.
        selection = SelectionConfig.from_hf(hf_config.to_dict())
        hf_config.dflash_config = dict(hf_config.dflash_config or {}) | {TOP_K_KEY: selection.top_k}
        super().__init__(vllm_config, device)

    def load_draft_model(
        self, target_model: nn.Module, target_attn_layer_names: set[str]
    ) -> nn.Module:
        model = super().load_draft_model(target_model, target_attn_layer_names)
        # The target's embedding, shared at load: a graph replay then only gathers from it.
        model.dcoco.corrector.build_token_table(model.embed_weight())
        return model

    def _score_candidates(
        self,
        candidate_ids: torch.Tensor,
        unary_logits: torch.Tensor,
        hidden_states: torch.Tensor,
    ) -> torch.Tensor:
        """candidate_ids and unary_logits [R, N, K], hidden_states [R, N, H] -> [R, N, K, K]."""
        return self.model.dcoco.transition_scores(
            hidden_states, candidate_ids, unary_logits, self.model.embed_weight()
        )  # [R, N, K, K]
