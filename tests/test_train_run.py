"""The long training run at toy size on the tiny pair: a leg makes teacher-forced then
self-distilled shards, trains, checkpoints, exports and resumes where it stopped, a signal
included; a bad state stops it with one line; evaluated prompts never train."""

import json
import os
import shutil
import signal
from dataclasses import replace
from itertools import islice
from pathlib import Path

import pytest
import torch

from dcoco.checkpoint import CheckpointError, load_drafter, load_target
from dcoco.paths import DEFAULT_HELDOUT, SMOLLM2_MODELS, TINY_MODELS, TINY_TARGET
from dcoco.shared.errors import UsageError
from dcoco.suites import load_suite
from dcoco.tokenizer import Tokenizer
from dcoco.train import run as run_module
from dcoco.train.corpus_code import package_files
from dcoco.train.data import Continuations, Labels
from dcoco.train.run import run_leg, schedule
from dcoco.train.run_adopt import open_indices
from dcoco.train.run_config import Resample, RunConfig, StreamGrowth
from dcoco.train.run_data import Distiller, Position, shard_file
from dcoco.train.run_prompts import (
    Exclusions,
    RunPrompt,
    code_prompts,
    digest,
    domain_prompts,
    exhausted_domains,
    interleave,
    math_prompts,
    normalise,
    resampled,
    stream_of,
)
from dcoco.train.run_state import STATE_FILE, SUMMARY_FILE, read_summary

pytestmark = pytest.mark.slow


def toy_config(models: Path) -> RunConfig:
    base = RunConfig()
    return replace(
        base,
        target_path=str(TINY_TARGET),
        models_path=str(models),
        weights={"math": 1.0},
        math_problems=300,
        grown=None,
        batch_size=8,
        max_prompt_tokens=128,
        max_new_tokens=12,
        teacher_shards=2,  # shards 0 and 1, then self-distilled ones
        teacher_labels=Labels.AGREED,
        shard_sequences=8,
        corrector_every=2,
        window_shards=2,
        label_tokens_per_step=40,  # about 2 steps a DFlash shard
        checkpoint_every_s=0.0,
        drafter=replace(
            base.drafter, target_layer_ids=(1, 3), batch_size=2, anchors=4, warmup_steps=2
        ),
        corrector=replace(base.corrector, batch_size=2, anchors=4, warmup_steps=2, max_steps=3),
    )


@pytest.fixture
def models(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    for name in ("dflash", "dcoco", "dcoco-frozen", "heldout"):
        shutil.copytree(TINY_MODELS / name, folder / name)
    return folder


def test_a_leg_trains_exports_and_the_next_resumes(models: Path, tmp_path: Path) -> None:
    cfg, work = toy_config(models), tmp_path / "work"
    before = load_drafter(models / "dflash").state_dict()
    first = run_leg(cfg, work, hours=1.0, shards=4)
    summary = json.loads((models / SUMMARY_FILE).read_text())
    position = summary["position"]
    assert (first["from_step"], first["to_shard"], position["shards"]) == (0, 4, 4)
    assert set(first["sources"]) == {"teacher", "distilled"}
    assert 0 < position["teacher_tokens"] < position["label_tokens"] == first["to_tokens"]
    assert position["next_text"] >= 2 * 8  # two teacher-forced shards of 8 texts
    assert position["next_prompt"] >= 2 * 8  # two self-distilled shards of 8 answers
    assert position["answers"] == 4 * 8
    unlocked = (position["label_tokens"] - position["corrector_tokens"]) // 40
    assert first["to_step"] == summary["step"] == unlocked > 0  # every paid step trained
    assert first["dcoco"]["steps"] == 3
    assert first["dcoco-frozen"]["steps"] == 3
    after = load_drafter(models / "dflash").state_dict()
    assert not torch.equal(before["fc.weight"], after["fc.weight"])
    for name in ("dcoco", "dcoco-frozen"):
        assert load_drafter(models / name).corrector is not None
    assert [leg["leg"] for leg in summary["legs"]] == [1]

    second = run_leg(cfg, work, hours=1.0, shards=2)  # the local checkpoint
    assert second["stream"] == first["stream"]  # the same prompts at the same positions
    assert (second["leg"], second["from_step"], second["from_shard"]) == (2, first["to_step"], 4)
    assert set(second["sources"]) == {"distilled"}
    assert second["to_step"] > first["to_step"]  # shard 4 pays for steps, shard 5 does not
    (work / STATE_FILE).unlink()  # a new machine: only what was committed
    third = run_leg(cfg, work, hours=1.0, shards=2)
    assert (third["leg"], third["from_step"], third["from_shard"]) == (3, second["to_step"], 6)
    last = json.loads((models / SUMMARY_FILE).read_text())["position"]
    assert last["next_prompt"] >= 6 * 8  # at least every answer written, none handed out twice
    assert last["next_text"] == position["next_text"]  # no teacher-forced shard after shard 1


def test_teacher_forced_legs_read_the_text_stream_on(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """...and a leg whose stream is not the last leg's says so."""
    cfg = replace(toy_config(models), teacher_shards=100, teacher_labels=Labels.ARGMAX)
    work = tmp_path / "work"
    first = run_leg(cfg, work, hours=1.0, shards=2)
    summary = json.loads((models / SUMMARY_FILE).read_text())
    after_first = summary["position"]
    summary["legs"][-1]["stream"]["digest"] = "another machine"
    (models / SUMMARY_FILE).write_text(json.dumps(summary))
    (work / STATE_FILE).unlink()
    assert "warning" not in capsys.readouterr().out
    second = run_leg(cfg, work, hours=1.0, shards=2)
    assert "[run] warning: this machine's prompt stream" in capsys.readouterr().out
    after_second = json.loads((models / SUMMARY_FILE).read_text())["position"]
    assert set(first["sources"]) == set(second["sources"]) == {"teacher"}
    assert 16 <= after_first["next_text"] < after_second["next_text"]
    assert after_second["next_prompt"] == 0  # no engine ever ran
    assert after_second["teacher_tokens"] == after_second["label_tokens"]


def test_a_leg_without_a_kept_shard_ships_dflash_and_keeps_the_correctors(
    models: Path, tmp_path: Path
) -> None:
    cfg = replace(toy_config(models), teacher_shards=100)
    kept = {
        name: (models / name / "model.safetensors").read_bytes()
        for name in ("dcoco", "dcoco-frozen")
    }
    dflash = (models / "dflash" / "model.safetensors").read_bytes()
    record = run_leg(cfg, tmp_path / "work", hours=1.0, shards=1)  # shard 0 is DFlash's
    assert record["correctors"] == "not refitted: no kept shard yet"
    assert record["to_step"] > 0
    assert (models / "dflash" / "model.safetensors").read_bytes() != dflash
    for name, weights in kept.items():
        assert (models / name / "model.safetensors").read_bytes() == weights


def test_an_adopted_shard_joins_the_run_and_its_prompts_are_not_answered_again(
    models: Path, tmp_path: Path
) -> None:
    cfg = replace(toy_config(models), teacher_shards=0)
    elsewhere = tmp_path / "elsewhere"
    run_leg(cfg, elsewhere, hours=1.0, shards=1)
    made = shard_file(elsewhere, 0)
    (models / SUMMARY_FILE).unlink()  # a run that never saw it
    work = tmp_path / "work"
    record = run_leg(cfg, work, hours=1.0, shards=1, adopted=(made,))
    assert record["adopted"] == [{"file": str(made), "answers": 8}]
    position = json.loads((models / SUMMARY_FILE).read_text())["position"]
    assert position["shards"] == 2
    adopted, fresh = (
        Continuations.load(shard_file(work, 0)),
        Continuations.load(shard_file(work, 1)),
    )
    assert torch.equal(adopted.tokens, Continuations.load(made).tokens)

    def prompts(shard: Continuations) -> set[tuple[int, ...]]:
        return {
            tuple(t[: int(n)].tolist())
            for t, n in zip(shard.tokens, shard.prompt_lens, strict=True)
        }

    assert not prompts(adopted) & prompts(fresh)


def test_a_shard_from_another_stream_or_source_is_refused(models: Path, tmp_path: Path) -> None:
    cfg = replace(toy_config(models), teacher_shards=0)
    teacher = replace(cfg, teacher_shards=100)
    run_leg(teacher, tmp_path / "taught", hours=1.0, shards=1)
    (models / SUMMARY_FILE).unlink()
    with pytest.raises(CheckpointError, match="not a self-distilled shard"):
        run_leg(
            cfg,
            tmp_path / "work",
            hours=1.0,
            shards=1,
            adopted=(shard_file(tmp_path / "taught", 0),),
        )
    (models / SUMMARY_FILE).unlink(missing_ok=True)
    run_leg(cfg, tmp_path / "other", hours=1.0, shards=1)
    (models / SUMMARY_FILE).unlink()
    other = replace(cfg, seed=1)  # another shuffle of the stream: its answers are elsewhere
    with pytest.raises(CheckpointError, match="answer no prompt this run has still to answer"):
        run_leg(
            other,
            tmp_path / "work2",
            hours=1.0,
            shards=1,
            adopted=(shard_file(tmp_path / "other", 0),),
        )


def test_a_corrupt_or_foreign_state_stops_the_run(models: Path, tmp_path: Path) -> None:
    cfg, work = toy_config(models), tmp_path / "work"
    work.mkdir()
    (work / STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        run_leg(cfg, work, hours=1.0, shards=1)
    (work / STATE_FILE).unlink()
    (models / SUMMARY_FILE).write_text(
        json.dumps({"fingerprint": "0" * 16, "step": 3, "position": {}, "legs": []})
    )
    with pytest.raises(CheckpointError, match="other run settings") as caught:
        run_leg(cfg, work, hours=1.0, shards=1)
    assert "\n" not in str(caught.value)


def test_the_committed_run_resumes_with_the_run_settings_as_they_are() -> None:
    """A settings change that moves the fingerprint must move the committed summary too."""
    summary = read_summary(SMOLLM2_MODELS, RunConfig())
    assert summary is not None
    assert summary["config"] == json.loads(json.dumps(RunConfig().to_dict()))


def test_the_schedule_warms_up_after_each_resume_and_decays_over_the_leg() -> None:
    cfg = RunConfig()
    warm = cfg.drafter.warmup_steps
    assert schedule(0.0, 0, cfg) == pytest.approx(1 / warm)
    assert schedule(0.5, warm, cfg) == pytest.approx(0.55)
    assert schedule(0.5, 0, cfg) == pytest.approx(0.55 / warm)
    assert schedule(1.0, warm, cfg) == pytest.approx(0.1)
    assert schedule(1.3, warm, cfg) == pytest.approx(0.1)  # a late step stays at the floor


def test_evaluated_prompts_are_excluded_by_text_and_opening() -> None:
    suite = load_suite("gsm8k", DEFAULT_HELDOUT)
    excluded = Exclusions.of(suite.prompts)
    question = suite.prompts[0]
    assert excluded.excludes(question)
    assert excluded.excludes("  " + question.upper() + " Show your work.")
    assert not excluded.excludes("Olga has 61 balloons. How many does she have?")
    assert normalise(" A\n b ") == "a b"


def math_config(
    problems: int, grown: StreamGrowth | None = None, resample: Resample | None = None
) -> RunConfig:
    return replace(
        RunConfig(),
        models_path=str(TINY_MODELS),
        weights={"math": 1.0},
        math_problems=problems,
        test_percent=10.0,
        grown=grown,
        resample=resample,
    )


def test_no_training_prompt_is_an_evaluated_one() -> None:
    heldout = TINY_MODELS / "heldout"
    prompts = domain_prompts(math_config(2000), 2000, (), Path("unused"))["math"]
    held = {
        normalise(json.loads(line)["prompt"])
        for line in (heldout / "math.jsonl").read_text().splitlines()
    }
    assert held
    assert not held & {normalise(p.messages[-1]["content"]) for p in prompts}


def test_a_grown_stream_keeps_the_answered_head_then_gives_every_other_prompt_once() -> None:
    before = stream_of(math_config(300), Path("unused"))
    grown = stream_of(math_config(2000, StreamGrowth(50, 300, ())), Path("unused"))
    everything = stream_of(math_config(2000), Path("unused"))
    assert grown[:50] == before[:50]
    assert digest(grown) == digest(list(grown)) != digest(everything)
    assert grown[50:] != everything[50:]
    seen = [normalise(p.messages[-1]["content"]) for p in grown]
    assert len(seen) == len(set(seen)) == len(everything)  # nothing twice, nothing lost
    assert set(seen[50:]) > {normalise(p.messages[-1]["content"]) for p in before[50:]}


def asked(prompt: RunPrompt) -> str:
    return prompt.messages[-1]["content"]


def test_a_stream_goes_on_with_sampled_passes_over_every_prompt() -> None:
    greedy = stream_of(math_config(300), Path("unused"))
    passes = stream_of(math_config(300, resample=Resample(0.7, 2)), Path("unused"))
    assert passes[: len(greedy)] == greedy  # unchanged up to where the greedy prompts end
    rest = passes[len(greedy) :]
    assert {p.temperature for p in greedy} == {0.0}
    assert {p.temperature for p in rest} == {0.7}
    first, second = rest[: len(greedy)], rest[len(greedy) :]
    assert sorted(map(asked, first)) == sorted(map(asked, greedy))
    assert sorted(map(asked, second)) == sorted(map(asked, greedy))
    assert first != second  # each pass in its own order
    assert digest(passes) != digest(greedy)

    grown = stream_of(
        math_config(2000, StreamGrowth(50, 300, ()), Resample(1.0, 1)), Path("unused")
    )
    sampled = {asked(p) for p in grown if p.temperature}
    assert {asked(p) for p in grown[:50]} <= sampled  # the answered head's too


def test_a_domain_answered_greedily_goes_on_sampled_while_the_others_keep_their_order() -> None:
    math = list(math_prompts(400, 0))
    code = [replace(p, domain="code", key=f"c{i}") for i, p in enumerate(math[:100])]
    weights = {"math": 0.75, "code": 0.25}
    greedy = interleave({"math": math, "code": code}, weights, 0)
    again = resampled({"code": code}, Resample(1.0, 1), 0)
    order = interleave({"math": math, "code": code}, weights, 0, again)
    last_code = max(i for i, p in enumerate(greedy) if p.domain == "code")
    assert order[: last_code + 1] == greedy[: last_code + 1]
    assert exhausted_domains(order, last_code + 1, weights) == []
    after = [p for p in order[last_code + 1 :] if p.domain == "code"]
    assert len(after) == len(code)
    assert {p.temperature for p in after} == {1.0}


def test_a_sampled_prompt_is_answered_by_seeded_sampling(tmp_path: Path) -> None:
    """The same prompt greedy and in two sampled passes: the passes answer apart from the
    greedy answer, and a second distiller (a resumed leg) replays each exactly."""
    cfg = replace(math_config(10), batch_size=3, max_prompt_tokens=64, max_new_tokens=12)
    greedy = next(math_prompts(10, 0))
    hot = replace(greedy, temperature=5.0)  # the tiny target answers its math peaked at 1.0
    prompts = [greedy, hot, hot]

    def answers() -> list[list[int]]:
        distiller = Distiller(
            load_target(TINY_TARGET),
            Tokenizer.from_dir(TINY_TARGET),
            prompts,
            Position(),
            cfg,
            (1, 3),
        )
        while not distiller.exhausted or distiller.running:
            distiller.step()
        found = {index: answer.output for index, answer in distiller.finished}
        return [found[i] for i in range(3)]

    first = answers()
    assert first == answers()
    assert first[0] != first[1] != first[2] != first[0]


def test_an_adopted_answer_is_booked_at_its_prompts_first_open_occurrence() -> None:
    """A prompt answered greedily comes again in a sampled pass: an adopted answer to it books
    that later occurrence, and none that the run has answered already."""
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    first, other = islice(math_prompts(10, 0), 2)
    stream = [first, other, other, replace(first, temperature=1.0), first]

    def row(prompt: RunPrompt) -> tuple[int, ...]:
        return tuple(tokenizer.encode(tokenizer.render_chat(list(prompt.messages))))

    assert open_indices([row(first)], stream, tokenizer, Position(), 5) == [0]
    done = Position(next_prompt=2, redo=[1])  # 0 answered, 1 handed out and lost
    assert open_indices([row(first), row(other)], stream, tokenizer, done, 5) == [1, 3]
    assert open_indices([row(first)] * 3, stream, tokenizer, done, 5) == [3, 4]
    assert open_indices([row(first)], stream, tokenizer, done, 3) == []  # not in the window


def test_code_prompts_go_on_from_the_standard_library_into_the_named_packages() -> None:
    stdlib = list(islice(code_prompts((), 2400, 0), 50))
    extended = list(islice(code_prompts(("gguf",), 2400, 0), 50))
    assert stdlib == extended  # the standard library's come first, unchanged
    files = package_files(("gguf",))
    assert files
    assert all("gguf" in path.parts for path in files)
    keys = {p.key for p in code_prompts(("gguf",), 2400, 0)}
    assert any(key.startswith("gguf.") for key in keys)


def test_interleaving_keeps_every_prefix_near_the_weights() -> None:
    math = list(math_prompts(400, 0))
    code = [replace(p, domain="code", key=f"c{i}") for i, p in enumerate(math[:100])]
    order = interleave({"math": math, "code": code}, {"math": 0.75, "code": 0.25}, 0)
    assert len(order) == len(math) + len(code)
    assert sum(p.domain == "code" for p in order[:40]) == 10
    assert order == interleave({"math": math, "code": code}, {"math": 0.75, "code": 0.25}, 0)


def test_a_domain_the_stream_has_run_out_of_is_named_while_others_go_on() -> None:
    math = list(math_prompts(400, 0))
    code = [replace(p, domain="code", key=f"c{i}") for i, p in enumerate(math[:100])]
    weights = {"math": 0.75, "code": 0.25, "prose": 0.0}
    order = interleave({"math": math, "code": code}, weights, 0)
    last_code = max(i for i, p in enumerate(order) if p.domain == "code")
    assert exhausted_domains(order, last_code, weights) == []
    assert exhausted_domains(order, last_code + 1, weights) == ["code"]
    assert exhausted_domains(order, len(order), weights) == []  # the end: nothing left at all


def test_a_leg_refuses_a_stream_that_lost_a_weighted_domain(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past a domain's last prompt the stream holds the others alone: a leg would drift the
    drafters to them, so it stops with one line before answering anything."""
    cfg = replace(toy_config(models), weights={"math": 0.5, "code": 0.5})
    monkeypatch.setattr(run_module, "stream_of", lambda cfg: list(math_prompts(50, 0)))
    with pytest.raises(UsageError, match="no code prompts left from prompt 0") as caught:
        run_leg(cfg, tmp_path / "work", hours=1.0, shards=1)
    assert "\n" not in str(caught.value)
    assert not (models / SUMMARY_FILE).exists()


def test_a_signal_ends_the_leg_with_a_checkpoint_that_the_next_resumes(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, work = replace(toy_config(models), checkpoint_every_s=1e9), tmp_path / "work"
    shipped = load_drafter(models / "dflash").state_dict()
    written = run_module.write_shard

    def write_then_signal(folder: Path, index: int, shard: Continuations) -> None:
        written(folder, index, shard)
        if index == 2:  # as a session's end or a Ctrl-C would, mid-leg
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(run_module, "write_shard", write_then_signal)
    handler = signal.getsignal(signal.SIGTERM)
    stopped = run_leg(cfg, work, hours=1.0, shards=6)
    assert stopped["stopped"] == "SIGTERM"
    assert not (models / SUMMARY_FILE).exists()  # no leg recorded, nothing exported
    after = load_drafter(models / "dflash").state_dict()
    assert torch.equal(shipped["fc.weight"], after["fc.weight"])
    assert signal.getsignal(signal.SIGTERM) == handler  # the leg's own handler is gone

    monkeypatch.setattr(run_module, "write_shard", written)
    resumed = run_leg(cfg, work, hours=1.0, shards=1)  # from the checkpoint the signal wrote
    assert (resumed["leg"], resumed["from_shard"]) == (1, 3)
    assert resumed["from_step"] == stopped["to_step"] > 0
