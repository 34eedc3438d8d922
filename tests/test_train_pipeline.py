"""The whole pipeline at smoke size (seconds): it runs, resumes, and its outputs load."""

import json
import time
from pathlib import Path

import pytest
import torch

from dcoco.checkpoint import load_drafter, load_target
from dcoco.cli import main
from dcoco.engine.engine import Engine
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import MASK, Tokenizer, chat_prompt
from dcoco.train.loop import Budget, train_loop
from dcoco.train.pipeline import MARKER, STAGE_NAMES

pytestmark = pytest.mark.slow


def train(root: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--preset",
        "smoke",
        "--work",
        str(root / "work"),
        "--out",
        str(root / "out"),
        *extra,
    ]


def markers(root: Path) -> dict[str, str]:
    return {name: (root / "work" / name / MARKER).read_text() for name in STAGE_NAMES}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("smoke")
    assert main(train(root)) == 0
    return root


def test_the_exported_models_load_and_speculation_is_lossless(smoke: Path) -> None:
    out = smoke / "out"
    tokenizer = Tokenizer.from_dir(out / "target")
    target = load_target(out / "target")
    raw = json.loads((out / "target" / "config.json").read_text())
    assert raw["eos_token_id"] == tokenizer.token_id("<|im_end|>")
    assert raw["architectures"] == ["Qwen3ForCausalLM"]
    prompts = [
        tokenizer.encode(chat_prompt(tokenizer, json.loads(line)["prompt"]))
        for line in (out / "heldout" / "math.jsonl").read_text().splitlines()[:3]
    ]
    cfg = EngineConfig(mode=Mode.VANILLA, max_model_len=256, eos_token_ids=tokenizer.eos_token_ids)
    vanilla, _ = Engine(target, None, cfg).generate(prompts, SamplingParams(max_tokens=20))
    for name, mode in (
        ("dflash", Mode.DFLASH),
        ("dcoco", Mode.DCOCO),
        ("dcoco-frozen", Mode.DCOCO),
    ):
        drafter = load_drafter(out / name)
        assert drafter.config.mask_token_id == tokenizer.token_id(MASK)
        assert (drafter.corrector is None) == (name == "dflash")
        assert drafter.mask_embedding is not None
        engine = Engine(target, drafter, EngineConfig(**{**cfg.__dict__, "mode": mode}))
        spec, _ = engine.generate(prompts, SamplingParams(max_tokens=20))
        assert [c.token_ids for c in spec] == [c.token_ids for c in vanilla]
    # joint training moved the drafter; the frozen variant kept the DFlash weights exactly
    dflash, joint, frozen = (load_drafter(out / n) for n in ("dflash", "dcoco", "dcoco-frozen"))
    weight = "layers.0.mlp.up_proj.weight"
    assert torch.equal(dflash.state_dict()[weight], frozen.state_dict()[weight])
    assert not torch.equal(dflash.state_dict()[weight], joint.state_dict()[weight])
    manifest = json.loads((out / "training.json").read_text())
    assert set(manifest["stages"]) == set(STAGE_NAMES)
    assert all(stage["seconds"] < stage["budget_s"] for stage in manifest["stages"].values())


def test_a_rerun_skips_what_is_up_to_date_and_redoes_what_is_asked(
    smoke: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = markers(smoke)
    capsys.readouterr()
    assert main(train(smoke)) == 0
    printed = capsys.readouterr().out
    assert all(f"[{name}] up to date" in printed for name in STAGE_NAMES)
    assert markers(smoke) == before
    assert main(train(smoke, "--rerun", "dflash")) == 0
    printed = capsys.readouterr().out
    after = markers(smoke)
    for name in ("corpus", "tokenizer", "target", "distill"):
        assert f"[{name}] up to date" in printed
        assert after[name] == before[name]
    for name in ("dflash", "dcoco", "dcoco-frozen"):  # dflash and everything built on it
        assert f"[{name}] running" in printed
    assert load_drafter(smoke / "out" / "dcoco").corrector is not None


def test_an_interrupted_stage_runs_again_with_everything_after_it(
    smoke: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (smoke / "work" / "distill" / MARKER).unlink()  # as if killed during the stage
    capsys.readouterr()
    assert main(train(smoke)) == 0
    printed = capsys.readouterr().out
    assert "[target] up to date" in printed
    for name in ("distill", "dflash", "dcoco", "dcoco-frozen"):
        assert f"[{name}] running" in printed


def test_the_training_loop_stops_when_its_budget_is_spent() -> None:
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def step() -> dict[str, torch.Tensor]:
        time.sleep(0.05)
        loss = (weight - 1).pow(2).sum()
        loss.backward()
        return {"loss": loss.detach()}

    started = time.perf_counter()
    result = train_loop("test", Budget(0.3, 10**6, 0), optimizer, step)
    assert 2 <= result.steps <= 8
    assert time.perf_counter() - started < 1.0
    assert optimizer.param_groups[0]["lr"] == 0.1  # the peak is restored for a later phase


def test_a_pretrained_target_skips_its_stages_and_keeps_features(
    smoke: Path, tmp_path: Path
) -> None:
    """The SmolLM2 recipe at smoke size, on the smoke run's target as the "pretrained" one:
    ShareGPT prompts for prose, features kept from generation, a drafting vocabulary, only
    drafters exported."""
    from dataclasses import replace

    from dcoco.train.config import SMOKE
    from dcoco.train.data import Continuations
    from dcoco.train.pipeline import run_pipeline
    from dcoco.train.stages import CONTINUATIONS

    target_dir = smoke / "out" / "target"
    cfg = replace(
        SMOKE,
        target_path=str(target_dir),
        corpus=replace(SMOKE.corpus, chat_prompts=40),
        distill=replace(SMOKE.distill, keep_features=True),
        drafter=replace(SMOKE.drafter, train_vocab=100),
    )
    manifest = run_pipeline(cfg, tmp_path / "work", tmp_path / "out")
    assert list(manifest["stages"]) == ["corpus", "distill", "dflash", "dcoco", "dcoco-frozen"]
    assert not (tmp_path / "out" / "target").exists()
    chat = (tmp_path / "work" / "corpus" / "prose.train.jsonl").read_text().splitlines()
    assert chat
    assert all(json.loads(line)["key"].startswith("sharegpt:") for line in chat)
    data = Continuations.load(tmp_path / "work" / "distill" / CONTINUATIONS)
    assert data.features is not None
    assert data.feature_layers == cfg.drafter.target_layer_ids
    target = load_target(target_dir)
    rows = torch.arange(3)  # [3]
    width = int(data.lengths[rows].max())
    kept = data.batch_features(rows, width)  # [3, T, F]
    with torch.no_grad():
        positions = torch.arange(width).expand(3, width)  # [3, T]
        _, direct = target(data.tokens[rows, :width], positions, feature_layers=data.feature_layers)
    assert direct is not None
    for row in range(3):
        known = int(data.lengths[row]) - 1
        torch.testing.assert_close(kept[row, :known], direct[row, :known], rtol=1e-4, atol=1e-4)
        assert not kept[row, known:].any()
    drafters = [load_drafter(tmp_path / "out" / n) for n in ("dflash", "dcoco", "dcoco-frozen")]
    assert all(d.config.target_layer_ids == (0, 1) for d in drafters)
    vocabs = [d.vocab_ids for d in drafters]
    assert vocabs[0] is not None
    assert len(vocabs[0]) == 100
    assert all(v is not None and torch.equal(v, vocabs[0]) for v in vocabs)
    for drafter in drafters:  # the head rows are the target's, for the tokens d2t names
        assert drafter.lm_head is not None
        torch.testing.assert_close(drafter.lm_head.weight, target.lm_head.weight[vocabs[0]])
