"""vLLM behind the worker's engine-client protocol: AsyncLLM with the DCOCO plugin.

- Deltas: vLLM's DELTA outputs, token ids only (the worker detokenizes, as with the torch
  engine). The request's speculation rides on the final delta, from vLLM's per-request
  spec-decode summary (`--per-request-spec-decode-metrics summary`); earlier deltas carry none.
- Abort: `AsyncLLM.abort`, whose final output says "abort"; leaving a stream early aborts too.
- Statistics: a stat logger receives each engine step's `SpecDecodingStats` (drafts, drafted
  and accepted tokens, acceptance per slot) and each finished request's acceptance histogram
  (the tokens committed per cycle); `drain_stats` hands both over as CycleStats. Corrected
  tokens and phase times are measured by the plugin in vLLM's worker process and reach the
  worker's /metrics through a Prometheus multiprocess folder (`collector`).
"""

import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams as VllmSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from dcoco.settings import WorkerSettings
from dcoco.shared.errors import UsageError
from dcoco.shared.protocol import EngineDelta, EngineRequest
from dcoco.shared.stats import CycleStats, SpecStats
from dcoco.vllm.adaptive import ENV as ADAPTIVE_ENV
from dcoco.vllm.cpu_env import cpu_env, usable_cpus
from dcoco.vllm.engine_args import engine_kwargs
from dcoco.vllm.metrics import PluginCollector

log = logging.getLogger(__name__)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


class _StepStats(StatLoggerBase):
    """Collects each engine step's spec-decode counters for `drain_stats`."""

    def __init__(self, sink: list[CycleStats], method: str) -> None:
        self.sink, self.method = sink, method

    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kw: Any) -> None:
        spec = getattr(scheduler_stats, "spec_decoding_stats", None)
        if spec is None or not spec.num_drafts:
            return
        self.sink.append(
            CycleStats(
                verifications=spec.num_drafts,
                draft_tokens=spec.num_draft_tokens,
                accepted_tokens=spec.num_accepted_tokens,
                accepted_per_position=list(spec.num_accepted_tokens_per_pos),
                seconds={},
                method=self.method,
            )
        )

    def log_engine_initialized(self) -> None:
        return None


def request_stats(metrics: Any) -> SpecStats:
    """vLLM's per-request summary (histogram of accepted drafts per cycle) -> SpecStats."""
    histogram = list(metrics.histogram)  # [B+1] cycles that accepted j drafted tokens
    return SpecStats(
        verifications=sum(histogram),
        draft_tokens=int(metrics.num_draft_tokens),
        accepted_tokens=sum(j * n for j, n in enumerate(histogram)),
        accepted_per_position=[sum(histogram[p + 1 :]) for p in range(len(histogram) - 1)],
        seconds={},
    )


class VllmEngineClient:
    def __init__(self, settings: WorkerSettings, eos_token_ids: tuple[int, ...]) -> None:
        """Starts vLLM (its EngineCore and Worker processes); raises ValueError or
        CheckpointError for settings it cannot serve."""
        self.scratch = Path(tempfile.mkdtemp(prefix="dcoco-vllm-"))
        self.eos_token_ids = eos_token_ids
        self.mode = settings.mode  # vLLM drafts one way for every request
        self._cycles: list[CycleStats] = []
        self._failure: BaseException | None = None
        try:
            kwargs = engine_kwargs(settings, self.scratch)
            self.metrics_dir = Path(
                os.environ.setdefault(MULTIPROC_ENV, str(self.scratch / "prom"))
            )
            self.metrics_dir.mkdir(parents=True, exist_ok=True)
            # Spawned, not forked: the children import prometheus_client afresh and so write
            # their series to the folder; this process, threads and all, is never forked.
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
            os.environ[ADAPTIVE_ENV] = "true" if settings.adaptive else "false"  # for EngineCore
            if not torch.cuda.is_available():
                added = cpu_env(Path(sys.prefix), os.environ, usable_cpus())
                os.environ.update(added)  # for the children
                named = ", ".join(f"{k}={v}" for k, v in added.items())
                log.info("vLLM's processes get %s", named or "the environment as it is")
            self.engine = self._start(kwargs)
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self.max_model_len: int = kwargs["max_model_len"]
        self.max_concurrency: int = kwargs["max_num_seqs"]
        self.collector = PluginCollector(self.metrics_dir)

    def _start(self, kwargs: dict[str, Any]) -> AsyncLLM:
        try:
            return AsyncLLM.from_engine_args(
                AsyncEngineArgs(**kwargs),
                stat_loggers=[
                    lambda config, index: _StepStats(self._cycles, self.mode.speculation)
                ],
            )
        except RuntimeError as failed:  # vLLM has logged the cause from its own processes
            first = str(failed).splitlines()[0] if str(failed) else type(failed).__name__
            raise UsageError(f"vLLM did not start ({first}); its log above says why") from None

    @property
    def failure(self) -> BaseException | None:
        if self._failure is None and self.engine.errored:
            self._failure = self.engine.dead_error
        return self._failure

    @failure.setter
    def failure(self, value: BaseException | None) -> None:
        self._failure = value

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        p = request.params
        if p.speculation not in (None, self.mode):
            yield EngineDelta(
                [],
                finished=True,
                finish_reason="error",
                error=f"speculation: the vllm engine drafts one way for every request "
                f"({self.mode.speculation!r}); it cannot run {p.speculation.speculation!r}",
            )
            return
        params = VllmSamplingParams(
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            stop_token_ids=list(p.stop_token_ids)
            + ([] if p.ignore_eos else list(self.eos_token_ids)),
            ignore_eos=p.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
        )
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        finished = False
        try:
            async for out in self.engine.generate(prompt, params, request.request_id):
                completion = out.outputs[0]
                finished = out.finished
                yield EngineDelta(
                    list(completion.token_ids),
                    finished=finished,
                    finish_reason=completion.finish_reason if finished else None,
                    stats=self._finish(completion.spec_decode_metrics) if finished else None,
                )
        except ValueError as refused:  # vLLM's input validation (prompt too long, bad ids)
            finished = True
            yield EngineDelta([], finished=True, finish_reason="error", error=str(refused))
        finally:
            if not finished and not self.engine.errored:
                await self.engine.abort(request.request_id)

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    def drain_stats(self) -> list[CycleStats]:
        cycles, self._cycles[:] = list(self._cycles), []
        return cycles

    async def close(self) -> None:
        self.engine.shutdown()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _finish(self, metrics: Any) -> SpecStats | None:
        """The request's speculation; its cycles' accepted lengths go to the statistics."""
        if metrics is None:
            return None
        stats = request_stats(metrics)
        lengths = [j + 1 for j, n in enumerate(metrics.histogram) for _ in range(n)]
        self._cycles.append(
            CycleStats(accepted_lengths=lengths, seconds={}, method=self.mode.speculation)
        )
        return stats
