"""Random-weight models for tests: small enough to run hundreds of cycles in a second."""

from pathlib import Path

import torch

from dcoco.model.causal_lm import CausalLM
from dcoco.model.layers import TransformerConfig
from dcoco.spec.corrector import CorrectorConfig
from dcoco.spec.drafter import DFlashDrafter, DrafterConfig


def target_config(
    vocab: int = 16, hidden: int = 32, layers: int = 3, family: str = "qwen3"
) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=4096,
        rope_theta=10_000.0,
        family=family,
    )


def make_target(
    seed: int = 0, vocab: int = 16, hidden: int = 32, layers: int = 3, family: str = "qwen3"
) -> CausalLM:
    torch.manual_seed(seed)
    model = CausalLM(target_config(vocab, hidden, layers, family)).eval()
    with torch.no_grad():  # non-trivial norms, so checkpoint and parity tests see them
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model


def drafter_config(
    target: CausalLM, block: int = 4, top_k: int | None = 4, layers: int = 1
) -> DrafterConfig:
    t = target.config
    return DrafterConfig(
        model=TransformerConfig(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            intermediate_size=2 * t.hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=t.hidden_size // 4,
            max_position_embeddings=256,
            rope_theta=10_000.0,
        ),
        block_size=block,
        mask_token_id=t.vocab_size - 1,
        target_layer_ids=(0, t.num_hidden_layers - 2),
        target_hidden_size=t.hidden_size,
        corrector=CorrectorConfig(top_k=top_k, rep_dim=16, pair_dim=16, mlp_dim=8)
        if top_k
        else None,
    )


def make_drafter(
    target: CausalLM, seed: int = 1, trained_delta: bool = True, **kwargs: int
) -> DFlashDrafter:
    """A drafter whose corrector, unless `trained_delta` is False, has a non-zero output layer,
    so the selection rules really do pick other candidates."""
    torch.manual_seed(seed)
    drafter = DFlashDrafter(drafter_config(target, **kwargs)).eval()
    if drafter.corrector is not None and trained_delta:
        with torch.no_grad():
            drafter.corrector.delta_out.weight.normal_(0.0, 3.0)
    return drafter


@torch.no_grad()
def greedy_reference(target: CausalLM, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding: the whole sequence recomputed every token, no cache, batch 1."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        ids = torch.tensor([tokens])  # [1, T]
        hidden, _ = target(ids, torch.arange(len(tokens)).unsqueeze(0))  # [1, T, H]
        tokens.append(int(target.logits(hidden[0, -1]).argmax()))
    return tokens[len(prompt) :]


def distill(
    target: CausalLM, drafter: DFlashDrafter, steps: int = 200, seed: int = 0
) -> DFlashDrafter:
    """Teaches a drafter the target's greedy continuations for a few seconds, so engine tests
    see real acceptances, partial and full, instead of a drafter that is always wrong."""
    from dcoco.engine.engine import Engine
    from dcoco.shared.engine_config import EngineConfig
    from dcoco.shared.options import Mode
    from dcoco.shared.sampling import SamplingParams
    from dcoco.spec.drafter import teacher_forced_blocks

    g = torch.Generator().manual_seed(seed)
    vocab, block = target.config.vocab_size, drafter.config.block_size
    prompts = [
        torch.randint(0, vocab - 1, (int(n),), generator=g).tolist()
        for n in torch.randint(2, 9, (64,), generator=g)
    ]
    engine = Engine(
        target, None, EngineConfig(mode=Mode.VANILLA, max_batch_size=64, max_model_len=64)
    )
    completions, _ = engine.generate(prompts, SamplingParams(max_tokens=40))
    width = min(len(c.prompt_ids) + len(c.token_ids) for c in completions)
    tokens = torch.tensor([(c.prompt_ids + c.token_ids)[:width] for c in completions])  # [S, T]
    with torch.no_grad():
        positions = torch.arange(width).expand(len(completions), width)  # [S, T]
        _, feats = target(tokens, positions, feature_layers=drafter.config.target_layer_ids)
    assert feats is not None
    params = [p for name, p in drafter.named_parameters() if not name.startswith("corrector.")]
    optimizer = torch.optim.Adam(params, lr=3e-3)
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, len(completions), (16,), generator=g)  # [16]
        anchors = torch.randint(2, width - block, (16, 6), generator=g)  # [16, 6]
        hidden = teacher_forced_blocks(
            drafter, target.model.embed_tokens, feats[rows], tokens[rows], anchors
        )
        labels = tokens[rows].gather(
            1, (anchors.unsqueeze(-1) + torch.arange(1, block + 1)).view(16, -1)
        )
        loss = torch.nn.functional.cross_entropy(
            target.logits(hidden).reshape(-1, vocab), labels.reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()


TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The cat sat on the mat.",
    "x = [i * i for i in range(10)]",
]


def write_models(root: Path, distilled: bool = True) -> dict[str, Path]:
    """A tokenizer, a random target and its DCOCO and DFlash drafters, saved as folders. The
    target never emits a special token, so the length of an answer is max_tokens."""
    from dataclasses import replace

    from dcoco.checkpoint import save_drafter, save_target
    from dcoco.tokenizer import MASK, Tokenizer, save_tokenizer, train_tokenizer

    save_tokenizer(train_tokenizer(TEXTS * 20, vocab_size=300), root / "target")
    tokenizer = Tokenizer.from_dir(root / "target")
    target = make_target(vocab=tokenizer.vocab_size, hidden=32, layers=3)
    with torch.no_grad():  # special tokens (ids 0..3) never win: answers run to max_tokens
        target.lm_head.weight.mul_(4.0)
        target.lm_head.weight[:4] = 0.0
    save_target(target, root / "target", {"eos_token_id": tokenizer.eos_token_ids[0]})
    cfg = replace(drafter_config(target, top_k=4), mask_token_id=tokenizer.token_id(MASK))
    torch.manual_seed(1)
    drafter = DFlashDrafter(cfg).eval()
    if distilled:
        drafter = distill(target, drafter)
    save_drafter(drafter, root / "dcoco")
    plain = DFlashDrafter(cfg.without_corrector())
    plain.load_state_dict(
        {k: v for k, v in drafter.state_dict().items() if not k.startswith("corrector.")}
    )
    save_drafter(plain, root / "dflash")
    return {"target": root / "target", "dcoco": root / "dcoco", "dflash": root / "dflash"}
