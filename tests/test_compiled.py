"""The engine's compiled target layers: warmed in the background, used once ready, never
compiling in a serving step, and never in the way when the compiler is missing."""

import gc
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import pytest
import torch
from prometheus_client import CollectorRegistry, generate_latest

from dcoco.engine import compiled, stalls
from dcoco.engine.compiled import warm_shapes
from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.model.layers import Attention
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.worker.engines import adopt_engine_metrics
from dcoco.worker.metrics import WorkerMetrics
from factories import make_drafter, make_target
from stack import metric_values

pytestmark = pytest.mark.slow

PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [5, 6, 7, 8], [9]]
PARAMS = SamplingParams(max_tokens=24)
# How far below the fp32 target's best logit a bf16 engine's greedy token may score: bf16
# rounding (and fusing, which moves it) flips near-ties, and after a flip the answers of two
# engines part for good, so answers are checked token by token against the exact target.
BF16_TIE = 0.1


def engine(
    precision: Precision, compile: bool, hidden: int = 64, mode: Mode = Mode.NGRAM
) -> Engine:
    """An engine over a random target, the same weights every time: n-gram (plain steps and
    verifies, no drafter) or DCOCO with a random drafter."""
    cfg = EngineConfig(
        mode=mode, max_batch_size=3, max_model_len=64, precision=precision, compile=compile
    )
    target = make_target(hidden=hidden, vocab=64)
    return Engine(target, make_drafter(target) if mode is Mode.DCOCO else None, cfg)


def graph_cache() -> list[object]:
    """The graphs dynamo holds for the compiled layer function."""
    return torch._C._dynamo.eval_frame._debug_get_cache_entry_list(compiled._layer.__code__)


@contextmanager
def eager_attention_calls() -> Iterator[list[int]]:
    """Counts the Python calls of Attention.forward: compiled graphs make none."""
    count = [0]
    code = Attention.forward.__code__

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call" and frame.f_code is code:
            count[0] += 1

    sys.setprofile(profile)
    try:
        yield count
    finally:
        sys.setprofile(None)


@contextmanager
def layer_calls() -> Iterator[dict[str, int]]:
    """Counts compiled forwards, their layers, the layers run through dynamo's guards and
    those run by calling a graph directly."""
    counts = {"forwards": 0, "layers": 0, "guarded": 0, "direct": 0}
    guarded, direct, call = compiled._run, compiled.Graph.run, compiled.CompiledLayers.call

    def counting(key: str, fn: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            counts[key] += 1
            return fn(*args)

        return wrapped

    def forward(self: compiled.CompiledLayers, view: Any) -> Any:
        counts["forwards"] += 1
        return counting("layers", call(self, view))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compiled, "_run", counting("guarded", guarded))
        patch.setattr(compiled.Graph, "run", counting("direct", direct))
        patch.setattr(compiled.CompiledLayers, "call", forward)
        yield counts


def test_shape_classes_follow_the_steps_the_engine_takes() -> None:
    assert warm_shapes(1, 1, None) == [(1, 1)]  # plain steps at batch 1
    assert warm_shapes(8, 1, None) == [(1, 1), (2, 1)]  # a vanilla engine never verifies
    assert warm_shapes(8, 16, None) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    # quantized linears switch to their dense weights from 12 rows: three more classes reach it
    assert warm_shapes(32, 16, 12) == [(1, 1), (1, 2), (2, 1), (2, 2), (1, 12), (12, 1), (2, 6)]
    assert warm_shapes(4, 16, 33) == [(1, 1), (1, 2), (2, 1), (2, 2)]  # never reached


def test_compiled_layers_serve_what_the_eager_ones_do(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._dynamo.reset()  # no graphs from other tests' engines
    # the stall guard (tests/test_stalls.py) stays out: on a loaded machine it may trip
    monkeypatch.setattr(stalls, "STRIKES", 10**9)
    eager = engine(Precision.BF16, compile=False, mode=Mode.DCOCO)
    fast = engine(Precision.BF16, compile=True, mode=Mode.DCOCO)
    target, drafter = fast.runner.compiled, fast.runner.compiled_drafter
    assert target is not None
    assert drafter is not None
    early, _ = fast.generate(PROMPTS, PARAMS)  # while they compile: eager or compiled, both fine
    for part in (target, drafter):
        assert part.done.wait(timeout=600)
        assert part.error is None
    width = fast.block + 1
    assert target.compiled == warm_shapes(3, width, None)  # plain steps, verifies, chunks
    # every draft, 1 to B slots: the pending token and one mask, or B
    assert drafter.compiled == [(1, 2), (1, width), (2, 2), (2, width)]
    exported = worker_metrics(fast)
    for name, ready in (("target", target.compiled), ("drafter", drafter.compiled)):
        for state in ("planned", "ready"):
            key = f'dcoco_engine_compiled_shapes{{model="m",part="{name}",state="{state}"}}'
            assert exported[key] == len(ready)
        assert exported[f'dcoco_engine_compile_failed{{model="m",part="{name}"}}'] == 0
    assert exported['dcoco_engine_compiled_paused{model="m"}'] == 0
    assert exported['dcoco_engine_stall_pauses_total{model="m"}'] == 0
    # one graph per shape class serves every layer, and serving compiled nothing more
    graphs = len(graph_cache())
    assert 0 < graphs <= len(target.compiled) + len(drafter.compiled)
    with eager_attention_calls() as calls, layer_calls() as counts:
        served, _ = fast.generate(PROMPTS, PARAMS)
    assert len(graph_cache()) == graphs
    # prefills of up to 8 tokens at batch 3, every step, verify and draft ran compiled graphs
    assert calls[0] == 0
    # the guards ran once a forward; its other layers called the graph they chose directly
    assert counts["guarded"] == counts["forwards"] > 0
    assert counts["direct"] == counts["layers"] - counts["forwards"]
    reference, _ = eager.generate(PROMPTS, PARAMS)
    exact = make_target(hidden=64, vocab=64)  # the same weights in fp32
    for answers in (reference, early, served):
        for prompt, answer in zip(PROMPTS, answers, strict=True):
            assert len(answer.token_ids) == PARAMS.max_tokens
            assert max(argmax_gaps(exact, prompt, answer.token_ids)) < BF16_TIE


@torch.no_grad()
def argmax_gaps(target: CausalLM, prompt: list[int], answer: list[int]) -> list[float]:
    """For each answer token, the fp32 target's best logit minus the token's, with the prompt
    and the answer's earlier tokens as context (0 where the token is the target's argmax)."""
    ids = torch.tensor([prompt + answer])  # [1, T]
    hidden, _ = target(ids, torch.arange(ids.shape[1]).unsqueeze(0))  # [1, T, H]
    logits = target.logits(hidden[0, len(prompt) - 1 : -1])  # [A, V]
    chosen = logits.gather(1, torch.tensor(answer).unsqueeze(1))  # [A, 1]
    return (logits.max(dim=1, keepdim=True).values - chosen).squeeze(1).tolist()  # [A]


def worker_metrics(served: Engine) -> dict[str, float]:
    """What a torch worker serving `served` as model "m" exports."""
    metrics = WorkerMetrics(CollectorRegistry(), "m")
    settings = SimpleNamespace(engine="torch", precision=served.cfg.precision)
    adopt_engine_metrics(settings, SimpleNamespace(engine=served), metrics)  # type: ignore[arg-type]
    return metric_values(generate_latest(metrics.registry).decode())


def test_a_vanilla_engine_compiles_the_classes_its_prompts_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vanilla engine never verifies, but its prompts' chunks (and whole prompts) are
    several tokens a row: those classes compile too, so prefilling beside streams is cheap."""
    monkeypatch.setattr(stalls, "STRIKES", 10**9)
    plain = engine(Precision.BF16, compile=True, mode=Mode.VANILLA)
    layers = plain.runner.compiled
    assert layers is not None
    assert layers.done.wait(timeout=600)
    assert layers.compiled == [(1, 1), (1, 2), (2, 1), (2, 2)]
    with eager_attention_calls() as calls:
        completions, _ = plain.generate(PROMPTS, PARAMS)  # 3 prompts, up to 8 tokens each
    assert calls[0] == 0
    assert all(len(c.token_ids) == PARAMS.max_tokens for c in completions)
    # once compiled, nothing outside the engine holds its model: dropped, it is freed
    target = weakref.ref(plain.runner.target)
    del plain, layers
    gc.collect()
    assert target() is None


def test_a_short_cache_compiles_its_wide_classes_within_it() -> None:
    """An int4 engine whose prompts may be longer than the cache has room for after the
    warm-up's usual 64 positions: every class still compiles (the dense one, from the measured
    crossover of at most 33 rows, included), warmed within the cache."""
    cfg = EngineConfig(
        mode=Mode.VANILLA,
        max_batch_size=2,
        max_model_len=40,
        precision=Precision.INT4,
        compile=True,
    )
    short = Engine(make_target(hidden=64, vocab=64), None, cfg)
    layers = short.runner.compiled
    assert layers is not None
    assert layers.done.wait(timeout=600)
    assert layers.error is None
    assert layers.compiled == layers.shapes


def test_fp32_stays_eager() -> None:
    exact = engine(Precision.FP32, compile=True)
    assert exact.runner.compiled is None
    assert not any(name.startswith("dcoco_engine_comp") for name in worker_metrics(exact))


NO_COMPILER = """
import sys
sys.path.insert(0, "tests")
from test_compiled import PARAMS, PROMPTS, engine
from dcoco.shared.options import Precision

broken = engine(Precision.INT8, compile=True)
assert broken.runner.compiled is not None
assert broken.runner.compiled.done.wait(timeout=600)
completions, _ = broken.generate(PROMPTS, PARAMS)
assert all(len(c.token_ids) == PARAMS.max_tokens for c in completions)
print(broken.runner.compiled.error)
"""


def test_a_missing_compiler_leaves_the_engine_serving_eagerly(tmp_path: Path) -> None:
    """In a process whose C++ compiler is not there, with an empty kernel cache."""
    env = os.environ | {"CXX": "/nonexistent/g++", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", NO_COMPILER], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "InvalidCxxCompiler" in done.stdout
    assert "compiled layers unavailable, serving eagerly" in done.stderr


EXIT_WHILE_COMPILING = """
import sys
sys.path.insert(0, "tests")
from test_compiled import engine
from dcoco.shared.options import Precision
from dcoco.shared.sampling import SamplingParams

busy = engine(Precision.BF16, compile=True)
busy.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
print("compiling" if not busy.runner.compiled.done.is_set() else "done")
"""


def test_a_process_exits_cleanly_while_its_layers_compile(tmp_path: Path) -> None:
    """Exit waits for the class under way and compiles no other (`CompiledLayers.stop`): once,
    a `dcoco generate` that exited during a cold compile aborted in C++ ("terminate called
    without an active exception"); that race did not recur in six tries without the wait."""
    env = os.environ | {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}  # cold: compiling for seconds
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_COMPILING],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "compiling"
    assert "terminate called" not in done.stderr
    assert any(tmp_path.iterdir())  # the kernel cache the user named


KERNEL_CACHE = """
import os, sys
from pathlib import Path
sys.path.insert(0, "tests")
import test_compiled
from dcoco.engine.engine import Engine
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams

cfg = EngineConfig(
    mode=Mode.VANILLA, max_batch_size=1, max_model_len=32, precision=Precision.BF16,
    compile=True, cache_dir=Path(sys.argv[1]),
)
engine = Engine(test_compiled.make_target(hidden=64, vocab=64), None, cfg)
assert engine.runner.compiled.done.wait(timeout=600)
completions, _ = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8))
print(engine.runner.compiled.error, engine.runner.compiled.compiled == [(1, 1), (1, 2)])
print(os.environ["TORCHINDUCTOR_CACHE_DIR"], completions[0].token_ids)
"""


def test_compiled_kernels_are_kept_in_the_engines_cache_folder(tmp_path: Path) -> None:
    """Not in the folder under /tmp that importing inductor names by default. A cache whose
    files were cut short (a full disk, a killed write) is compiled anew (inductor warns)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}

    def serve() -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", KERNEL_CACHE, str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()

    cold = serve()
    assert cold[0] == "None True"  # every class compiled
    assert cold[1].startswith(f"{tmp_path / 'inductor'} ")
    kernels = [f for f in (tmp_path / "inductor").rglob("*") if f.is_file()]
    assert any(f.suffix == ".py" for f in kernels)  # the graphs' generated code
    for kernel in kernels:
        kernel.write_bytes(kernel.read_bytes()[:100])
    assert serve() == cold
