"""The embedded engine: continuous batching over a target and an optional DFlash/DCOCO drafter.

`step()` admits waiting requests (prefill), then runs one cycle for every running sequence:
draft, correct, verify, commit. Requests join and leave between steps.
"""

import logging
import time
from dataclasses import replace

import torch

from dcoco.engine.accounting import CycleBook, provenance, report
from dcoco.engine.checks import check_models
from dcoco.engine.outputs import Completion, RequestOutput, StepResult
from dcoco.engine.prefill import (
    MIN_CHUNK,
    UNBOUNDED,
    ChunkPlacement,
    PrefillBudget,
    length_groups,
)
from dcoco.engine.runner import ContextUpdate, ModelRunner
from dcoco.engine.scheduler import Scheduler
from dcoco.engine.sequence import Sequence
from dcoco.engine.uniforms import position_uniforms, request_key
from dcoco.model.causal_lm import CausalLM
from dcoco.precision import WIDTHS, CostTable, cost_table
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode, Precision
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import CycleStats, SpecStats
from dcoco.spec.drafter import DFlashDrafter
from dcoco.spec.ngram import Draft
from dcoco.spec.planner import Plan, VerifyPlanner
from dcoco.spec.verify import sample, target_probs, verify

log = logging.getLogger(__name__)
# A sequence that keeps taking plain steps writes its drafter context once it owes this many
# positions, even before its next draft: it bounds the features kept per sequence.
MAX_PENDING_CONTEXT = 256


class Engine:
    def __init__(self, target: CausalLM, drafter: DFlashDrafter | None, cfg: EngineConfig) -> None:
        block, top_k = check_models(target, drafter, cfg)
        limit = target.config.max_position_embeddings
        if cfg.max_model_len is not None and cfg.max_model_len > limit:
            raise ValueError(
                f"max_model_len {cfg.max_model_len} exceeds the target's limit "
                f"(max_position_embeddings {limit})"
            )
        self.costs: CostTable | None = None  # measured forward costs, when precision is auto
        if cfg.precision is Precision.AUTO:
            self.costs = cost_table(target, WIDTHS, cfg.cache_dir)
            cfg = replace(cfg, precision=self.costs.fastest())
            log.info(
                "precision auto: %s, from forward seconds %s", cfg.precision, self.costs.seconds
            )
        self.cfg = cfg
        self.max_model_len = cfg.max_model_len or limit
        self.block = block  # B, 0 in vanilla mode
        self.runner = ModelRunner(target, drafter, cfg, self.max_model_len, block, top_k)
        self.scheduler = Scheduler(cfg.max_batch_size)
        self.prefill_budget = PrefillBudget(cfg.prefill_tokens, cfg.prefill_cycles)
        self.chunk_placement = ChunkPlacement(cfg.prefill_alongside)
        self.planner = VerifyPlanner(block) if cfg.adaptive and block else None
        if self.planner is not None and self.costs is not None:
            self.planner.start_from(self.costs.seconds[cfg.precision.value])
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self._ids: set[str] = set()

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        vocab = self.runner.target.config.vocab_size
        if request_id in self._ids:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds "
                f"{self.max_model_len} with at least one generated"
            )
        if not all(0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must lie in [0, {vocab})")
        mode = self._mode(params.speculation)
        stops = set(params.stop_token_ids) | (
            set() if params.ignore_eos else set(self.cfg.eos_token_ids)
        )
        self._ids.add(request_id)
        self.scheduler.add(
            Sequence(
                request_id,
                list(prompt_ids),
                params,
                self.max_model_len,
                frozenset(stops),
                sample_key=request_key(params.seed, self.generator),
                mode=mode,
            )
        )

    def _mode(self, asked: Mode | None) -> Mode:
        """A request's speculation: its own when this engine can run it, else the engine's.
        An engine runs its own mode and those that need less (`Mode.runnable`)."""
        mode = asked or self.cfg.mode
        if mode not in self.cfg.mode.runnable():
            raise ValueError(
                f"speculation {mode.speculation!r} is not available: this engine runs "
                f"{self.cfg.mode.speculation!r} (it can also run what needs less: "
                f"{', '.join(m.speculation for m in self.cfg.mode.runnable())})"
            )
        return mode

    def abort(self, request_id: str) -> bool:
        """Drops a request wherever it is; its slot is free for the next step."""
        self._ids.discard(request_id)
        seq, moves = self.scheduler.abort(request_id)
        self.runner.move(moves)
        return seq is not None

    def has_unfinished(self) -> bool:
        return len(self.scheduler) > 0

    @torch.inference_mode()
    def step(self) -> StepResult:
        """Admits waiting prompts, then runs one cycle of the running sequences. Prompts being
        prefilled while others run get a chunk each step, after the cycle or, where that adds
        less, in a plain step's own forward (`_decode`); with nothing running, before the
        cycle, which the prompts done then join."""
        result = StepResult()
        self.scheduler.admit()
        beside = bool(self.scheduler.running) and not self.cfg.feature_layers  # `_share`
        if self.scheduler.prefilling and not beside:
            self._prefill(result, list(self.scheduler.prefilling))
            self._release_finished()
        active = self.scheduler.running
        prefilling = list(self.scheduler.prefilling) if beside else []
        if active:
            start = time.perf_counter()
            result.cycles = (
                self._speculate(active, result, prefilling)
                if self.block
                else self._decode(active, result, prefilling)
            )
            if not prefilling:
                self.prefill_budget.observe_cycle(time.perf_counter() - start)
        self._release_finished()
        return result

    def _release_finished(self) -> None:
        for seq in self.scheduler.running:
            if seq.finished:
                self._ids.discard(seq.request_id)
        self.runner.move(self.scheduler.release_finished())

    def generate(
        self, prompts: list[list[int]], params: SamplingParams
    ) -> tuple[list[Completion], list[CycleStats]]:
        """Runs prompts to completion, all concurrently; returns completions in prompt order."""
        ids = [f"generate-{i}" for i in range(len(prompts))]
        for request_id, prompt in zip(ids, prompts, strict=True):
            self.add_request(request_id, prompt, params)
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        done: dict[str, RequestOutput] = {}
        cycles = []
        while self.has_unfinished():
            step = self.step()
            cycles += step.cycles
            for out in step.outputs:
                tokens[out.request_id] += out.new_token_ids
                if out.finished:
                    done[out.request_id] = out
        completions = [
            Completion(i, p, tokens[i], done[i].finish_reason or "abort", done[i].stats)
            for i, p in zip(ids, prompts, strict=True)
        ]
        return completions, cycles

    def _prefill(
        self, result: StepResult, seqs: list[Sequence], part: float = 1.0
    ) -> tuple[int, float]:
        """One chunk of every prompt being prefilled, in forwards of their own, taking `part`
        of the budget; returns the chunks' tokens and seconds. Whole prompts go in forwards of
        like lengths (`prefill.length_groups`), not all padded to the longest."""
        chunks, allowed = self._chunks(seqs, part), self._allowed(seqs, part)
        whole = self._share(seqs, part) == UNBOUNDED
        start = time.perf_counter()
        for rows in length_groups(chunks) if whole else [list(range(len(seqs)))]:
            group, sizes = [seqs[row] for row in rows], [chunks[row] for row in rows]
            logits, context = self.runner.prefill(group, sizes)  # [D, V]
            seconds = time.perf_counter() - start
            self._chunked(group, sizes, logits, context, result, seconds, allowed)
        return sum(chunks), time.perf_counter() - start

    def _chunks(self, seqs: list[Sequence], part: float = 1.0) -> list[int]:
        share = self._share(seqs, part)
        return [min(len(s.prompt_ids) - s.num_cached, share) for s in seqs]

    def _chunked(
        self,
        seqs: list[Sequence],
        chunks: list[int],
        logits: torch.Tensor,
        context: ContextUpdate,
        result: StepResult,
        seconds: float,
        allowed: int | None,
    ) -> None:
        """Books a step's chunks (`logits` [D, V] after the D that end their prompt): a prompt
        now wholly cached gets its first token and its sequence joins the running ones.
        `seconds`: what the chunks added to the step, which steers the budget where they were
        `allowed` that many tokens (`_allowed`)."""
        self.runner.extend_context(context)
        if allowed is not None:
            self.prefill_budget.observe_chunk(sum(chunks), seconds, allowed)
        for seq, chunk in zip(seqs, chunks, strict=True):
            seq.num_cached += chunk
        rows = [row for row, seq in enumerate(seqs) if seq.num_cached == len(seq.prompt_ids)]
        done = [seqs[row] for row in rows]
        if done:
            first = self._sample(done, logits).tolist()  # [D]
            for row, seq, token in zip(rows, done, first, strict=True):
                features = self._features(context, row, seq.num_cached)
                report(seq, seq.append([token]), result, provenance(0, None), (), features)
        self.runner.move(self.scheduler.prefilled(done))

    def _allowed(self, seqs: list[Sequence], part: float) -> int | None:
        """The prompt tokens a step's chunks were allowed, where what they cost steers the
        budget: not for whole prompts, nor for a chunk that took only `part` of the budget (a
        way explored)."""
        share = self._share(seqs, part)
        return share * len(seqs) if share < UNBOUNDED and part == 1.0 else None

    def _share(self, seqs: list[Sequence], part: float = 1.0) -> int:
        """Prompt tokens each sequence may prefill this step: all that remain (UNBOUNDED) while
        nothing is decoding, or while features are collected, which needs whole prompts;
        otherwise an equal share of `part` of the step's budget (`PrefillBudget`), at least
        MIN_CHUNK."""
        if not self.scheduler.running or self.cfg.feature_layers:
            return UNBOUNDED
        return max(MIN_CHUNK, int(self.prefill_budget.tokens() * part) // len(seqs))

    def _decode(
        self, seqs: list[Sequence], result: StepResult, prefilling: list[Sequence]
    ) -> list[CycleStats]:
        """One plain step: vanilla mode, or a speculative cycle that verifies nothing. The
        prompts `prefilling` get their chunks in the same forward or after it in their own,
        whichever `chunk_placement` finds adds less to the step."""
        alongside, part = False, 1.0
        if prefilling:
            floor = MIN_CHUNK * len(prefilling) / self.prefill_budget.tokens()
            alongside, part = self.chunk_placement.choose(floor)
        start = time.perf_counter()
        if alongside:
            chunks = self._chunks(prefilling, part)
            (logits, context), chunked = self.runner.decode_with_chunks(
                seqs, prefilling, chunks
            )  # [N, V]
        else:
            logits, context = self.runner.decode(seqs)  # [N, V]
        self.runner.defer_context(seqs, context, [1] * len(seqs))
        tokens = self._sample(seqs, logits).tolist()  # [N]
        elapsed = time.perf_counter() - start
        book = CycleBook({"draft": 0.0, "correct": 0.0, "verify": elapsed, "total": elapsed})
        for row, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            seq.num_cached += 1
            book.record(seq, SpecStats(verifications=1), 1)
            kept = seq.append([token])
            report(seq, kept, result, provenance(0, None), (), self._features(context, row, 1))
        if alongside:
            added = elapsed - self.prefill_budget.per_cycle  # what the chunks cost the step
            allowed = self._allowed(prefilling, part)
            self._chunked(prefilling, chunks, *chunked, result, added, allowed)
            self.chunk_placement.observe(True, sum(chunks), added)
        elif prefilling:
            self.chunk_placement.observe(False, *self._prefill(result, prefilling, part))
        return book.cycles()

    def _features(self, context: ContextUpdate, row: int, count: int) -> torch.Tensor | None:
        """The first `count` positions' features of one row, when the config asks for them."""
        if not self.cfg.feature_layers:
            return None
        return context.features[row, :count].clone()  # [count, F]

    def _speculate(
        self, seqs: list[Sequence], result: StepResult, prefilling: list[Sequence]
    ) -> list[CycleStats]:
        """Draft for the sequences that speculate (the drafter for DFlash and DCOCO, which the
        corrector then re-selects; prompt lookup for n-gram, and for the DFlash and DCOCO rows
        the adaptive planner gives their lookup draft), then verify every sequence: one
        that drafted nothing verifies only its own next token. The prompts `prefilling` get
        their chunk in the plain step's forward when the cycle verifies nothing, else after
        the cycle in their own."""
        self.runner.flush_context([s for s in seqs if s.pending_positions >= MAX_PENDING_CONTEXT])
        speculating = [row for row, s in enumerate(seqs) if s.mode is not Mode.VANILLA]
        shadow = self._lookups(seqs)  # rows the planner may draft by prompt lookup
        plan = self._plan(seqs, shadow) if speculating else Plan(0)
        k = plan.k
        drafting = [
            row
            for row in speculating
            if seqs[row].mode.needs_drafter and plan.drafting and row not in plan.looked_up
        ]
        looked_up = {
            row: seqs[row].lookup(k).tokens for row in speculating if seqs[row].mode is Mode.NGRAM
        } | {row: shadow[row].tokens[:k] for row in plan.looked_up}
        if not drafting and not plan.looked_up:  # verify no wider than the longest lookup
            k = max((len(found) for found in looked_up.values()), default=0)
        committed_before = [len(s.output_ids) for s in seqs]
        if k == 0:
            cycles = self._decode(seqs, result, prefilling)
            if not prefilling:  # a step that carried chunks says nothing of a plain step's cost
                self._observe(seqs, 0, [], 0.0, sum(c.seconds["total"] for c in cycles[:1]))
            self._observe_lookups(seqs, shadow, committed_before)
            return cycles
        t0 = time.perf_counter()
        proposed: list[list[int]] = [looked_up.get(row, []) for row in range(len(seqs))]
        chosen: list[list[int]] = [[0] * len(found) for found in proposed]  # candidate per slot
        deferred_s = 0.0  # drafting seconds owed by the plain steps before (`_catch_up`)
        if drafting:
            writers = [seqs[row] for row in drafting]
            deferred_s = self._catch_up(writers, k)
            draft = self.runner.draft(writers, k)
        t1 = time.perf_counter()
        if drafting:
            selection = self.runner.correct(draft, [seqs[r].mode is Mode.DCOCO for r in drafting])
            tokens, index = selection.tokens[:, :k].tolist(), selection.index[:, :k].tolist()
            for i, row in enumerate(drafting):
                proposed[row], chosen[row] = tokens[i], index[i]
        t2 = time.perf_counter()
        drafted = torch.tensor(
            [p + [s.last_token] * (k - len(p)) for s, p in zip(seqs, proposed, strict=True)]
        )  # [N, k]: short drafts padded with the pending token, cut off below
        logits, context = self.runner.verify(seqs, drafted)  # [N, k+1, V]
        temperature, top_p = self._params(seqs)
        uniforms = self._uniforms(seqs, k + 1)  # [N, k+1] or None
        verdict = verify(logits, drafted, temperature, top_p, uniforms)
        t3 = time.perf_counter()
        phases = {"draft": t1 - t0, "correct": t2 - t1, "verify": t3 - t2, "total": t3 - t0}
        book = CycleBook(phases)
        # A padded slot the target happens to accept is cut: the token after the real draft is
        # then the target's own (accepted or resampled, it follows the target's distribution).
        accepted = [
            min(held, len(p)) for held, p in zip(verdict.accepted.tolist(), proposed, strict=True)
        ]  # [N]
        self.runner.defer_context(seqs, context, [held + 1 for held in accepted])
        rows = zip(seqs, accepted, proposed, chosen, verdict.tokens.tolist(), strict=True)
        for row, (seq, held, mine, index, tokens) in enumerate(rows):
            seq.num_cached += held + 1
            self._cycle_row(seq, book, result, held, index, mine, tokens, row in looked_up)
        by_drafter = [row for row in speculating if row not in plan.looked_up]
        self._observe(seqs, k, [accepted[row] for row in by_drafter], t2 - t0 - deferred_s, t3 - t2)
        self._observe_lookups(seqs, shadow, committed_before)
        if prefilling:
            self._prefill(result, prefilling)
        return book.cycles()

    def _catch_up(self, seqs: list[Sequence], k: int) -> float:
        """Writes the drafter context `seqs` owe; returns the seconds of it that a run of
        drafting cycles would not have spent, which the planner is not charged: in such a run a
        row owes the k + 1 positions its last cycle committed at most, while after plain steps
        it owes one a step. Charged whole, that catching up made drafting look dear after every
        run of plain steps, and the planner misjudged it: on held-out code (int4, batch 1, AMD
        EPYC, six rounds taking turns with vanilla) adaptive DCOCO made 0.87-1.03x plain
        before, 1.00-1.09x after, drafting 2 tokens a cycle."""
        owed = sum(s.pending_positions for s in seqs)
        start = time.perf_counter()
        self.runner.flush_context(seqs)
        seconds = time.perf_counter() - start
        steady = len(seqs) * (k + 1)
        return seconds * max(0.0, 1 - steady / owed) if owed else 0.0

    def _cycle_row(
        self,
        seq: Sequence,
        book: CycleBook,
        result: StepResult,
        held: int,
        chosen: list[int],
        drafted: list[int],
        tokens: list[int],
        looked_up: bool,
    ) -> None:
        """One sequence's part of a cycle: `held` of its k drafted tokens accepted (`chosen`:
        their candidate index per slot; `looked_up`: drafted by prompt lookup), then the
        target's token (`tokens[held]`)."""
        k = len(drafted)
        overridden = [i != 0 for i in chosen]  # [k] re-selected by the corrector
        verdict_row = SpecStats(
            verifications=1,
            draft_tokens=k,
            accepted_tokens=held,
            accepted_per_position=[int(p < held) for p in range(self.block)],
            corrected_tokens=sum(overridden),
            corrected_accepted_tokens=sum(overridden[:held]),
            lookup_draft_tokens=k if looked_up else 0,
            lookup_accepted_tokens=held if looked_up else 0,
        )
        kept = seq.append(tokens[: held + 1])
        used = min(held, len(kept))  # a stop or the length limit may cut the cycle short
        output_row = replace(
            verdict_row,
            accepted_tokens=used,
            accepted_per_position=[int(p < used) for p in range(self.block)],
            corrected_accepted_tokens=sum(overridden[:used]),
            lookup_accepted_tokens=used if looked_up else 0,
        )
        book.record(seq, verdict_row, held + 1, output_row)
        # Rejected: what the output did not use of the draft, as `usage` counts it.
        report(seq, kept, result, provenance(held, chosen), tuple(drafted[used:k]))

    def _plan(self, seqs: list[Sequence], shadow: dict[int, Draft]) -> Plan:
        """How many drafted tokens this cycle verifies, all B unless adaptive, and which rows
        verify their lookup draft (`shadow`) instead of the drafter's. Any prefix of either is
        safe for seeded requests too: their output does not depend on it (`engine/uniforms.py`)."""
        if self.planner is None:
            return Plan(self.block)
        none = Draft([], 0)
        found = [shadow.get(row, none) for row in range(len(seqs))]
        return self.planner.plan([(len(draft.tokens), draft.n) for draft in found])

    def _lookups(self, seqs: list[Sequence]) -> dict[int, Draft]:
        """Each drafter row's prompt-lookup draft of up to B tokens, where the engine lets the
        planner weigh them (`cfg.lookup`); rows without a match are left out."""
        if self.planner is None or not self.cfg.lookup:
            return {}
        drafts = {
            row: seq.lookup(self.block) for row, seq in enumerate(seqs) if seq.mode.needs_drafter
        }
        return {row: draft for row, draft in drafts.items() if draft.tokens}

    def _observe_lookups(
        self, seqs: list[Sequence], shadow: dict[int, Draft], before: list[int]
    ) -> None:
        """Teaches the planner the lookup drafts' acceptance from what each row committed this
        cycle (its output beyond `before`), whether or not they were verified (`spec/planner`)."""
        if self.planner is None or not shadow:
            return
        outcomes = []
        for row, (draft, n) in shadow.items():
            committed = seqs[row].output_ids[before[row] :]
            held = next(
                (p for p, (a, b) in enumerate(zip(draft, committed, strict=False)) if a != b),
                min(len(draft), len(committed)),
            )
            outcomes.append((n, held, min(len(draft), len(committed), held + 1)))
        self.planner.observe_lookups(outcomes)

    def _observe(
        self, seqs: list[Sequence], k: int, accepted: list[int], fixed_s: float, verify_s: float
    ) -> None:
        if self.planner is not None:
            self.planner.observe(len(seqs), k, accepted, fixed_s, verify_s)

    def _params(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        temperature = torch.tensor([s.params.temperature for s in seqs])  # [N]
        top_p = torch.tensor([s.params.top_p for s in seqs])  # [N]
        return temperature, top_p

    def _uniforms(self, seqs: list[Sequence], width: int) -> torch.Tensor | None:
        """[N, width] uniforms for each row's next `width` output positions, keyed by position;
        None when every row is greedy."""
        if all(s.params.greedy for s in seqs):
            return None
        return torch.stack(
            [position_uniforms(s.sample_key, len(s.output_ids), width) for s in seqs]
        )  # [N, width]

    def _sample(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """One token per row from logits [N, V]: argmax for greedy rows, else a sample."""
        tokens = logits.max(-1).indices  # [N]
        uniforms = self._uniforms(seqs, 1)
        if uniforms is None:
            return tokens
        temperature, top_p = self._params(seqs)
        probs = target_probs(logits.unsqueeze(1), temperature, top_p)[:, 0]  # [N, V]
        return torch.where(temperature == 0, tokens, sample(probs, uniforms[:, 0]))  # [N]
