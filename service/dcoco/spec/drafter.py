"""The DFlash block drafter, in vLLM's DFlash checkpoint layout.

One non-causal pass over [last verified token, B mask slots] proposes all B slots. The block is
embedded with the target's embedding and read out through the target's lm_head (both shared and
frozen). Keys and values come from two places: the block itself, and the context, which is the
target's features at the chosen layers, concatenated, projected by `fc` and normalised by
`hidden_norm`. Context keys/values are computed once per committed token and cached; they go
through each layer's k_proj / k_norm / v_proj directly, without that layer's input norm.

A drafter may draft over a reduced vocabulary, in vLLM's EAGLE-3 layout: `draft_vocab_size`
in its config, its own `lm_head` [V', H] (the target's rows for those tokens) and `d2t` [V']
offsets, so that logit column c is token c + d2t[c]. The lm_head is then a sixth of the cost.
"""

from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from torch import nn

from dcoco.model.layers import (
    DecoderLayer,
    KVSource,
    LayerCall,
    RMSNorm,
    Rotary,
    TransformerConfig,
)
from dcoco.spec.corrector import Corrector, CorrectorConfig

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DCOCO_ARCHITECTURE = "DCOCODraftModel"


@dataclass(frozen=True)
class DrafterConfig:
    model: TransformerConfig  # the drafter's own layers; hidden_size equals the target's
    block_size: int  # B, drafted slots per cycle (vLLM's num_speculative_tokens)
    mask_token_id: int  # a token id in the target's vocabulary, reserved by its tokenizer
    target_layer_ids: tuple[int, ...]  # 0-based target layers whose outputs feed the context
    target_hidden_size: int
    corrector: CorrectorConfig | None = None  # None: a plain DFlash drafter
    draft_vocab_size: int | None = None  # V' < V tokens it drafts over; None: all of them

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if not self.target_layer_ids or list(self.target_layer_ids) != sorted(
            set(self.target_layer_ids)
        ):
            raise ValueError("target_layer_ids must be non-empty, ascending and unique")
        if not 0 <= self.mask_token_id < self.model.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size < (
            self.model.vocab_size
        ):
            raise ValueError(f"draft_vocab_size must be in [1, {self.model.vocab_size})")

    @property
    def architecture(self) -> str:
        return DCOCO_ARCHITECTURE if self.corrector else DFLASH_ARCHITECTURE

    def to_hf(self) -> dict[str, Any]:
        raw = self.model.to_hf() | {
            "architectures": [self.architecture],
            "block_size": self.block_size,
            "target_hidden_size": self.target_hidden_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        }
        if self.corrector:
            raw["dcoco_config"] = self.corrector.to_dict()
        if self.draft_vocab_size:
            raw["draft_vocab_size"] = self.draft_vocab_size
        return raw

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "DrafterConfig":
        archs = raw.get("architectures")
        if archs not in ([DFLASH_ARCHITECTURE], [DCOCO_ARCHITECTURE]):
            raise ValueError(
                f"architectures must be [{DFLASH_ARCHITECTURE!r}] or [{DCOCO_ARCHITECTURE!r}],"
                f" got {archs!r}"
            )
        dflash = raw.get("dflash_config") or {}
        corrector = raw.get("dcoco_config")
        if (archs == [DCOCO_ARCHITECTURE]) != (corrector is not None):
            raise ValueError(f"{DCOCO_ARCHITECTURE} needs dcoco_config, and only it has one")
        model = TransformerConfig.from_hf(raw)
        draft_vocab = raw.get("draft_vocab_size")  # vLLM writes the target's size for "all"
        try:
            return cls(
                model=model,
                block_size=int(raw["block_size"]),
                mask_token_id=int(dflash["mask_token_id"]),
                target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
                target_hidden_size=int(raw.get("target_hidden_size") or model.hidden_size),
                corrector=CorrectorConfig(**corrector) if corrector is not None else None,
                draft_vocab_size=(
                    int(draft_vocab) if draft_vocab not in (None, model.vocab_size) else None
                ),
            )
        except KeyError as missing:
            raise ValueError(f"drafter config lacks {missing.args[0]!r}") from None
        except TypeError as bad:
            raise ValueError(f"bad dcoco_config: {bad}") from None

    def without_corrector(self) -> "DrafterConfig":
        return replace(self, corrector=None)


def column_ids(d2t: torch.Tensor) -> torch.Tensor:
    """vLLM's d2t offsets [V'] -> the token id of each logit column [V']."""
    return torch.arange(len(d2t), device=d2t.device) + d2t  # [V']


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        m = cfg.model
        self.layers = nn.ModuleList(DecoderLayer(m, i) for i in range(m.num_hidden_layers))
        self.fc = nn.Linear(
            len(cfg.target_layer_ids) * cfg.target_hidden_size, m.hidden_size, bias=False
        )
        self.hidden_norm = RMSNorm(m.hidden_size, m.rms_norm_eps)
        self.norm = RMSNorm(m.hidden_size, m.rms_norm_eps)
        self.corrector = (
            Corrector(cfg.corrector, m.hidden_size, m.hidden_size) if cfg.corrector else None
        )
        self.rotary = Rotary(m.head_dim, m.rope_theta, m.max_position_embeddings)
        self.lm_head: nn.Linear | None = None  # None: the target's lm_head, shared
        if cfg.draft_vocab_size:
            self.lm_head = nn.Linear(m.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        # A learned mask-slot embedding, shipped as mask_embedding.pt; None uses the target's.
        self.mask_embedding: torch.Tensor | None = None

    def embed_block(
        self, embed_tokens: nn.Embedding, last: torch.Tensor, slots: int
    ) -> torch.Tensor:
        """last [N] verified tokens -> block embeddings [N, slots+1, H]."""
        masks = torch.full_like(last, self.config.mask_token_id)  # [N]
        block = torch.stack([last] + [masks] * slots, dim=1)  # [N, B+1]
        embeds = embed_tokens(block)  # [N, B+1, H]
        if self.mask_embedding is not None:
            embeds[:, 1:] = self.mask_embedding  # [N, B, H]
        return embeds

    def cast(self, dtype: torch.dtype) -> "DFlashDrafter":
        """Weights and the mask vector in `dtype`, in place. A drafter already in `dtype` is
        left as it is: an engine may have packed its linears for oneDNN (`model/packed.py`),
        whose weights do not convert."""
        if next(self.parameters()).dtype == dtype:
            return self
        self.to(dtype)
        if self.mask_embedding is not None:
            self.mask_embedding = self.mask_embedding.to(dtype)
        return self

    def logits(self, hidden: torch.Tensor, target_head: nn.Module) -> torch.Tensor:
        """Slot states [..., H] -> logits over the drafting vocabulary [..., V'] (V' = V with
        the target's head); `vocab_ids` names each column's token."""
        return (target_head if self.lm_head is None else self.lm_head)(hidden)  # [..., V']

    @property
    def vocab_ids(self) -> torch.Tensor | None:
        """[V'] the token id of each logit column; None when the columns are the token ids."""
        if self.lm_head is None:
            return None
        return column_ids(cast(torch.Tensor, self.d2t))  # [V']

    def with_vocab(self, ids: torch.Tensor, target_head: torch.Tensor) -> "DFlashDrafter":
        """A copy that drafts over token ids [V'] only, reading them through the target's head
        rows target_head[ids] [V', H]."""
        if self.lm_head is not None:
            raise ValueError("the drafter already drafts over a reduced vocabulary")
        ids = ids.sort().values  # [V'], ascending as vLLM's checkpoints list them
        copy = DFlashDrafter(replace(self.config, draft_vocab_size=len(ids)))
        copy.load_state_dict(self.state_dict(), strict=False)
        assert copy.lm_head is not None
        with torch.no_grad():
            copy.lm_head.weight.copy_(target_head[ids])  # [V', H]
            cast(torch.Tensor, copy.d2t).copy_(ids - torch.arange(len(ids)))  # [V']
        copy.mask_embedding = self.mask_embedding
        return copy.eval()

    def context(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [N, T, F] -> context states [N, T, H]."""
        return self.hidden_norm(self.fc(features))  # [N, T, H]

    def context_kv(
        self, context: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Context states [N, T, H] at positions [N, T] -> per layer keys, values [N, Hkv, T, D]."""
        cos, sin = self.rotary(positions)  # [N, 1, T, D] each
        layers = cast(list[DecoderLayer], list(self.layers))
        return [layer.self_attn.project_kv(context, cos, sin) for layer in layers]

    def forward(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        kv: KVSource | None,
        mask: torch.Tensor | None,
        call: LayerCall | None = None,
    ) -> torch.Tensor:
        """Block embeddings [N, T, H] at positions [N, T] -> normalised hidden states [N, T, H].

        `kv` supplies the context keys and values alongside the block's own; `mask` says which of
        them each block position sees. `call`, when given, runs each layer instead (it reads and
        writes the keys and values itself).
        """
        cos, sin = self.rotary(positions)  # [N, 1, T, D] each
        x = embeds
        for layer in cast(list[DecoderLayer], list(self.layers)):
            x = call(layer, x, cos, sin) if call else layer(x, cos, sin, kv, mask)  # [N, T, H]
        return self.norm(x)  # [N, T, H]


def teacher_forced_blocks(
    drafter: DFlashDrafter,
    embed_tokens: nn.Embedding,
    features: torch.Tensor,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
) -> torch.Tensor:
    """Many blocks per sequence in one pass, as in training: slot states [N, A, B, H].

    features [N, T, F] are the target's features at every position of tokens [N, T]. Block i
    starts at position anchors[:, i] with that token and sees the context of positions before
    it, exactly what the engine's cached path sees when that token is the pending one.
    """
    n, a = anchors.shape
    width = drafter.config.block_size + 1
    positions = (anchors.unsqueeze(-1) + torch.arange(width)).view(n, a * width)  # [N, A*(B+1)]
    context = drafter.context(features)  # [N, T, H]
    context_positions = torch.arange(tokens.shape[1]).expand(n, -1)  # [N, T]
    context_kv = drafter.context_kv(context, context_positions)  # per layer [N, Hkv, T, D]
    last = tokens.gather(1, anchors).view(n * a)  # [N*A]
    embeds = drafter.embed_block(embed_tokens, last, width - 1).view(
        n, a * width, -1
    )  # [N, A*(B+1), H]
    block_of = torch.arange(a).repeat_interleave(width)  # [A*(B+1)] block of each query
    anchor_of_query = anchors.repeat_interleave(width, dim=1)  # [N, Q], Q = A*(B+1)
    sees_context = context_positions.unsqueeze(1) < anchor_of_query.unsqueeze(-1)  # [N, Q, T]
    sees_block = (block_of.unsqueeze(1) == block_of.unsqueeze(0)).expand(n, -1, -1)  # [N, Q, Q]
    mask = torch.cat([sees_context, sees_block], dim=-1).unsqueeze(1)  # [N, 1, Q, T+Q]

    def with_context(
        layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ck, cv = context_kv[layer]  # [N, Hkv, T, D] each
        return torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)  # [N, Hkv, T+Q, D] each

    hidden = drafter(embeds, positions, with_context, mask)  # [N, A*(B+1), H]
    return hidden.view(n, a, width, -1)[:, :, 1:]  # [N, A, B, H]
