"""Decoder building blocks shared by the target and the DFlash drafter.

Both models are stacks of the same decoder layer. They differ only in where attention keys come
from (a causal cache for the target; projected target features plus the block for the drafter)
and in the mask, so attention takes its keys through a `KVSource` and its mask as an argument.

Two families share these blocks: Qwen3 (RMS-normalised queries and keys per head) and Llama
(no query/key norm). The drafter is always Qwen3, as vLLM's DFlash drafter is.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dcoco.model import flex

# (layer index, new keys [N, Hkv, T, D], new values [N, Hkv, T, D]) -> all keys and values to
# attend to, [N, Hkv, L, D] each. The engine's KV cache writes then reads; training concatenates.
KVSource = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# Which keys each query sees: a bool tensor [N, 1, T, L], or a row mask (`model/flex.py`).
AttentionMask = torch.Tensor | flex.RowMask


ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}  # by model_type


@dataclass(frozen=True)
class TransformerConfig:
    """The fields both models read from a Hugging Face Qwen3 or Llama `config.json`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # Qwen3's default
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    family: str = "qwen3"  # Hugging Face model_type: "qwen3" or "llama"

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.family]

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "TransformerConfig":
        """Reads a Hugging Face Qwen3 or Llama config; unsupported features raise ValueError."""
        family = raw.get("model_type", "qwen3")
        if family not in ARCHITECTURES:
            raise ValueError(f"model_type {family!r} is not supported (qwen3 or llama)")
        if raw.get("mlp_bias"):
            raise ValueError("mlp_bias is not supported")
        if raw.get("rope_scaling") not in (None, {}):
            raise ValueError("rope_scaling is not supported")
        rope = raw.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"rope_type {rope['rope_type']!r} is not supported")
        if raw.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {raw['hidden_act']!r} is not supported")
        try:
            heads = int(raw["num_attention_heads"])
            return cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads", heads)),
                head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0))),
                max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
                attention_bias=bool(raw.get("attention_bias", False)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                family=family,
            )
        except KeyError as missing:
            raise ValueError(f"config.json lacks {missing.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        """The Hugging Face config fields, loadable by transformers and vLLM."""
        return {
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "torch_dtype": "float32",
        } | ({} if self.qk_norm else {"mlp_bias": False})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)  # [..., dim]


class NoNorm(nn.Module):
    """Llama's place for Qwen3's query/key norm: the identity, with no weights."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x  # [..., dim]


class Rotary:
    """Neox-style rotary tables indexed by absolute position.

    The table is sized up front (`reserve`) so a forward pass never syncs to check its length.
    """

    def __init__(self, head_dim: int, theta: float, size: int) -> None:
        self.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).double() / head_dim)  # [D/2]
        self.dtype = torch.float32  # the tables' dtype: the activations'
        self.cos = torch.empty(0, head_dim)  # [P, D]
        self.sin = torch.empty(0, head_dim)  # [P, D]
        self.reserve(size)

    def reserve(self, size: int, dtype: torch.dtype | None = None) -> None:
        """Sizes the tables for `size` positions, in `dtype` (default: the current one)."""
        self.dtype = dtype or self.dtype
        if size <= self.cos.shape[0] and self.cos.dtype == self.dtype:
            return
        positions = torch.arange(max(size, self.cos.shape[0])).double()  # [P]
        angles = torch.outer(positions, self.inv_freq)  # [P, D/2]
        angles = torch.cat([angles, angles], dim=-1)  # [P, D]
        self.cos, self.sin = angles.cos().to(self.dtype), angles.sin().to(self.dtype)  # [P, D]

    def __call__(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N, T] -> cos, sin [N, 1, T, D], ready to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)  # [N, 1, T, D]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, H, T, D] rotated by cos, sin [N, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # [N, H, T, D]
    return (x * cos + rotated * sin).to(x.dtype)  # [N, H, T, D]


@dataclass(frozen=True)
class Rows:
    """A batch of rows that attend alike: `rows` rows of `width` tokens, with their rotary
    tables [N, 1, T, D], KV source and mask [N, 1, T, L]. A forward over several such groups at
    once (`DecoderLayer.forward_groups`) shares every weight read between them."""

    rows: int
    width: int
    cos: torch.Tensor
    sin: torch.Tensor
    kv: KVSource | None
    mask: AttentionMask | None


# Masked bf16 attention over fewer queries than this may run in fp32 (`Attention._attend`).
UPCAST_BELOW = 128


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.attention_bias)
        norm: type[nn.Module] = RMSNorm if cfg.qk_norm else NoNorm
        self.q_norm = norm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = norm(self.head_dim, cfg.rms_norm_eps)
        self.register_module("qkv_proj", None)  # the three projections in one, once fused
        self.widths = [q_dim, kv_dim, kv_dim]
        self.upcast = True  # small masked bf16 attention in fp32 (`set_attention_upcast`)

    def fuse(self) -> None:
        """Merges q_proj, k_proj and v_proj into one linear, `qkv_proj` (`fuse_linears`)."""
        self.qkv_proj = fuse_linears([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def project_kv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, T, hidden] -> rotated keys and values [N, Hkv, T, D] (unfused only)."""
        return self._rotate_kv(self.k_proj(x), self.v_proj(x), cos, sin)

    def _rotate_kv(
        self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected keys and values [N, T, Hkv*D] -> normed, rotated [N, Hkv, T, D] each."""
        n, t, _ = k.shape
        k = self.k_norm(k.view(n, t, self.kv_heads, self.head_dim))  # [N, T, Hkv, D]
        v = v.view(n, t, self.kv_heads, self.head_dim)  # [N, T, Hkv, D]
        return apply_rotary(k.transpose(1, 2), cos, sin), v.transpose(1, 2)  # [N, Hkv, T, D] each

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVSource | None,
        mask: AttentionMask | None,
    ) -> torch.Tensor:
        """x [N, T, hidden] -> [N, T, hidden]. Without a KV source, plain causal self-attention."""
        q, k, v = self._project(x)  # [N, T, Hq*D], [N, T, Hkv*D] x2
        return self.o_proj(self._attend(q, k, v, cos, sin, kv, mask))  # [N, T, hidden]

    def forward_groups(self, x: torch.Tensor, groups: list[Rows]) -> torch.Tensor:
        """x [1, M, hidden]: the tokens of `groups` one group after another -> [1, M, hidden].
        The projections multiply all M tokens at once; each group attends on its own."""
        q, k, v = self._project(x)  # [1, M, Hq*D], [1, M, Hkv*D] x2
        sizes = [g.rows * g.width for g in groups]
        parts = zip(groups, q.split(sizes, 1), k.split(sizes, 1), v.split(sizes, 1), strict=True)
        out = [
            self._attend(
                gq.view(g.rows, g.width, -1),  # [Ng, Tg, Hq*D]
                gk.view(g.rows, g.width, -1),  # [Ng, Tg, Hkv*D]
                gv.view(g.rows, g.width, -1),  # [Ng, Tg, Hkv*D]
                g.cos,
                g.sin,
                g.kv,
                g.mask,
            ).view(1, -1, q.shape[-1])  # [1, Ng*Tg, Hq*D]
            for g, gq, gk, gv in parts
        ]
        return self.o_proj(torch.cat(out, dim=1))  # [1, M, hidden]

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [N, T, hidden] -> q [N, T, Hq*D], k and v [N, T, Hkv*D]."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = self.qkv_proj(x).split(self.widths, dim=-1)
        return q, k, v

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVSource | None,
        mask: AttentionMask | None,
    ) -> torch.Tensor:
        """Projected q [N, T, Hq*D], k and v [N, T, Hkv*D] -> attention output [N, T, Hq*D].

        Masked bf16 attention over few queries (decoding, verifying, drafting a block) runs
        in fp32 unless `upcast` is off. Which is faster depends on the CPU: bf16 SDPA at these
        shapes was up to 6x slower than fp32 on an AVX512_BF16 CPU without AMX, and 1.5x
        faster on one with AMX (a bf16 plain step at batch 64). Engines measure it
        (`precision.attention_upcast`); an eager engine that upcasts keeps its KV caches in
        fp32, so only the new queries convert (`ModelRunner`). Long prefills and training's
        many blocks stay in bf16.
        """
        n, t, _ = q.shape
        q = self.q_norm(q.view(n, t, self.heads, self.head_dim))  # [N, T, Hq, D]
        q = apply_rotary(q.transpose(1, 2), cos, sin)  # [N, Hq, T, D]
        k, v = self._rotate_kv(k, v, cos, sin)  # [N, Hkv, T, D] each
        if kv is not None:
            k, v = kv(self.layer_idx, k, v)  # [N, Hkv, L, D] each
        if isinstance(mask, flex.RowMask):  # each row reads its own context (`model/flex.py`)
            out = flex.attend(q.to(k.dtype), k, v, mask).to(q.dtype)  # [N, Hq, T, D]
            return out.transpose(1, 2).reshape(n, t, self.heads * self.head_dim)  # [N, T, Hq*D]
        upcast = self.upcast and mask is not None and q.dtype == torch.bfloat16
        work = torch.float32 if upcast and t < UPCAST_BELOW else q.dtype
        out = F.scaled_dot_product_attention(
            q.to(work),
            k.to(work),
            v.to(work),
            attn_mask=mask,
            is_causal=kv is None and mask is None,
            enable_gqa=True,
        ).to(q.dtype)  # [N, Hq, T, D]
        return out.transpose(1, 2).reshape(n, t, self.heads * self.head_dim)  # [N, T, Hq*D]


def set_attention_upcast(model: nn.Module, upcast: bool) -> None:
    """Sets whether every attention under `model` runs small masked bf16 attention in fp32."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.upcast = upcast


class MLP(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.register_module("gate_up_proj", None)  # gate_proj and up_proj in one, once fused

    def fuse(self) -> None:
        """Merges gate_proj and up_proj into one linear, `gate_up_proj` (`fuse_linears`)."""
        self.gate_up_proj = fuse_linears([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)  # [N, T, I] each
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # [N, T, I] each
        return self.down_proj(F.silu(gate) * up)  # [N, T, hidden]


def fuse_linears(parts: list[nn.Module]) -> nn.Linear:
    """One linear whose outputs are the parts' outputs side by side, for inference.

    At one to a few rows a CPU linear costs about as much per call as per weight, so one
    matmul instead of three (q, k, v) and two (gate, up) per layer takes about 30% off a
    layer's projections in int4 at batch 1. A fused model's state dict no longer matches a
    checkpoint, so only engines fuse their target (`precision.apply_precision`); drafters
    and training keep the checkpoint's layout.
    """
    linears = [p for p in parts if isinstance(p, nn.Linear)]
    if len(linears) != len(parts):
        raise TypeError("fuse before quantizing: only nn.Linear parts can be merged")
    first = linears[0]
    fused = nn.Linear(
        first.in_features,
        sum(p.out_features for p in linears),
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in linears]))  # [sum out, in]
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in linears if p.bias is not None]))
    return fused.requires_grad_(first.weight.requires_grad)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: KVSource | None,
        mask: AttentionMask | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, mask)  # [N, T, hidden]
        return x + self.mlp(self.post_attention_layernorm(x))  # [N, T, hidden]

    def forward_groups(self, x: torch.Tensor, groups: list[Rows]) -> torch.Tensor:
        """x [1, M, hidden], the groups' tokens one group after another -> [1, M, hidden]."""
        x = x + self.self_attn.forward_groups(self.input_layernorm(x), groups)  # [1, M, hidden]
        return x + self.mlp(self.post_attention_layernorm(x))  # [1, M, hidden]


# (layer, x [N, T, H], cos [N, 1, T, D], sin [N, 1, T, D]) -> x [N, T, H]: runs one decoder
# layer in place of calling it with the forward's KV source (the engine's compiled layers).
LayerCall = Callable[[DecoderLayer, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
