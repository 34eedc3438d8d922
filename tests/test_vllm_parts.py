"""The vLLM side's pure parts, without vLLM: draft selection and its bookkeeping, the V2 score
layout, the CPU kernel fix, drafter export, settings and engine arguments, the metrics
plumbing and the import layering."""

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from cli_checks import one_line
from dcoco.checkpoint import CheckpointError, load_drafter, save_drafter, save_target
from dcoco.cli import main
from dcoco.model.causal_lm import CausalLM
from dcoco.settings import WorkerSettings
from dcoco.shared.options import Mode, Rule
from dcoco.spec.drafter import DCOCO_ARCHITECTURE, DFLASH_ARCHITECTURE, DFlashDrafter
from dcoco.spec.planner import VerifyPlanner
from dcoco.spec.select import Candidates, prefix_first, select
from dcoco.vllm import cpu_fixes, plugin, versions
from dcoco.vllm.engine_args import prepare_drafter
from dcoco.vllm.export import ExportOptions, export_drafter
from dcoco.vllm.metrics import PLUGIN_SERIES, PluginCollector
from dcoco.vllm.runtime import DCOCORuntime, SelectionConfig
from dcoco.worker.metrics import WorkerMetrics
from factories import make_drafter, make_target

SERVICE = Path(__file__).parents[1] / "service" / "dcoco"


class Sink:
    def __init__(self) -> None:
        self.cycles: list[tuple[int, int, dict[str, float]]] = []

    def record(self, corrected: int, rescued: int, seconds: dict[str, float]) -> None:
        self.cycles.append((corrected, rescued, seconds))


@pytest.fixture(scope="module")
def pair() -> tuple[CausalLM, DFlashDrafter]:
    target = make_target()
    return target, make_drafter(target, block=4, top_k=4)


@pytest.fixture(scope="module")
def folders(
    tmp_path_factory: pytest.TempPathFactory, pair: tuple[CausalLM, DFlashDrafter]
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    target, drafter = pair
    save_target(target, root / "target")
    save_drafter(drafter, root / "dcoco")
    return {"target": root / "target", "dcoco": root / "dcoco"}


def test_versions() -> None:
    assert versions.parse("0.32.0+cpu") == (0, 32, 0)
    assert versions.parse("0.33.1rc1.dev4") == (0, 33, 1)
    versions.check("0.32.0")
    versions.check("0.33.9")
    for bad in ("0.31.9", "0.34.0", "1.0.0", "nonsense"):
        with pytest.raises(versions.UnsupportedVllm):
            versions.check(bad)


def test_the_plugin_names_and_imports_stay_light() -> None:
    assert (DCOCO_ARCHITECTURE, f"DFlash{DCOCO_ARCHITECTURE}") == plugin.ARCHITECTURES
    code = (
        "import sys, dcoco.vllm.plugin\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_selection_config_from_the_checkpoint() -> None:
    raw = {"dcoco_config": {"top_k": 16}}
    assert SelectionConfig.from_hf(raw) == SelectionConfig(16)
    chosen = raw | {"dcoco_selection": {"top_k": 4, "rule": "global", "gamma": 0.7}}
    assert SelectionConfig.from_hf(chosen) == SelectionConfig(4, Rule.GLOBAL, 0.7)
    for bad in (
        {},
        raw | {"dcoco_selection": {"rule": "best"}},
        raw | {"dcoco_selection": {"gamma": 2}},
    ):
        with pytest.raises(ValueError, match="dcoco"):
            SelectionConfig.from_hf(bad)


def test_the_runtime_drafts_what_the_corrector_and_rule_pick(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    target, drafter = pair
    assert drafter.corrector is not None
    torch.manual_seed(0)
    hidden = torch.randn(3, 4, target.config.hidden_size)  # [R, B, H]
    logits = target.logits(hidden)  # [R, B, V]
    embed = target.model.embed_tokens.weight
    for rule in Rule:
        runtime = DCOCORuntime(drafter.corrector, SelectionConfig(4, rule, 0.5))
        chosen = runtime.draft(hidden, logits, embed)
        with torch.inference_mode():
            cands = Candidates.top_k(logits, 4)
            expected = select(
                rule, drafter.corrector(hidden, cands.ids, cands.logits, embed), cands
            )
        assert torch.equal(chosen.tokens, expected.tokens)
        assert runtime.latest is not None
        assert runtime.latest.tolist() == (expected.index != 0).tolist()


def test_a_reduced_vocabulary_drafts_as_upstreams_scattered_logits_would(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    """Top-K over the V' columns with their token ids equals top-K over vLLM's compute_logits,
    which scatters them into the whole vocabulary with -inf elsewhere."""
    target, drafter = pair
    assert drafter.corrector is not None
    vocab = target.config.vocab_size
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(2))[: vocab // 3]
    ids = ids.sort().values  # [V']
    torch.manual_seed(0)
    hidden = torch.randn(3, 4, target.config.hidden_size)  # [R, B, H]
    full = target.logits(hidden)  # [R, B, V]
    scattered = torch.full_like(full, float("-inf"))  # [R, B, V]
    scattered[..., ids] = full[..., ids]
    embed = target.model.embed_tokens.weight
    runtime = DCOCORuntime(drafter.corrector, SelectionConfig(4))
    reduced = runtime.draft(hidden, full[..., ids], embed, ids)
    upstream = runtime.draft(hidden, scattered, embed)
    assert torch.equal(reduced.tokens, upstream.tokens)
    assert set(reduced.tokens.flatten().tolist()) <= set(ids.tolist())


def test_the_v2_score_layout_walks_like_prefix_first(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    """vLLM's walk starts at candidate 0, reads row (p, previous) and takes its argmax."""
    target, drafter = pair
    assert drafter.corrector is not None
    runtime = DCOCORuntime(drafter.corrector, SelectionConfig(4))
    torch.manual_seed(1)
    hidden = torch.randn(5, 4, target.config.hidden_size)  # [R, B, H]
    embed = target.model.embed_tokens.weight
    with torch.inference_mode():
        cands = Candidates.top_k(target.logits(hidden), 4)  # [R, B, K]
        scores = runtime.transition_scores(hidden, cands.ids, cands.logits, embed)  # [R, B, K, K]
        pairs = drafter.corrector(hidden, cands.ids, cands.logits, embed)  # [R, B-1, K, K]
    assert scores.shape == (5, 4, 4, 4)
    walk = torch.zeros(5, 4, dtype=torch.long)  # [R, B]
    previous = torch.zeros(5, dtype=torch.long)  # [R]
    for p in range(4):
        walk[:, p] = scores[torch.arange(5), p, previous].argmax(-1)  # [R]
        previous = walk[:, p]
    assert torch.equal(walk, prefix_first(pairs))
    assert (walk[:, 0] == 0).all()  # slot 0 keeps the drafter's top-1


def test_settle_counts_corrected_and_rescued_tokens_per_request() -> None:
    sink = Sink()
    runtime = DCOCORuntime(corrector=None, selection=SelectionConfig(4), sink=sink)  # type: ignore[arg-type]
    runtime.start_step(10.0)
    runtime.latest = torch.tensor([[False, True, True, False], [True, False, False, True]])
    runtime.settle(["a", "b"], [[1], [2]], None, 10.5)  # a prefill step: nothing verified
    assert sink.cycles == []
    assert runtime.pending == {"a": [False, True, True, False], "b": [True, False, False, True]}
    runtime.start_step(11.0)
    runtime.times.draft, runtime.times.correct = 0.2, 0.1
    # b now comes first; a accepted 2 drafted tokens (+ bonus), b accepted 0
    runtime.settle(["b", "a"], [[7], [5, 6, 8]], [4, 4], 11.5)
    corrected, rescued, seconds = sink.cycles[0]
    assert (corrected, rescued) == (4, 1)  # a's slot 1 was corrected and accepted
    assert seconds == pytest.approx({"draft": 0.2, "correct": 0.1, "verify": 0.2, "total": 0.5})


def test_the_cpu_expand_fix_writes_floats_and_ints() -> None:
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    temperature = torch.tensor([0.0, 0.7, 1.3])
    out = torch.full((6,), float("nan"))
    cpu_fixes.expand(out, temperature, cu, 0, 1)
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7, 0.7, 1.3])
    top_k = torch.tensor([0, 5, 9])
    ints = torch.zeros(6, dtype=torch.int64)
    cpu_fixes.expand(ints, top_k, cu, 0, 0)
    assert ints.tolist() == [0, 0, 5, 5, 5, 9]


def test_the_expand_fix_lands_after_the_platform_s_own_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's worker loads plugins, then lets the platform register its CPU kernels, which
    would replace the fix: it is registered again after them, once however often asked."""
    registered: list[str] = []

    class Platform:
        @staticmethod
        def is_cpu() -> bool:
            return True

        @classmethod
        def register_triton_kernel_overrides(cls) -> None:
            registered.append("platform")

    platforms = SimpleNamespace(current_platform=Platform())
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(platforms=platforms))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(cpu_fixes, "install", lambda: registered.append("ours"))
    cpu_fixes.install_after_platform()
    cpu_fixes.install_after_platform()  # register() runs more than once in a process
    assert registered == ["ours", "ours"]
    Platform().register_triton_kernel_overrides()
    assert registered[2:] == ["platform", "ours"]


def test_export_both_formats(folders: dict[str, Path], tmp_path: Path) -> None:
    source = load_drafter(folders["dcoco"])
    export_drafter(folders["dcoco"], tmp_path / "d", ExportOptions(top_k=2, rule=Rule.DISCOUNTED))
    raw = json.loads((tmp_path / "d" / "config.json").read_text())
    assert raw["architectures"] == [DCOCO_ARCHITECTURE]
    assert raw["dcoco_selection"] == {"top_k": 2, "rule": "discounted", "gamma": 0.5}
    assert SelectionConfig.from_hf(raw) == SelectionConfig(2, Rule.DISCOUNTED, 0.5)
    exported = load_drafter(tmp_path / "d")
    for name, tensor in source.state_dict().items():
        assert torch.equal(tensor, exported.state_dict()[name]), name
    export_drafter(folders["dcoco"], tmp_path / "p", ExportOptions(format="dflash"))
    plain = load_drafter(tmp_path / "p")
    assert plain.config.architecture == DFLASH_ARCHITECTURE
    assert plain.corrector is None
    kept = {k: v for k, v in source.state_dict().items() if not k.startswith("corrector.")}
    assert kept.keys() == plain.state_dict().keys()
    with pytest.raises(ValueError, match="not empty"):
        export_drafter(folders["dcoco"], tmp_path / "p", ExportOptions())
    with pytest.raises(ValueError, match="exceeds"):
        export_drafter(folders["dcoco"], tmp_path / "k", ExportOptions(top_k=9))
    with pytest.raises(CheckpointError, match="no corrector"):
        export_drafter(tmp_path / "p", tmp_path / "x", ExportOptions())


def test_the_plain_export_keeps_a_drafting_vocabulary(tmp_path: Path) -> None:
    """Mode dflash on a reduced-vocabulary DCOCO drafter: stock vLLM still gets d2t and the
    drafter's own head rows."""
    target = make_target()
    ids = torch.arange(0, target.config.vocab_size, 2)  # [V']
    reduced = make_drafter(target).with_vocab(ids, target.lm_head.weight)
    save_drafter(reduced, tmp_path / "src")
    export_drafter(tmp_path / "src", tmp_path / "p", ExportOptions(format="dflash"))
    plain = load_drafter(tmp_path / "p")
    assert plain.corrector is None
    assert plain.vocab_ids is not None
    assert plain.vocab_ids.tolist() == ids.tolist()
    assert json.loads((tmp_path / "p" / "config.json").read_text())["draft_vocab_size"] == len(ids)


def test_export_drafter_command_errors_are_one_line(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{nope")
    cases = [
        (["--drafter", str(tmp_path / "none"), "--out", str(tmp_path / "o")], "not a directory"),
        (["--drafter", str(tmp_path / "broken"), "--out", str(tmp_path / "o")], "not valid JSON"),
        (
            ["--drafter", str(folders["dcoco"]), "--out", str(tmp_path / "o"), "--gamma", "3"],
            "gamma",
        ),
        (
            ["--drafter", str(folders["dcoco"]), "--out", str(tmp_path / "o"), "--top-k", "99"],
            "exceeds",
        ),
    ]
    for args, message in cases:
        assert main(["export-drafter", *args]) == 1
        one_line(capsys.readouterr().err, message)
    assert (
        main(["export-drafter", "--drafter", str(folders["dcoco"]), "--out", str(tmp_path / "ok")])
        == 0
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [("{bad", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ('"x"', "JSON object")],
)
def test_bad_vllm_args_are_one_line(value: str, message: str) -> None:
    env = dict(os.environ) | {"DCOCO_VLLM_ARGS": value}
    done = subprocess.run(
        [sys.executable, "-m", "dcoco", "worker", "--engine", "vllm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    one_line(done.stderr, message)


def test_vllm_args_parse_to_a_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DCOCO_VLLM_ARGS", '{"enforce_eager": true, "block_size": 32}')
    assert WorkerSettings().vllm_args == {"enforce_eager": True, "block_size": 32}


def test_the_drafter_vllm_loads_follows_the_settings(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    def settings(**kw: object) -> WorkerSettings:
        return WorkerSettings(target=folders["target"], drafter=folders["dcoco"], **kw)  # type: ignore[arg-type]

    assert prepare_drafter(settings(mode=Mode.VANILLA), tmp_path) is None
    with pytest.raises(ValueError, match="ngram is the torch engine's"):
        prepare_drafter(settings(mode=Mode.NGRAM), tmp_path)
    assert prepare_drafter(settings(), tmp_path) == (folders["dcoco"], 4)
    assert prepare_drafter(settings(num_speculative_tokens=3), tmp_path) == (folders["dcoco"], 3)
    folder, _ = prepare_drafter(settings(mode=Mode.DFLASH), tmp_path) or (Path(), 0)
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        DFLASH_ARCHITECTURE
    ]
    folder, _ = prepare_drafter(settings(rule=Rule.GLOBAL, top_k=2), tmp_path) or (Path(), 0)
    selection = json.loads((folder / "config.json").read_text())["dcoco_selection"]
    assert selection == {"top_k": 2, "rule": "global", "gamma": 0.5}
    plain = tmp_path / "plain"
    export_drafter(folders["dcoco"], plain, ExportOptions(format="dflash"))
    with pytest.raises(ValueError, match="needs a DCOCODraftModel"):
        prepare_drafter(WorkerSettings(target=folders["target"], drafter=plain), tmp_path)


def test_plugin_series_come_from_the_multiprocess_folder(tmp_path: Path) -> None:
    """A process like vLLM's worker records into the folder; the worker's /metrics serves
    those series once, in place of its own, and nothing else found there."""
    code = (
        "from prometheus_client import Counter\n"
        "from dcoco.vllm.metrics import PluginMetrics\n"
        "m = PluginMetrics('tiny')\n"
        "m.record(3, 1, {'draft': 0.01, 'correct': 0.002, 'verify': 0.02, 'total': 0.032})\n"
        "Counter('vllm_other', 'not ours', registry=None).inc()\n"
    )
    env = dict(os.environ) | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, "tiny")
    metrics.defer_to(PluginCollector(tmp_path), PLUGIN_SERIES)
    text = generate_latest(registry).decode()
    assert 'dcoco_spec_corrected_tokens_total{method="dcoco",model="tiny"} 3.0' in text
    assert 'dcoco_spec_corrected_accepted_tokens_total{method="dcoco",model="tiny"} 1.0' in text
    assert 'dcoco_spec_cycle_seconds_count{method="dcoco",model="tiny",phase="correct"} 1.0' in text
    assert text.count("# TYPE dcoco_spec_corrected_tokens_total") == 1
    assert "vllm_other" not in text
    assert "dcoco_spec_cycles_total" in text  # the worker's own series are still there


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", ["gateway", "queue", "shared", "spec", "settings.py"])
def test_the_vllm_side_is_never_imported_from_below(layer: str) -> None:
    root = SERVICE / layer
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
        bad = {n for n in imports(path) if n == "vllm" or n.startswith(("vllm.", "dcoco.vllm"))}
        assert not bad, f"{path} imports {bad}"


def test_the_vllm_side_uses_the_shared_corrector_not_a_copy() -> None:
    for path in sorted((SERVICE / "vllm").glob("*.py")):
        assert "class Corrector" not in path.read_text(), path
        assert not {n for n in imports(path) if n.startswith(("dcoco.gateway", "dcoco.queue"))}


def test_gpu_check_without_a_gpu_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dcoco.vllm.gpu_check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    one_line(done.stderr, "gpu-check: no CUDA GPU visible")
    assert done.stdout == ""


def test_gpu_check_cost_measurement_runs_at_small_dims() -> None:
    from dcoco.vllm.gpu_check import Dims, correction_cost

    small = Dims(256, 4096, 1, 512, 4, 2, 64, block=4, top_k=4, context=16, corrector=(16, 16, 8))
    rows = correction_cost([1, 2], small, device="cpu")
    assert [r["batch"] for r in rows] == [1, 2]
    assert all(r["draft_ms"] > 0 and r["correct_ms"] > 0 for r in rows)


def test_engine_vllm_without_vllm_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dcoco", "worker", "--engine", "vllm"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ) | {"DCOCO_METRICS_PORT": "0"},
    )
    assert done.returncode == 1
    one_line(done.stderr, "engine vllm needs vLLM in this Python environment")


def test_a_malformed_drafter_is_refused_before_vllm_starts(
    pair: tuple[CausalLM, DFlashDrafter], folders: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    from dcoco.vllm.engine_args import check_drafter

    assert check_drafter(folders["dcoco"])["architectures"] == [DCOCO_ARCHITECTURE]
    broken = tmp_path / "broken"
    shutil.copytree(folders["dcoco"], broken)
    weights = load_file(str(broken / "model.safetensors"))
    del weights["corrector.delta_out.weight"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"corrector\.delta_out\.weight"):
        check_drafter(broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="unreadable"):
        check_drafter(broken)
    raw = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(raw | {"architectures": ["A", "B"]}))
    with pytest.raises(CheckpointError, match="architectures"):
        check_drafter(broken)
    target, drafter = pair
    save_drafter(drafter.with_vocab(torch.arange(8), target.lm_head.weight), broken)
    check_drafter(broken)
    weights = load_file(str(broken / "model.safetensors"))
    save_file(weights | {"d2t": weights["d2t"] - 1}, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointError, match="d2t maps columns outside"):
        check_drafter(broken)


@pytest.mark.usefixtures("any_load")
def test_vllm_takes_its_dtype_from_the_precision(tmp_path: Path) -> None:
    """fp32 and bf16 pass through; auto on this CPU picks whichever of the two the measured
    forwards favour (and caches the table); the torch engine's int8 and int4 are refused."""
    from dcoco.precision import cache_file
    from dcoco.vllm.engine_args import vllm_dtype

    target = tmp_path / "target"
    save_target(make_target(hidden=64, vocab=64), target)

    def dtype(precision: str) -> str:
        settings = WorkerSettings(
            target=target, precision=precision, cache_dir=tmp_path, max_batch_size=2
        )
        return vllm_dtype(settings)

    assert dtype("fp32") == "float32"
    assert dtype("bf16") == "bfloat16"
    assert dtype("auto") in ("float32", "bfloat16")
    assert cache_file(tmp_path).exists()
    for quantized in ("int8", "int4"):
        with pytest.raises(ValueError, match=f"{quantized} is the torch engine's"):
            dtype(quantized)


def vllm_step(
    rows: int, verified: int, drafting: int, prompt: int = 0
) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A vLLM step of `rows` decoding rows that verified `verified` drafted tokens each (the
    first row kept one of them, the others none), drafted `drafting` for the next step, and
    prefilled `prompt` tokens of one more request: (SchedulerOutput, ModelRunnerOutput)."""
    ids = [f"r{i}" for i in range(rows)]
    step = SimpleNamespace(
        scheduled_spec_decode_tokens={r: [1] * verified for r in ids} if verified else {},
        num_scheduled_tokens={r: verified + 1 for r in ids} | ({"p": prompt} if prompt else {}),
        total_num_scheduled_tokens=rows * (verified + 1) + prompt,
        num_spec_tokens_to_schedule=drafting,
    )
    sampled = [[5, 6]] + [[7]] * (rows - 1) + ([[8]] if prompt else [])
    out = SimpleNamespace(
        req_id_to_index={r: i for i, r in enumerate([*ids, "p"])}, sampled_token_ids=sampled
    )
    return step, out


def test_the_planned_lookup_answers_vllm_s_scheduler_from_measurements() -> None:
    """What vLLM's scheduler reads as its batch size -> k table (`dcoco.vllm.adaptive`): the
    planner's choice once steps are observed, all B while a seeded sampled request runs. A
    step verifies the drafts before it and drafts for the next, so only steps that draft
    nothing time a forward bare; the drafting is what a drafting step took beyond that."""
    from dcoco.vllm.adaptive import PlannedLookup, observe

    greedy = SimpleNamespace(sampling_params=SimpleNamespace(seed=None, temperature=0.0))
    seeded = SimpleNamespace(sampling_params=SimpleNamespace(seed=3, temperature=0.8))
    scheduler = SimpleNamespace(running=[greedy])
    planner = VerifyPlanner(4, whole_block=True)  # as the plugin makes it
    lookup = PlannedLookup(scheduler, planner, size=8)
    assert lookup[2] == 4  # nothing measured yet: the whole block
    assert len(lookup) == 9  # vLLM sizes its table by max_num_seqs + 1
    # 2 rows: a forward costs 0.1 s for the plain step's 2 tokens, 0.2 s for a verify of 4
    # drafts each (10 tokens), and drafting adds 0.3 s to the step that drafts. Drafts of 4
    # seldom hold, so plain steps are faster (2 tokens in 0.1 s against 3 in 0.5 s) though a
    # plain step that drafts for the next takes 0.4 s.
    for verified, drafting, seconds in ((4, 0, 0.2), (0, 0, 0.1), (0, 4, 0.4), (4, 4, 0.5)):
        observe(planner, *vllm_step(2, verified, drafting), seconds)
    assert planner.verify_cost.means == {10: 0.2, 2: 0.1}  # only the bare forwards
    assert planner.fixed_cost(planner.draft_width(2, 4)) == pytest.approx(0.3)
    assert lookup[2] == 0
    # A step that also prefilled a prompt teaches nothing, drafting or not: its 40 prompt
    # tokens cost less than 40 verified ones, and counted by width they would make the verify
    # of 10 tokens look as cheap as a plain step (the curve never lets a width cost more than
    # a wider one), and drafting dearer.
    observe(planner, *vllm_step(2, 4, 4, prompt=40), 0.9)
    observe(planner, *vllm_step(2, 0, 0, prompt=40), 0.1)
    assert planner.verify_cost.means == {10: 0.2, 2: 0.1}
    assert planner.fixed_cost(planner.draft_width(2, 4)) == pytest.approx(0.3)
    scheduler.running.append(seeded)
    assert lookup[2] == 4


class ScriptedPlanner(VerifyPlanner):
    """Chooses the given ks in turn."""

    def __init__(self, ks: list[int]) -> None:
        super().__init__(4)
        self.ks = iter(ks)

    def choose(self, rows: int, exploring_allowed: bool = True) -> int:
        return next(self.ks)


def test_the_planned_lookup_plans_plain_steps_two_at_least() -> None:
    """The second of two plain steps is the one that times a plain forward bare (the first
    drafts nothing, but verifies the drafts before it)."""
    from dcoco.vllm.adaptive import PlannedLookup

    scheduler = SimpleNamespace(running=[])
    lookup = PlannedLookup(scheduler, ScriptedPlanner([3, 0, 3, 3, 0, 0, 0, 2]), size=4)
    assert [lookup[1] for _ in range(8)] == [3, 0, 0, 3, 0, 0, 0, 2]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_step_is_timed_up_to_the_next_schedule_while_requests_run(
    monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    """What the engine core does between a step's output and the next schedule is part of
    the step's cost, so a step counts from its schedule to the next one; the last step before
    the engine idles, and every step under asynchronous scheduling (which schedules the next
    step before this one's output), count from schedule to output."""
    from dcoco.vllm import adaptive
    from dcoco.vllm.adaptive import PlannedLookup

    # schedule, (output,) schedule, output: the second step's output is its last
    clock = iter([0.0, 0.010, 0.013, 0.020] if asynchronous else [0.0, 0.013, 0.020])
    monkeypatch.setattr(adaptive.time, "perf_counter", lambda: next(clock))
    planner = VerifyPlanner(4, whole_block=True)  # as the plugin makes it
    steps = iter([vllm_step(2, 0, 0), vllm_step(2, 0, 0)])
    running = [True, False]
    scheduler = SimpleNamespace(
        _dcoco_started={},
        _dcoco_ended=None,
        _dcoco_drafting=None,
        has_requests=lambda: running[0],
        scheduler_config=SimpleNamespace(async_scheduling=asynchronous),
    )
    scheduler.dynamic_sd_lookup = PlannedLookup(scheduler, planner, size=4)
    outputs: dict[int, SimpleNamespace] = {}

    def schedule(self: SimpleNamespace) -> SimpleNamespace:
        step, out = next(steps)
        outputs[id(step)] = out
        return step

    def update(self: SimpleNamespace, step: SimpleNamespace, out: SimpleNamespace) -> None:
        return None

    first = adaptive._schedule(schedule, scheduler)
    adaptive._update_from_output(update, scheduler, first, outputs[id(first)])
    second = adaptive._schedule(schedule, scheduler)
    assert planner.verify_cost.counts == {2: 1}
    assert planner.verify_cost.means[2] == pytest.approx(0.010 if asynchronous else 0.013)
    running[0] = False  # the engine idles after the second step: timed to its output
    adaptive._update_from_output(update, scheduler, second, outputs[id(second)])
    assert planner.verify_cost.counts == {2: 2}
    assert planner.verify_cost.means[2] == pytest.approx(
        (0.010 + 0.007) / 2 if asynchronous else (0.013 + 0.007) / 2
    )
    assert scheduler._dcoco_ended is None
