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
  verified and each row's accepted count, and the step's seconds (schedule to output). A vLLM
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
- A step that verifies no drafted token skips vLLM's `rejection_sample`: its output is each
  row's bonus token. Upstream still draws its recovered-token noise, one exponential per
  vocabulary entry and row for any sampled request (14 ms a step at 16 rows of SmolLM2 on 2
  CPU cores), and then discards it. Seeded requests draw nothing at zero drafts upstream
  either, so their streams are unchanged.

The hook points are plain attributes and methods of vLLM's V1 `Scheduler` and the rejection
sampler module's `rejection_sample`; `install` checks they exist and refuses to start
otherwise (`versions.missing`).
"""

import functools
import logging
import os
import sys
import time
from typing import Any

import torch

from dcoco.spec.planner import VerifyPlanner
from dcoco.vllm.versions import UnsupportedVllm, missing

log = logging.getLogger(__name__)
ENV = "DCOCO_ADAPTIVE"  # the worker's setting, exported for vLLM's processes
MARK = "__dcoco_adaptive__"
SCHEDULER_HOOKS = ("__init__", "schedule", "update_from_output")
SAMPLER_MODULE = "vllm.v1.sample.rejection_sampler"
PLACEHOLDER = -1  # vLLM's PLACEHOLDER_TOKEN_ID: no token at that position


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
    """Wraps vLLM's V1 scheduler and its rejection sampling; idempotent."""
    import vllm.v1.sample.rejection_sampler  # noqa: F401  (the module `_wrap` patches)
    from vllm.v1.core.sched.scheduler import Scheduler

    missing(Scheduler, SCHEDULER_HOOKS)
    sampler = sys.modules[SAMPLER_MODULE]
    if not callable(getattr(sampler, "rejection_sample", None)):
        raise UnsupportedVllm(f"{SAMPLER_MODULE}.rejection_sample is gone; {ENV} cannot run")
    if getattr(Scheduler.__init__, MARK, False):
        return
    _wrap(Scheduler, "__init__", _init)
    _wrap(Scheduler, "schedule", _schedule)
    _wrap(Scheduler, "update_from_output", _update_from_output)
    _wrap(sampler, "rejection_sample", _rejection_sample)


def _wrap(owner: Any, name: str, wrapper: Any) -> None:
    """owner.name (a method of a class, or a module's function) calls wrapper(original, ...)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return wrapper(original, *args, **kwargs)

    setattr(wrapped, MARK, True)
    setattr(owner, name, wrapped)


def _rejection_sample(
    original: Any,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """Upstream's, except with no drafted token: then each row's bonus token [R, 1 + S]."""
    if draft_token_ids.shape[0]:  # [T] drafted tokens of the step
        return original(
            draft_token_ids,
            num_draft_tokens,
            max_spec_len,
            cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            *args,
            **kwargs,
        )
    rows = len(num_draft_tokens)
    output = torch.full(
        (rows, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=bonus_token_ids.device
    )  # [R, 1 + S]
    output[:, 0] = bonus_token_ids.view(rows)  # [R]
    return output


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
    planner = VerifyPlanner(self.num_spec_tokens)
    self.dynamic_sd_lookup = PlannedLookup(self, planner, self.scheduler_config.max_num_seqs)
    self._dcoco_started = {}  # id(SchedulerOutput) -> when schedule() returned it
    log.info("DCOCO adaptive speculation: k <= %d planned per step", self.num_spec_tokens)


def _schedule(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    output = original(self, *args, **kwargs)
    if isinstance(self.dynamic_sd_lookup, PlannedLookup):
        self._dcoco_started[id(output)] = time.perf_counter()
    return output


def _update_from_output(
    original: Any, self: Any, scheduler_output: Any, runner_output: Any, *args: Any, **kw: Any
) -> Any:
    lookup = self.dynamic_sd_lookup
    if isinstance(lookup, PlannedLookup):
        started = self._dcoco_started.pop(id(scheduler_output), None)
        if started is not None:
            observe(lookup.planner, scheduler_output, runner_output, time.perf_counter() - started)
    return original(self, scheduler_output, runner_output, *args, **kw)


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
        planner.fixed_cost.add(rows, max(0.0, seconds - costs(width)))
