"""Stage 3: the target, a small Qwen3 causal LM trained from scratch on the packed corpus."""

import math

import torch
import torch.nn.functional as F
from torch import nn

from dcoco.model.causal_lm import CausalLM
from dcoco.model.layers import TransformerConfig
from dcoco.train.config import TargetConfig
from dcoco.train.data import random_windows, tiled_windows
from dcoco.train.loop import Budget, LoopResult, train_loop

INIT_STD = 0.02  # Hugging Face Qwen3's initializer_range
HELDOUT_WINDOWS = 64  # per domain: enough for a loss to two decimals


def target_config(cfg: TargetConfig, vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,  # saves a quarter of the parameters at this size
    )


def init_weights(model: nn.Module, num_layers: int) -> None:
    """Normal(0, 0.02) weights; the projections that write into the residual stream are scaled
    by 1/sqrt(2 * layers) (GPT-2), which keeps a from-scratch run stable at a high rate."""
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            continue
        std = (
            INIT_STD / math.sqrt(2 * num_layers)
            if name.endswith(("o_proj.weight", "down_proj.weight"))
            else INIT_STD
        )
        nn.init.normal_(param, 0.0, std)


def lm_loss(model: CausalLM, windows: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over windows [N, T+1]."""
    inputs, labels = windows[:, :-1], windows[:, 1:]  # [N, T] each
    positions = torch.arange(inputs.shape[1]).expand_as(inputs)  # [N, T]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden, _ = model(inputs, positions)  # [N, T, H]
        logits = model.logits(hidden)  # [N, T, V]
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())  # scalar


def train_target(
    cfg: TargetConfig, vocab_size: int, stream: torch.Tensor, seed: int
) -> tuple[CausalLM, LoopResult]:
    """stream [L] token ids; returns the trained model in fp32 and the loop's record."""
    torch.manual_seed(seed)
    model = CausalLM(target_config(cfg, vocab_size))
    init_weights(model, cfg.num_layers)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": rest, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),  # the usual pair for language-model pretraining
    )
    loss_fn = torch.compile(lm_loss) if cfg.compile else lm_loss
    generator = torch.Generator().manual_seed(seed)

    def step() -> dict[str, torch.Tensor]:
        windows = random_windows(stream, cfg.batch_size, cfg.seq_len, generator)  # [N, T+1]
        loss = loss_fn(model, windows)
        loss.backward()
        return {"loss": loss.detach()}

    budget = Budget(cfg.budget_s, cfg.max_steps, cfg.warmup_steps)
    result = train_loop("target", budget, optimizer, step)
    return model.eval(), result


@torch.no_grad()
def heldout_loss(model: CausalLM, stream: torch.Tensor, seq_len: int) -> float:
    """Mean next-token loss over consecutive windows of a held-out stream [L]."""
    windows = tiled_windows(stream, seq_len, HELDOUT_WINDOWS)  # [N, T+1]
    if len(windows) == 0:
        return float("nan")
    return float(torch.stack([lm_loss(model, w.unsqueeze(0)) for w in windows]).mean())
