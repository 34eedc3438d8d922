"""The tiny model pair that ships in models/tiny."""

import json

import pytest
import torch

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.paths import TINY_HELDOUT, TINY_MODELS, TINY_TARGET
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import IM_END, MASK, Tokenizer, chat_prompt

DRAFTERS = ("dflash", "dcoco", "dcoco-frozen")
MAX_BYTES = 40 * 1024 * 1024


def heldout(domain: str, count: int) -> list[str]:
    lines = (TINY_HELDOUT / f"{domain}.jsonl").read_text().splitlines()[:count]
    return [json.loads(line)["prompt"] for line in lines]


def test_the_tiny_pair_fits_its_size_budget_and_has_every_folder() -> None:
    files = [p for p in TINY_MODELS.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= MAX_BYTES
    for folder in ("target", *DRAFTERS):
        assert (TINY_MODELS / folder / "config.json").is_file()
        assert (TINY_MODELS / folder / "model.safetensors").is_file()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (TINY_TARGET / name).is_file()
    assert {p.name for p in TINY_HELDOUT.iterdir()} == {
        "code.jsonl",
        "math.jsonl",
        "prose.jsonl",
    }


def test_the_configs_describe_a_qwen3_target_and_vllm_drafters() -> None:
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    target = json.loads((TINY_TARGET / "config.json").read_text())
    assert target["architectures"] == ["Qwen3ForCausalLM"]
    assert target["model_type"] == "qwen3"
    assert target["eos_token_id"] == tokenizer.token_id(IM_END)
    assert target["vocab_size"] >= tokenizer.vocab_size
    expected = {"dflash": "DFlashDraftModel", "dcoco": "DCOCODraftModel"}
    for name in DRAFTERS:
        raw = json.loads((TINY_MODELS / name / "config.json").read_text())
        assert raw["architectures"] == [expected.get(name, "DCOCODraftModel")]
        assert raw["block_size"] == 15
        assert raw["dflash_config"]["mask_token_id"] == tokenizer.token_id(MASK)
        assert max(raw["dflash_config"]["target_layer_ids"]) < target["num_hidden_layers"]


@pytest.mark.slow
def test_transformers_loads_the_target_and_agrees_with_ours() -> None:
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(TINY_TARGET), dtype=torch.float32
    )
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(str(TINY_TARGET))
    ours, tokenizer = load_target(TINY_TARGET), Tokenizer.from_dir(TINY_TARGET)
    messages = [{"role": "user", "content": heldout("code", 1)[0]}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == tokenizer.render_chat(messages)
    ids = tokenizer.encode(text)
    assert hf_tokenizer(text, add_special_tokens=False)["input_ids"] == ids
    tensor = torch.tensor([ids])  # [1, T]
    with torch.no_grad():
        hidden, _ = ours(tensor, torch.arange(len(ids)).unsqueeze(0))  # [1, T, H]
        torch.testing.assert_close(ours.logits(hidden), theirs(tensor).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_speculative_greedy_output_is_the_targets_and_the_drafters_learned_it() -> None:
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    target = load_target(TINY_TARGET)
    texts = heldout("code", 2) + heldout("math", 2)
    prompts = [tokenizer.encode(chat_prompt(tokenizer, t)) for t in texts]
    base = EngineConfig(max_model_len=512, eos_token_ids=tokenizer.eos_token_ids)
    params = SamplingParams(max_tokens=48)
    vanilla, _ = Engine(
        target, None, EngineConfig(**{**base.__dict__, "mode": Mode.VANILLA})
    ).generate(prompts, params)
    for name, mode, rule in (
        ("dflash", Mode.DFLASH, Rule.PREFIX),
        ("dcoco", Mode.DCOCO, Rule.PREFIX),
        ("dcoco", Mode.DCOCO, Rule.GLOBAL),
        ("dcoco-frozen", Mode.DCOCO, Rule.PREFIX),
    ):
        cfg = EngineConfig(**{**base.__dict__, "mode": mode, "rule": rule})
        spec, cycles = Engine(target, load_drafter(TINY_MODELS / name), cfg).generate(
            prompts, params
        )
        assert [c.token_ids for c in spec] == [c.token_ids for c in vanilla], (name, rule)
        lengths = [n for c in cycles for n in c.accepted_lengths]
        assert sum(lengths) / len(lengths) > 2.0, name  # well above the 1.0 of a useless drafter
    math_answers = [tokenizer.decode(c.token_ids) for c in vanilla[2:]]
    assert any("The answer is" in text for text in math_answers)
