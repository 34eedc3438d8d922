import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco.checkpoint import CheckpointError, load_drafter, load_target, save_drafter, save_target
from dcoco.engine.engine import Engine
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter
from factories import drafter_config, make_drafter, make_target

PROMPTS = [[1, 2, 3, 4], [5, 6]]


def run(target: torch.nn.Module, drafter: DFlashDrafter, mode: Mode) -> list[list[int]]:
    eng = Engine(target, drafter, EngineConfig(mode=mode, max_model_len=64))  # type: ignore[arg-type]
    completions, _ = eng.generate(PROMPTS, SamplingParams(max_tokens=20, temperature=0.8, seed=3))
    return [c.token_ids for c in completions]


@pytest.mark.parametrize("with_corrector", [True, False])
def test_drafter_round_trip_gives_identical_outputs(tmp_path: Path, with_corrector: bool) -> None:
    target = make_target()
    drafter = make_drafter(target, top_k=4 if with_corrector else None)
    drafter.mask_embedding = torch.randn(target.config.hidden_size)
    save_drafter(drafter, tmp_path)
    loaded = load_drafter(tmp_path)
    mode = Mode.DCOCO if with_corrector else Mode.DFLASH
    assert run(target, loaded, mode) == run(target, drafter, mode)
    assert loaded.config == drafter.config
    torch.testing.assert_close(loaded.mask_embedding, drafter.mask_embedding)


def test_drafter_files_follow_the_vllm_dflash_layout(tmp_path: Path) -> None:
    target = make_target()
    save_drafter(make_drafter(target), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["DCOCODraftModel"]  # exactly one, or vLLM falls back to DFlash
    assert raw["block_size"] == 4
    assert raw["dflash_config"] == {"mask_token_id": 15, "target_layer_ids": [0, 1]}
    assert raw["dcoco_config"]["top_k"] == 4
    names = load_file(str(tmp_path / "model.safetensors")).keys()
    assert {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.0.self_attn.q_proj.weight",
    } <= names
    assert not any(
        n.startswith("model.") or n.startswith("lm_head") or "embed_tokens" in n for n in names
    )
    assert any(n.startswith("corrector.") for n in names)


def test_a_drafting_vocabulary_follows_vllms_d2t_layout(tmp_path: Path) -> None:
    """config draft_vocab_size, an own lm_head [V', H] and int64 d2t offsets, as EAGLE-3 ships;
    vLLM's own spelling of "the whole vocabulary" (draft_vocab_size = V) reads as no reduction."""
    target = make_target()
    ids = torch.tensor([2, 3, 5, 7, 11])  # [V']
    save_drafter(make_drafter(target).with_vocab(ids, target.lm_head.weight), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["draft_vocab_size"] == 5
    state = load_file(str(tmp_path / "model.safetensors"))
    assert state["lm_head.weight"].shape == (5, target.config.hidden_size)
    assert state["d2t"].dtype == torch.int64
    assert (torch.arange(5) + state["d2t"]).tolist() == ids.tolist()
    raw["draft_vocab_size"] = target.config.vocab_size
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"unexpected \['d2t', 'lm_head.weight'\]"):
        load_drafter(tmp_path)


def test_target_round_trip(tmp_path: Path) -> None:
    target = make_target()
    save_target(target, tmp_path, {"eos_token_id": 2})
    loaded = load_target(tmp_path)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    positions = torch.arange(5).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(ids, positions)[0], target(ids, positions)[0], rtol=0, atol=0
        )
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == 2


def corrupt(folder: Path, how: str) -> None:
    config = folder / "config.json"
    weights = folder / "model.safetensors"
    raw = json.loads(config.read_text())
    if how == "no config":
        config.unlink()
    elif how == "bad json":
        config.write_text("{not json")
    elif how == "two architectures":
        raw["architectures"] = ["DCOCODraftModel", "DFlashDraftModel"]
        config.write_text(json.dumps(raw))
    elif how == "no dflash_config":
        del raw["dflash_config"]
        config.write_text(json.dumps(raw))
    elif how == "no weights":
        weights.unlink()
    elif how == "garbage weights":
        weights.write_bytes(b"\x00" * 64)
    elif how == "missing tensor":
        state = load_file(str(weights))
        del state["fc.weight"]
        save_file(state, str(weights))
    elif how == "wrong shape":
        raw["intermediate_size"] = 40
        config.write_text(json.dumps(raw))
    elif how == "draft vocabulary too large":
        raw["draft_vocab_size"] = 10**6
        config.write_text(json.dumps(raw))
    elif how == "draft vocabulary without its head":
        raw["draft_vocab_size"] = 8
        config.write_text(json.dumps(raw))
    elif how == "d2t outside the vocabulary":
        state = load_file(str(weights))
        state["d2t"] = state["d2t"] + 10**6
        save_file(state, str(weights))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("no config", "no config.json"),
        ("bad json", "not valid JSON"),
        ("two architectures", "architectures must be"),
        ("no dflash_config", "lacks 'mask_token_id'"),
        ("no weights", "no model.safetensors"),
        ("garbage weights", "unreadable"),
        ("missing tensor", "missing \\['fc.weight'\\]"),
        ("wrong shape", "has shape"),
        ("draft vocabulary too large", "draft_vocab_size must be in"),
        ("draft vocabulary without its head", "missing \\['d2t', 'lm_head.weight'\\]"),
        ("d2t outside the vocabulary", "d2t maps columns outside"),
    ],
)
def test_bad_drafter_folders_name_the_problem(tmp_path: Path, how: str, message: str) -> None:
    target = make_target()
    drafter = DFlashDrafter(drafter_config(target))
    if how.startswith("d2t"):
        drafter = drafter.with_vocab(torch.arange(8), target.lm_head.weight)
    save_drafter(drafter, tmp_path)
    corrupt(tmp_path, how)
    with pytest.raises(CheckpointError, match=message):
        load_drafter(tmp_path)


def test_bad_target_folders_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        load_target(tmp_path / "absent")
    save_target(make_target(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(raw | {"rope_scaling": {"type": "yarn"}}))
    with pytest.raises(CheckpointError, match="rope_scaling"):
        load_target(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(raw | {"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match=r"is not \['Qwen3ForCausalLM'\]"):
        load_target(tmp_path)  # a Qwen3 config that calls itself Llama
    (tmp_path / "config.json").write_text(json.dumps(raw | {"model_type": "mistral"}))
    with pytest.raises(CheckpointError, match="model_type 'mistral' is not supported"):
        load_target(tmp_path)
