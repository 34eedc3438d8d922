"""Our target against transformers' Qwen3ForCausalLM and LlamaForCausalLM on the same
checkpoints: random weights for both families, and once the real SmolLM2-135M-Instruct."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen3ForCausalLM

from dcoco.checkpoint import load_target, save_target
from dcoco.model.causal_lm import CausalLM
from dcoco.paths import SMOLLM2_TARGET
from dcoco.tokenizer import Tokenizer
from factories import make_target

REFERENCE = {"qwen3": Qwen3ForCausalLM, "llama": LlamaForCausalLM}


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_logits_and_features_match_transformers(tmp_path: Path, family: str) -> None:
    ours = make_target(vocab=64, hidden=32, layers=3, family=family)
    save_target(ours, tmp_path)
    theirs = REFERENCE[family].from_pretrained(tmp_path, dtype=torch.float32).eval()
    loaded = load_target(tmp_path)
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = theirs(ids, output_hidden_states=True)
        hidden, feats = loaded(ids, torch.arange(11).expand(2, 11), feature_layers=(0, 1))
        torch.testing.assert_close(loaded.logits(hidden), reference.logits, rtol=1e-4, atol=1e-4)
        # A layer's feature is Hugging Face's hidden_states[layer + 1].
        expected = torch.cat([reference.hidden_states[1], reference.hidden_states[2]], dim=-1)
        torch.testing.assert_close(feats, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_tied_embeddings_load_without_an_lm_head_tensor(tmp_path: Path, family: str) -> None:
    tied = CausalLM(replace(make_target(family=family).config, tie_word_embeddings=True)).eval()
    save_target(tied, tmp_path)
    theirs = REFERENCE[family].from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        hidden, _ = load_target(tmp_path)(ids, torch.arange(4).unsqueeze(0))
        torch.testing.assert_close(tied.logits(hidden), theirs(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_smollm2_matches_transformers_in_fp32_and_bf16() -> None:
    """fp32 agrees to float rounding. bf16 (weights and activations, 30 layers) drifts: its
    logits stay within 3% of the logit range, and the greedy choice agrees at almost every
    position of a real prompt."""
    tokenizer = Tokenizer.from_dir(SMOLLM2_TARGET)
    prompt = tokenizer.render_chat([{"role": "user", "content": "Explain what a hash map is."}])
    ids = torch.tensor([tokenizer.encode(prompt)])  # [1, T]
    positions = torch.arange(ids.shape[1]).unsqueeze(0)  # [1, T]
    theirs = LlamaForCausalLM.from_pretrained(SMOLLM2_TARGET, dtype=torch.float32).eval()
    ours = load_target(SMOLLM2_TARGET)
    with torch.no_grad():
        expected = theirs(ids).logits  # [1, T, V]
        hidden, _ = ours(ids, positions)  # [1, T, H]
        torch.testing.assert_close(ours.logits(hidden), expected, rtol=1e-4, atol=2e-4)
        ours.to(torch.bfloat16)
        ours.rotary.reserve(ids.shape[1], torch.bfloat16)
        hidden, _ = ours(ids, positions)  # [1, T, H] in bf16
        fast = ours.logits(hidden).float()  # [1, T, V]
    spread = float(expected.max() - expected.min())
    assert float((fast - expected).abs().max()) < 0.03 * spread
    agree = (fast.argmax(-1) == expected.argmax(-1)).float().mean()
    assert agree >= 0.9
