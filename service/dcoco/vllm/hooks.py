"""The V1 runner's hook points, wrapped for DCOCO drafters and passed through for all others.

- `DFlashProposer._sample_draft_tokens(hidden_states, sampling_metadata)`: the one call that
  turns all R*B drafted slots into ids, greedy and probabilistic drafting alike. For a DCOCO
  drafter it returns the selected draft: top-K, corrector scores, the selection rule. The draft
  is deterministic, so it returns no draft probabilities: vLLM's rejection sampler then treats q
  as one-hot and accepts d with probability p_target(d), which keeps sampling lossless.
- `DFlashProposer.propose`: timed, so the drafter's share of a step is known. A step that
  drafts nothing (k = 0, adaptive speculation) only stores the step's context keys and values
  in the drafter's cache (`store_context`): upstream also runs the drafter's layers over the
  bonus tokens, whose keys and values the next step's context overwrites unread.
- `GPUModelRunner.execute_model` / `sample_tokens` (the CPU runner inherits both): the step's
  wall time, and after verification the per-request accepted counts that tell which corrected
  tokens the target accepted.
- `GPUModelRunner.initialize_kv_cache`, once at start after the load has shared the target's
  embedding into the drafter: it also builds the corrector's whole-vocabulary token table, as
  the V2 speculator's load does, rather than the first drafting step, whose seconds the
  adaptive planner reads (in the torch engine a table built in the first cycle made drafting
  look four times its cost). `install` runs inside the load, too late to wrap that.

`install` runs when vLLM builds a DCOCO model, in the worker process. It fails loudly when a
hook point is missing or when the V2 runner is active without the DCOCO speculator installed.
"""

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from vllm.config import VllmConfig

from dcoco.vllm.runtime import DCOCORuntime
from dcoco.vllm.versions import UnsupportedVllm, missing

log = logging.getLogger(__name__)
MARK = "__dcoco_hook__"
PROPOSER_HOOKS = (
    "_sample_draft_tokens",
    "propose",
    "set_inputs_first_pass",
    "build_model_inputs_first_pass",
)
RUNNER_HOOKS = ("execute_model", "sample_tokens", "initialize_kv_cache")


def install(vllm_config: VllmConfig) -> None:
    """Idempotent. Raises UnsupportedVllm instead of ever letting DCOCO draft as plain DFlash."""
    if getattr(vllm_config, "use_v2_model_runner", False):
        from dcoco.vllm.plugin import v2_dispatch_installed

        if not v2_dispatch_installed():
            raise UnsupportedVllm(
                "the V2 model runner is active but the DCOCO speculator dispatch is not "
                "installed; refusing to run as plain DFlash"
            )
        return
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    missing(DFlashProposer, PROPOSER_HOOKS)
    missing(GPUModelRunner, RUNNER_HOOKS)
    _wrap(DFlashProposer, "_sample_draft_tokens", _sample_draft_tokens)
    _wrap(DFlashProposer, "propose", _propose)
    _wrap(GPUModelRunner, "execute_model", _execute_model)
    _wrap(GPUModelRunner, "sample_tokens", _sample_tokens)
    _wrap(GPUModelRunner, "initialize_kv_cache", _initialize_kv_cache)


def _wrap(owner: type, name: str, wrapper: Callable[..., Any]) -> None:
    original = getattr(owner, name)
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    setattr(method, MARK, True)
    setattr(owner, name, method)


def _unwrap(model: Any) -> Any:
    unwrap = getattr(model, "unwrap", None)  # vLLM's graph wrappers
    return unwrap() if callable(unwrap) else model


def _runtime(model: Any) -> DCOCORuntime | None:
    runtime = getattr(_unwrap(model), "dcoco", None)
    return runtime if isinstance(runtime, DCOCORuntime) else None


def _runner_runtime(runner: Any) -> DCOCORuntime | None:
    return _runtime(getattr(getattr(runner, "drafter", None), "model", None))


def _sample_draft_tokens(
    original: Callable[..., Any], self: Any, hidden_states: torch.Tensor, sampling_metadata: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    runtime = _runtime(self.model)
    if runtime is None:
        return original(self, hidden_states, sampling_metadata)
    model = _unwrap(self.model)
    block = self.num_speculative_tokens  # B
    logits, vocab_ids = model.draft_logits(hidden_states)  # [R*B, V'], [V'] or None
    chosen = runtime.draft(
        hidden_states.view(-1, block, hidden_states.shape[-1]),  # [R, B, H]
        logits.view(-1, block, logits.shape[-1]),  # [R, B, V']
        model.embed_weight(),
        vocab_ids,
    )
    return chosen.tokens.reshape(-1), None  # [R*B]; q one-hot


def _propose(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    runtime = _runtime(self.model)
    if runtime is None:
        return original(self, *args, **kwargs)
    start, correct_before = time.perf_counter(), runtime.times.correct
    if kwargs.get("num_speculative_tokens") == 0 and not args:
        drafts = store_context(self, **kwargs)
    else:
        drafts = original(self, *args, **kwargs)
    correction = runtime.times.correct - correct_before
    runtime.times.draft += time.perf_counter() - start - correction
    return drafts


def _initialize_kv_cache(
    original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any
) -> None:
    original(self, *args, **kwargs)
    runtime = _runner_runtime(self)
    if runtime is None:
        return
    runtime.corrector.build_token_table(_unwrap(self.drafter.model).embed_weight())


def store_context(
    proposer: Any,
    *,
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    target_hidden_states: torch.Tensor,
    next_token_ids: torch.Tensor,
    token_indices_to_sample: torch.Tensor | None,
    common_attn_metadata: Any,
    num_rejected_tokens_gpu: torch.Tensor | None = None,
    **_: Any,
) -> torch.Tensor:
    """`propose` at k = 0 without the drafter's forward: the context keys and values of the
    tokens this step verified go into the drafter's cache, as upstream's first pass puts them,
    and no draft comes back [R, 0]."""
    proposer.num_speculative_tokens, proposer._last_draft_probs = 0, None  # as upstream does
    hidden = proposer.model.combine_hidden_states(target_hidden_states)  # [T, H]
    queries, _, metadata = proposer.set_inputs_first_pass(
        target_token_ids=target_token_ids,
        next_token_ids=next_token_ids,
        target_positions=target_positions,
        target_hidden_states=hidden,
        token_indices_to_sample=token_indices_to_sample,
        cad=common_attn_metadata,
        num_rejected_tokens_gpu=num_rejected_tokens_gpu,
    )
    proposer.build_model_inputs_first_pass(queries, queries, None)  # stores the context K/V
    return torch.empty(metadata.batch_size(), 0, dtype=torch.int64, device=hidden.device)


def _execute_model(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    runtime = _runner_runtime(self)
    if runtime is not None:
        runtime.start_step(time.perf_counter())
    return original(self, *args, **kwargs)


def _sample_tokens(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    runtime = _runner_runtime(self)
    if runtime is None:
        return original(self, *args, **kwargs)
    state = getattr(self, "execute_model_state", None)
    metadata = getattr(state, "spec_decode_metadata", None)
    output = original(self, *args, **kwargs)
    req_ids = getattr(output, "req_ids", None)
    sampled = getattr(output, "sampled_token_ids", None)
    if isinstance(req_ids, list) and isinstance(sampled, list):
        drafted = list(metadata.num_draft_tokens) if metadata is not None else None
        runtime.settle(req_ids, sampled, drafted, time.perf_counter())
    else:  # asynchronous scheduling: the accepted counts are not known here
        log.debug("DCOCO: no synchronous sampler output; corrected-accepted not counted")
        runtime.settle([], [], None, time.perf_counter())
    return output
