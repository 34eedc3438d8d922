"""The decoder layers of the target and the drafter compiled by inductor, warmed in the
background while the engine serves eagerly.

One function, `_layer`, runs a decoder layer together with its KV-cache write and read, taking
everything as tensors. Compiled with dynamic shapes, one graph serves every layer (a layer's
weights are inputs) and every batch size, verify width and context length of a shape class:
dynamo specializes sizes 0 and 1, and the quantized linears branch on their row count
(`dense_from`), so a plain step at batch 1, plain steps at larger batches, verifies at batch 1
and so on each get a graph; the drafter's layers (bf16, unquantized) get their own.
`CompiledLayers` compiles the classes a model's forwards fall in, on a thread, on scratch
caches; serving calls only run what is already compiled (`torch._dynamo.run`): until a class
is ready, and for shapes no warm-up compiled, the layer runs eagerly. A serving step never
waits for a compile.

Dynamo's guards pick the graph for a forward's first layer only. With the call around them
they cost about 100 us a layer at one token (a plain SmolLM2 int4 step at batch 1 runs 1.24x
faster without them on the AMX Xeon, docs/engine-profile.md), and they would say the same for
every later layer: a model's layers share their structure, dtypes and shapes, and differ only
in their weights' values. So the later layers call the chosen graph directly (`Graph`), with
its inputs gathered from `_layer`'s arguments as dynamo's own bytecode gathers them.

The graphs run without inductor's runtime asserts on sizes, strides and alignment (about 20
of them a layer): the first layer's guards checked the shapes, and the later layers' inputs
have the same ones. A plain SmolLM2 int4 step at batch 1 on the AMD EPYC ran 3-6% faster
without them (fastest of 60 steps, three alternating runs).

Compiled kernels live in inductor's cache, under the engine's cache folder unless
TORCHINDUCTOR_CACHE_DIR names another, so a restart recompiles in seconds rather than a minute.

Compiled code sits behind `dcoco worker`'s DCOCO_COMPILE and is never used in fp32, the exact
reference: fusing changes rounding. Its kernels parallelize small loops with OpenMP, so where
other processes hold the same cores they can stall far worse than eager ones
(docs/engine-profile.md).
"""

import atexit
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch._dynamo
from torch._inductor.compile_fx import compile_fx
from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from dcoco.engine.kv_cache import CacheView, KVCache, lazy_zeros
from dcoco.model.layers import DecoderLayer, LayerCall

log = logging.getLogger(__name__)

# Inductor settings for the layers' graphs: no runtime asserts (see above).
NO_ASSERTS = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}

# Context length the warm-up compiles at, where the cache holds it beside the class's tokens:
# any length of at least 2 shares the graph.
WARM_CONTEXT = 64


def _layer(
    layer: DecoderLayer,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """x [N, T, H], cos and sin [N, 1, T, D], mask [N, 1, T, L]; k_cache and v_cache
    [S, Hkv, C, D], this layer's caches; rows [N, 1], each row's slot; positions [N, T].
    Writes the new keys and values, attends to the first L positions -> [N, T, H]."""

    def kv(_: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k_cache[rows, :, positions] = k.transpose(1, 2).to(k_cache.dtype)  # [N, T, Hkv, D]
        v_cache[rows, :, positions] = v.transpose(1, 2).to(v_cache.dtype)  # [N, T, Hkv, D]
        keys = mask.shape[-1]
        slots = rows[:, 0]  # [N]
        return k_cache[slots, :, :keys], v_cache[slots, :, :keys]  # [N, Hkv, L, D] each

    return layer(x, cos, sin, kv, mask)  # [N, T, H]


class Graph:
    """A graph inductor compiled for `_layer`, callable with `_layer`'s arguments and no
    guards: its inputs (tensors, and the sizes its dynamic shapes take) are gathered by the
    paths dynamo recorded for them, such as `L['layer']._modules['mlp']...` or
    `L['x'].size()[1]`."""

    def __init__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> None:
        paths = [
            node.meta["grapharg"].source.name for node in graph.graph.find_nodes(op="placeholder")
        ]
        if not all(path.startswith("L[") for path in paths):  # only `_layer`'s own arguments
            raise RuntimeError(f"a compiled layer reads beyond its arguments: {paths}")
        outputs = graph.graph.output_node().args[0]
        if not isinstance(outputs, tuple | list) or len(outputs) != 1:
            raise RuntimeError(f"a compiled layer returns {outputs}, not one tensor")
        self.inputs = eval(f"lambda L: ({', '.join(paths)},)")  # `_layer`'s arguments -> inputs
        self.compiled = cast(
            Callable[..., Sequence[torch.Tensor]],
            compile_fx(graph, example_inputs, config_patches=NO_ASSERTS),
        )

    def __call__(self, *inputs: object) -> Sequence[torch.Tensor]:
        """Dynamo's call, once its guards chose this graph."""
        _chosen.graph = self
        return self.compiled(*inputs)

    def run(self, *arguments: object) -> torch.Tensor:
        """`_layer` over these arguments."""
        named = dict(zip(_PARAMETERS, arguments, strict=True))
        return self.compiled(*self.inputs(named))[0]  # [N, T, H]


_PARAMETERS = tuple(inspect.signature(_layer).parameters)  # `_layer`'s argument names
_chosen = threading.local()  # .graph: the Graph dynamo ran last on this thread


def _backend(graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Graph:
    """Dynamo's backend for `_layer`: inductor, kept callable without guards."""
    return Graph(graph, example_inputs)


_compile = torch.compile(_layer, dynamic=True, fullgraph=True, backend=_backend)
_run = torch._dynamo.run(_layer)  # compiled graphs only; eager where none matches


def warm_shapes(max_batch: int, widths: int, dense_from: int | None) -> list[tuple[int, int]]:
    """One (rows, tokens) example of each shape class the engine's plain steps (1 token a row),
    verifies and prompts' chunks (2 to `widths` tokens) fall in, most used first."""
    shapes = [(1, 1), (1, 2), (2, 1), (2, 2)]
    if dense_from is not None:  # the quantized linears' dense branch, where steps reach it
        shapes += [(1, dense_from)] if widths >= dense_from > 1 else []
        shapes += [(dense_from, 1)] if max_batch >= dense_from > 2 else []
        wide = -(-dense_from // 2)  # two rows of this many tokens reach it
        shapes += [(2, wide)] if 2 <= wide <= widths else []
    return [(n, t) for n, t in shapes if n <= max_batch and t <= widths]


# (positions [N, T], mask [N, 1, T, L], call) -> None: one forward of the model over
# placeholder inputs at those positions, running its layers through `call`.
WarmForward = Callable[[torch.Tensor, torch.Tensor, LayerCall], object]


def use_kernel_cache(folder: Path) -> None:
    """Points inductor's kernel cache at `folder` unless the user named one. Importing inductor
    sets TORCHINDUCTOR_CACHE_DIR to its default (a folder under /tmp, which a container loses
    on restart), so that value counts as unset."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or current == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)


class CompiledLayers:
    """A model's layers, compiled on a background thread (`start`); `call` runs them."""

    def __init__(self, forward: WarmForward, cache: KVCache, shapes: list[tuple[int, int]]) -> None:
        self.forward, self.cache, self.shapes = forward, cache, shapes
        self.compiled: list[tuple[int, int]] = []  # the shape classes ready, in order
        self.error: str | None = None  # why compiling stopped, if it failed
        self.done = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._warm, name="dcoco-compile", daemon=True)

    def start(self, cache_dir: Path) -> None:
        use_kernel_cache(cache_dir / "inductor")
        atexit.register(self.stop)
        self._thread.start()

    def stop(self) -> None:
        """Compiles no further class and waits for the one under way: a process that exits
        while inductor compiles on another thread aborts in C++ (registered at exit while
        compiling; unregistered once done, since the registration holds the model and its
        caches, and an engine dropped afterwards must be freed)."""
        self._stopping.set()
        self._thread.join()

    def call(self, view: CacheView) -> LayerCall:
        """Runs each layer of a forward over `view` with its compiled graph, if ready: the
        first through dynamo, whose guards pick the graph (or none), the others directly."""
        rows = view.slots.unsqueeze(1)  # [N, 1]
        chosen: list[Graph | None] = []  # what the guards picked for the first layer

        def run(
            layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
        ) -> torch.Tensor:
            i = layer.self_attn.layer_idx
            k, v = self.cache.k[i], self.cache.v[i]  # [S, Hkv, C, D] each
            arguments = (layer, x, cos, sin, view.mask, k, v, rows, view.positions)
            if chosen and chosen[0] is not None:
                return chosen[0].run(*arguments)  # [N, T, H]
            _chosen.graph = None
            out = _run(*arguments)  # [N, T, H]
            chosen[:] = [_chosen.graph]
            return out

        return run

    def _warm(self) -> None:
        """Compiles each shape class with the model's own layers, on scratch caches. A failed
        compile (no C++ compiler, an unwritable cache, an op inductor rejects) is logged and
        leaves the layers eager."""
        k = lazy_zeros(self.cache.k.shape[1:], self.cache.k.dtype)  # [S, Hkv, C, D]
        v = lazy_zeros(self.cache.v.shape[1:], self.cache.v.dtype)  # [S, Hkv, C, D]
        try:
            with torch.inference_mode(), torch._dynamo.config.patch(recompile_limit=64):
                for n, t in self.shapes:
                    if self._stopping.is_set():
                        break
                    start = time.perf_counter()
                    self._warm_class(n, t, k, v)
                    self.compiled.append((n, t))
                    log.info(
                        "compiled layers: %d rows x %d tokens in %.1f s",
                        n,
                        t,
                        time.perf_counter() - start,
                    )
        except (torch._dynamo.exc.TorchDynamoException, RuntimeError, OSError) as failure:
            self.error = f"{type(failure).__name__}: {failure}".splitlines()[0]
            log.warning("compiled layers unavailable, serving eagerly: %s", self.error)
        finally:
            self.done.set()
            atexit.unregister(self.stop)

    def _warm_class(self, n: int, t: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """One forward of n rows of t tokens through the compiling wrapper."""
        rows = torch.arange(n).unsqueeze(1)  # [N, 1]
        # L stays short of the cache's length C, which a guard would otherwise pin
        context = min(WARM_CONTEXT, self.cache.k[0].shape[2] - t - 1)
        positions = (context + torch.arange(t)).repeat(n, 1)  # [N, T]
        keys = torch.arange(context + t)  # [L]
        mask = (keys.view(1, 1, -1) <= positions.unsqueeze(-1)).unsqueeze(1)  # [N, 1, T, L]

        def warm(
            layer: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
        ) -> torch.Tensor:
            return _compile(layer, x, cos, sin, mask, k, v, rows, positions)  # [N, T, H]

        self.forward(positions, mask, warm)
