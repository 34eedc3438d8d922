"""The target: a Qwen3 causal LM whose parameter names match Hugging Face's CausalLM."""

from dataclasses import dataclass

import torch
from torch import nn

from dcoco.model.layers import (
    AttentionMask,
    DecoderLayer,
    KVSource,
    LayerCall,
    RMSNorm,
    Rotary,
    Rows,
    TransformerConfig,
)


@dataclass(frozen=True)
class Batch:
    """One batch of a forward over several (`CausalLM.forward_groups`): token ids and positions
    [N, T], where its keys and values go and come from, and its mask [N, 1, T, L]."""

    ids: torch.Tensor
    positions: torch.Tensor
    kv: KVSource | None
    mask: AttentionMask | None


class Backbone(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)

    def fuse_projections(self) -> None:
        """Each layer's q/k/v and gate/up projections as one linear each, in place, for an
        engine (`layers.fuse_linears`); a second call changes nothing."""
        for layer in self.model.layers:
            assert isinstance(layer, DecoderLayer)
            if layer.self_attn.qkv_proj is None:
                layer.fuse()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv: KVSource | None = None,
        mask: AttentionMask | None = None,
        feature_layers: tuple[int, ...] = (),
        call: LayerCall | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, positions [N, T] -> final hidden states [N, T, H] and drafter features.

        The feature of layer i is that layer's output before the final norm (Hugging Face's
        `hidden_states[i + 1]`, vLLM's aux layer i + 1); the requested layers are concatenated
        into [N, T, len(feature_layers) * H], or None when none are requested. `call`, when
        given, runs each layer instead (it reads and writes the keys and values itself).
        """
        x = self.model.embed_tokens(input_ids)  # [N, T, H]
        cos, sin = self.rotary(positions)  # [N, 1, T, D] each
        features = []
        for i, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            x = call(layer, x, cos, sin) if call else layer(x, cos, sin, kv, mask)  # [N, T, H]
            if i in feature_layers:
                features.append(x)
        feats = torch.cat(features, dim=-1) if features else None  # [N, T, F]
        return self.model.norm(x), feats  # [N, T, H]

    def forward_groups(
        self, groups: list[Batch], feature_layers: tuple[int, ...] = ()
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Several batches in one forward: each batch's `forward`, with every linear multiplying
        all their tokens at once, so each weight is read once for all of them (a prompt's chunk
        riding along the running streams' plain step). Each batch attends on its own."""
        rows = []
        for b in groups:
            cos, sin = self.rotary(b.positions)  # [Ng, 1, Tg, D] each
            rows.append(Rows(b.ids.shape[0], b.ids.shape[1], cos, sin, b.kv, b.mask))
        embeds = [self.model.embed_tokens(b.ids).flatten(0, 1) for b in groups]  # [Ng*Tg, H]
        x = torch.cat(embeds).unsqueeze(0)  # [1, M, H]
        features = []
        for i, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            x = layer.forward_groups(x, rows)  # [1, M, H]
            if i in feature_layers:
                features.append(x)
        sizes = [r.rows * r.width for r in rows]
        hidden = self.model.norm(x)[0].split(sizes)  # [Ng*Tg, H] each
        feats = torch.cat(features, dim=-1)[0].split(sizes) if features else [None] * len(rows)
        return [
            (h.view(r.rows, r.width, -1), f.view(r.rows, r.width, -1) if f is not None else None)
            for r, h, f in zip(rows, hidden, feats, strict=True)
        ]  # [Ng, Tg, H] and [Ng, Tg, F] or None each

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [..., V]
