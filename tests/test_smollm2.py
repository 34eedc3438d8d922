"""The default pair: the SmolLM2-135M-Instruct target `make setup` converts, and the drafters
that ship in models/smollm2, on the real checkpoint."""

import json

import pytest

from dcoco.checkpoint import load_drafter, load_target
from dcoco.cli import main
from dcoco.engine.engine import Engine
from dcoco.paths import DEFAULT_HELDOUT, SMOLLM2_MODELS, SMOLLM2_TARGET
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer, chat_prompt

pytestmark = pytest.mark.slow
DRAFTERS = ("dflash", "dcoco", "dcoco-frozen")
MAX_DRAFTER_BYTES = 50 * 1024 * 1024


def test_the_drafters_ship_small_in_vllm_s_layout_with_the_run_recorded() -> None:
    for name in DRAFTERS:
        folder = SMOLLM2_MODELS / name
        size = sum(p.stat().st_size for p in folder.iterdir())
        assert size <= MAX_DRAFTER_BYTES, name
        raw = json.loads((folder / "config.json").read_text())
        assert raw["model_type"] == "qwen3"  # a Qwen3 drafter for a Llama target, as vLLM's
        assert len(raw["architectures"]) == 1
    record = json.loads((SMOLLM2_MODELS / "training.json").read_text())
    assert record["config"]["target_path"] == "models/smollm2/target"
    assert set(record["stages"]) == {"corpus", "distill", *DRAFTERS}


def test_fp32_speculation_reproduces_plain_greedy_decoding_on_the_real_checkpoint() -> None:
    tokenizer = Tokenizer.from_dir(SMOLLM2_TARGET)
    lines = (DEFAULT_HELDOUT / "code.jsonl").read_text().splitlines()[:2]
    prompts = [tokenizer.encode(chat_prompt(tokenizer, json.loads(x)["prompt"])) for x in lines]
    cfg = EngineConfig(
        mode=Mode.VANILLA,
        max_batch_size=2,
        max_model_len=1024,
        eos_token_ids=tokenizer.eos_token_ids,
        precision=Precision.FP32,
    )
    params = SamplingParams(max_tokens=24)
    vanilla, _ = Engine(load_target(SMOLLM2_TARGET), None, cfg).generate(prompts, params)
    drafter = load_drafter(SMOLLM2_MODELS / "dcoco")
    spec_cfg = EngineConfig(**{**cfg.__dict__, "mode": Mode.DCOCO})
    spec, cycles = Engine(load_target(SMOLLM2_TARGET), drafter, spec_cfg).generate(prompts, params)
    assert [c.token_ids for c in spec] == [c.token_ids for c in vanilla]
    assert sum(c.accepted_tokens for c in cycles) > 0  # the drafter is not useless


def test_generate_uses_the_default_pair_when_no_model_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In fp32: `auto` would time every precision on the real target first (about 45 s of the
    test's 55 here); its choice is tests/test_precision.py's."""
    args = ["generate", "--prompt", "def add(a, b):", "--max-tokens", "6", "--json"]
    assert main([*args, "--precision", "fp32"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["token_ids"]) == 6
    assert record["stats"]["verifications"] >= 1  # mode dcoco, with the default's drafter
