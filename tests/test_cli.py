import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cli_checks import one_line
from dcoco.checkpoint import save_drafter, save_target
from dcoco.cli import main
from dcoco.model.causal_lm import CausalLM
from dcoco.spec.drafter import DFlashDrafter
from dcoco.tokenizer import MASK, Tokenizer, save_tokenizer, train_tokenizer
from factories import drafter_config, target_config

TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The cat sat on the mat.",
    "x = [i * i for i in range(10)]",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    save_tokenizer(train_tokenizer(TEXTS * 20, vocab_size=300), root / "target")
    vocab = Tokenizer.from_dir(root / "target").vocab_size
    torch.manual_seed(0)
    target = CausalLM(target_config(vocab=vocab)).eval()
    save_target(target, root / "target")
    mask = Tokenizer.from_dir(root / "target").token_id(MASK)
    from dataclasses import replace

    for name, top_k in (("dcoco", 4), ("dflash", None)):
        cfg = replace(drafter_config(target, top_k=top_k), mask_token_id=mask)
        save_drafter(DFlashDrafter(cfg), root / name)
    (root / "prompts.jsonl").write_text(
        "\n".join(json.dumps({"prompt": p}) for p in ["def add(", "The cat", "x = ["]) + "\n"
    )
    return {
        "target": root / "target",
        "dcoco": root / "dcoco",
        "dflash": root / "dflash",
        "prompts": root / "prompts.jsonl",
    }


def generate(models: dict[str, Path], *extra: str) -> list[str]:
    return ["generate", "--target", str(models["target"]), "--max-tokens", "12", *extra]


def test_json_output_per_prompt_with_statistics(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = generate(
        models, "--drafter", str(models["dcoco"]), "--prompts", str(models["prompts"]), "--json"
    )
    assert main(args) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["def add(", "The cat", "x = ["]
    for record in records:
        assert len(record["token_ids"]) == 12
        assert isinstance(record["text"], str)
        assert record["finish_reason"] == "length"
        stats = record["stats"]
        assert stats["verifications"] >= 1
        assert len(stats["accepted_per_position"]) == 4
        assert set(stats["seconds"]) == {"draft", "correct", "verify", "total"}
        assert stats["mean_accepted_length"] >= 1.0


@pytest.mark.parametrize("mode", ["dflash", "dcoco"])
def test_speculative_modes_print_what_vanilla_prints(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    assert (
        main(generate(models, "--mode", "vanilla", "--prompt", "The cat", "--json", "--chat")) == 0
    )
    vanilla = json.loads(capsys.readouterr().out)
    assert (
        main(
            generate(
                models,
                "--mode",
                mode,
                "--drafter",
                str(models[mode]),
                "--prompt",
                "The cat",
                "--json",
                "--chat",
            )
        )
        == 0
    )
    speculative = json.loads(capsys.readouterr().out)
    assert speculative["token_ids"] == vanilla["token_ids"]
    assert vanilla["prompt_tokens"] > len(Tokenizer.from_dir(models["target"]).encode("The cat"))


def test_seeded_sampling_is_reproducible(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    args = generate(
        models,
        "--drafter",
        str(models["dcoco"]),
        "--prompt",
        "x",
        "--temperature",
        "1",
        "--seed",
        "5",
        "--json",
    )
    outputs = []
    for _ in range(2):
        assert main(args) == 0
        outputs.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert outputs[0] == outputs[1]


def bad_jsonl(models: dict[str, Path], content: str) -> str:
    path = models["prompts"].parent / "bad.jsonl"
    path.write_text(content)
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--target", "t"], "--prompt"),
        (["generate", "--target", "t", "--prompt", "x", "--max-tokens", "0"], "at least 1"),
        (["bench", "--url", "http://127.0.0.1:1", "--repeats", "0"], "must be at least 1"),
        (["bench", "--url", "http://127.0.0.1:1", "--repeats", "x"], "--repeats"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    one_line(capsys.readouterr().err, message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            lambda m: [
                "generate",
                "--target",
                "/nonexistent",
                "--prompt",
                "x",
                "--mode",
                "vanilla",
            ],
            "tokenizer.json",
        ),
        (lambda m: generate(m, "--prompt", "x"), "needs --drafter"),
        (
            lambda m: generate(m, "--prompt", "x", "--mode", "vanilla", "--temperature", "-1"),
            "temperature",
        ),
        (lambda m: generate(m, "--prompt", "x", "--drafter", str(m["dflash"])), "corrector"),
        (
            lambda m: generate(
                m, "--prompt", "x", "--drafter", str(m["target"]), "--mode", "dflash"
            ),
            "architectures",
        ),
        (
            lambda m: generate(
                m, "--prompts", bad_jsonl(m, '{"prompt": "a"}\n{oops\n'), "--mode", "vanilla"
            ),
            "bad.jsonl:2: not valid JSON",
        ),
        (
            lambda m: generate(
                m, "--prompts", bad_jsonl(m, '{"text": "a"}\n'), "--mode", "vanilla"
            ),
            'string "prompt"',
        ),
        (
            lambda m: generate(m, "--prompts", bad_jsonl(m, "\n\n"), "--mode", "vanilla"),
            "no prompts",
        ),
        (lambda m: generate(m, "--prompt", "word " * 3000, "--mode", "vanilla"), "context holds"),
    ],
)
def test_bad_input_exits_1_with_one_line(
    models: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    args: Callable[[dict[str, Path]], list[str]],
    message: str,
) -> None:
    assert main(args(models)) == 1
    one_line(capsys.readouterr().err, message)


def test_the_installed_entry_point_reports_errors_without_a_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcoco",
            "generate",
            "--target",
            str(tmp_path),
            "--prompt",
            "x",
            "--mode",
            "vanilla",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("dcoco generate: error:")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["DCOCO_LOOKUP", "DCOCO_ADAPTIVE"])
def test_a_setting_that_is_not_a_boolean_stops_the_worker_with_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, "maybe")
    assert main(["worker"]) == 1
    one_line(capsys.readouterr().err, "valid boolean")
