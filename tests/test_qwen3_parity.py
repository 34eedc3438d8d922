"""Our Qwen3 target against transformers' Qwen3ForCausalLM on the same checkpoint."""

from pathlib import Path

import torch
from transformers import Qwen3ForCausalLM as HFQwen3

from dcoco.checkpoint import load_target, save_target
from factories import make_target


def test_logits_and_features_match_transformers(tmp_path: Path) -> None:
    ours = make_target(vocab=64, hidden=32, layers=3)
    save_target(ours, tmp_path)
    theirs = HFQwen3.from_pretrained(tmp_path, dtype=torch.float32).eval()
    loaded = load_target(tmp_path)
    ids = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = theirs(ids, output_hidden_states=True)
        hidden, feats = loaded(ids, torch.arange(11).expand(2, 11), feature_layers=(0, 1))
        torch.testing.assert_close(loaded.logits(hidden), reference.logits, rtol=1e-4, atol=1e-4)
        # A layer's feature is Hugging Face's hidden_states[layer + 1].
        expected = torch.cat([reference.hidden_states[1], reference.hidden_states[2]], dim=-1)
        torch.testing.assert_close(feats, expected, rtol=1e-4, atol=1e-4)


def test_tied_embeddings_load_without_an_lm_head_tensor(tmp_path: Path) -> None:
    from dataclasses import replace

    from dcoco.model.qwen3 import Qwen3ForCausalLM

    tied = Qwen3ForCausalLM(replace(make_target().config, tie_word_embeddings=True)).eval()
    save_target(tied, tmp_path)
    theirs = HFQwen3.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        hidden, _ = load_target(tmp_path)(ids, torch.arange(4).unsqueeze(0))
        torch.testing.assert_close(tied.logits(hidden), theirs(ids).logits, rtol=1e-4, atol=1e-4)
