"""The default pair inside real vLLM: a Llama target (SmolLM2-135M-Instruct) with our Qwen3
DCOCO drafter, in fp32, against the torch engine on the same held-out prompts."""

import json
from pathlib import Path

import pytest

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.paths import SMOLLM2_MODELS, SMOLLM2_TARGET
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer
from vllm_env import offline

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MAX_TOKENS = 48
PROMPTS = 2  # held-out code prompts; vLLM's start-up dominates the test's time


def test_vllm_serves_the_default_pair_as_the_torch_engine_does(tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_dir(SMOLLM2_TARGET)
    lines = (SMOLLM2_MODELS / "heldout" / "code.jsonl").read_text().splitlines()[:PROMPTS]
    chats = [[{"role": "user", "content": json.loads(line)["prompt"]}] for line in lines]
    prompts = [tokenizer.encode(tokenizer.render_chat(chat)) for chat in chats]
    served = offline(
        tmp_path,
        SMOLLM2_MODELS / "dcoco",
        prompts,
        MAX_TOKENS,
        ("--max-model-len", "2048"),
        target=SMOLLM2_TARGET,
    )
    target, eos = load_target(SMOLLM2_TARGET), tokenizer.eos_token_ids
    runs = {}
    for mode, drafter in ((Mode.VANILLA, None), (Mode.DCOCO, SMOLLM2_MODELS / "dcoco")):
        config = EngineConfig(mode=mode, max_batch_size=PROMPTS, eos_token_ids=eos)
        engine = Engine(target, load_drafter(drafter) if drafter else None, config)
        runs[mode] = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    vanilla, _ = runs[Mode.VANILLA]
    _, cycles = runs[Mode.DCOCO]
    assert served["token_ids"] == [c.token_ids for c in vanilla]  # the target's own output
    assert served["drafts"] == sum(c.verifications for c in cycles)
    assert served["accepted_tokens"] == sum(c.accepted_tokens for c in cycles) > 0
