"""The model runner: batched forward passes over sequences, one method per step.

It owns the two KV caches and knows positions and masks; it never decides which tokens are
kept. Every method takes the running sequences in batch order and returns batched tensors.
"""

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dcoco.engine.compiled import CompiledLayers, warm_shapes
from dcoco.engine.kv_cache import CacheView, KVCache
from dcoco.engine.scheduler import Move
from dcoco.engine.sequence import Sequence
from dcoco.engine.stalls import StallGuard
from dcoco.model import flex
from dcoco.model.causal_lm import Batch, CausalLM
from dcoco.model.layers import LayerCall, set_attention_upcast
from dcoco.model.packed import pack_linears
from dcoco.model.quant import quantized_linears
from dcoco.precision import (
    ACTIVATIONS,
    apply_precision,
    attention_upcast,
    dense_crossover,
    quantize_like,
)
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Precision
from dcoco.spec.drafter import DFlashDrafter
from dcoco.spec.select import Candidates, Selection, select, token_ids


@dataclass(frozen=True)
class Draft:
    hidden: torch.Tensor  # [N, S, H] the drafter's state at each slot read, S <= B
    logits: torch.Tensor  # [N, S, V'] over the drafting vocabulary (`DFlashDrafter.logits`)


@dataclass(frozen=True)
class ContextUpdate:
    """Target features still to be turned into drafter context keys and values."""

    view: CacheView
    features: torch.Tensor  # [N, T, F]


class ModelRunner:
    def __init__(
        self,
        target: CausalLM,
        drafter: DFlashDrafter | None,
        cfg: EngineConfig,
        max_model_len: int,
        block: int,
        top_k: int,
    ) -> None:
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.block, self.top_k = block, top_k  # B and K
        dtype = ACTIVATIONS[cfg.precision]
        capacity = max_model_len + block + 2  # a verify block past the end, plus scratch
        t = target.config
        apply_precision(target, cfg.precision)  # in place: the models belong to this engine now
        dense_crossover(target, cfg.cache_dir)
        upcast = dtype == torch.bfloat16 and attention_upcast(target, cfg.cache_dir)
        set_attention_upcast(target, upcast)
        # Where small bf16 attention upcasts, eager layers read the cache as views and convert
        # every row's whole context each step (68% of a step at batch 128), so their caches
        # hold fp32. Compiled layers gather the rows into a fresh copy anyway and convert in the
        # same pass, which is cheaper than gathering fp32: their caches stay bf16.
        compiles = cfg.compile and cfg.precision is not Precision.FP32
        cache_dtype = torch.float32 if upcast and not compiles else dtype
        # Decoding rows read their own contexts (`EngineConfig.own_rows`) in whole blocks.
        self.own_rows = cfg.own_rows and not compiles and cache_dtype == torch.float32
        if self.own_rows:
            capacity = flex.padded_length(capacity)
        self.target_cache = KVCache(
            t.num_hidden_layers,
            cfg.max_batch_size + 1,  # a spare slot for swaps (`Scheduler`)
            t.num_key_value_heads,
            t.head_dim,
            capacity,
            cache_dtype,
        )
        target.rotary.reserve(capacity, dtype)
        self.feature_layers: tuple[int, ...] = cfg.feature_layers
        self.drafter_cache: KVCache | None = None
        if drafter is not None:
            d = drafter.config.model
            drafter.cast(dtype)
            quantize_like(drafter.layers, target)
            pack_linears(drafter, keep=drafter.corrector)
            set_attention_upcast(drafter, upcast)
            self.drafter_cache = KVCache(
                d.num_hidden_layers,
                cfg.max_batch_size + 1,  # a spare slot for swaps (`Scheduler`)
                d.num_key_value_heads,
                d.head_dim,
                capacity,
                cache_dtype,
            )
            drafter.rotary.reserve(capacity, dtype)
            self.feature_layers = drafter.config.target_layer_ids
            if drafter.corrector is not None:
                # Its whole-vocabulary token table, built now rather than inside the first
                # cycle (14 ms for SmolLM2's), whose drafting the planner would take for usual.
                drafter.corrector.build_token_table(target.model.embed_tokens.weight)
        self.compiled: CompiledLayers | None = None  # the target's layers
        self.compiled_drafter: CompiledLayers | None = None
        self.stalls = StallGuard()  # eager layers while compiled forwards stall
        if compiles:
            self._start_compiling(cfg, max_model_len)

    def wait_compiled(self) -> None:
        """Blocks until both models' layers are compiled, or failed to: for measuring the
        steady state (a serving engine never waits)."""
        for part in (self.compiled, self.compiled_drafter):
            if part is not None:
                part.done.wait()

    def _start_compiling(self, cfg: EngineConfig, max_model_len: int) -> None:
        """Compiles the target's layers and the drafter's on background threads, for the
        shapes this engine's steps take (`engine/compiled.py`)."""
        target, drafter = self.target, self.drafter
        dense_from = min((m.dense_from for m in quantized_linears(target.model)), default=None)

        def target_forward(positions: torch.Tensor, mask: torch.Tensor, call: LayerCall) -> object:
            ids = torch.zeros_like(positions)  # [N, T], token 0 everywhere
            return target(ids, positions, mask=mask, call=call)

        # Prompts' chunks, up to prefill_tokens a row, fall in the verifies' classes: compiled
        # for vanilla engines too, a chunk beside decoding streams costs them less.
        widths = max(self.block + 1, min(cfg.prefill_tokens, max_model_len))
        shapes = warm_shapes(cfg.max_batch_size, widths, dense_from)
        self.compiled = CompiledLayers(target_forward, self.target_cache, shapes)
        self.compiled.start(cfg.cache_dir)
        if drafter is None or self.drafter_cache is None:
            return
        hidden, dtype = drafter.config.model.hidden_size, ACTIVATIONS[cfg.precision]

        def drafter_forward(positions: torch.Tensor, mask: torch.Tensor, call: LayerCall) -> object:
            embeds = torch.zeros(*positions.shape, hidden, dtype=dtype)  # [N, T, H]
            return drafter(embeds, positions, None, mask, call)

        # Every draft: 1 to B slots, each side of the quantized layers' switch to dense weights.
        draft_widths = sorted({2, self.block + 1})
        blocks = [(n, t) for n in (1, 2) for t in draft_widths if n <= cfg.max_batch_size]
        self.compiled_drafter = CompiledLayers(drafter_forward, self.drafter_cache, blocks)
        self.compiled_drafter.start(cfg.cache_dir)

    def prefill(
        self, seqs: list[Sequence], chunks: list[int]
    ) -> tuple[torch.Tensor, ContextUpdate]:
        """Caches the next chunks[i] prompt tokens of each sequence, after its num_cached;
        returns the next-token logits [D, V] of the D rows whose chunk ends their prompt
        (`_chunk_logits`)."""
        ids, view = self._chunk_inputs(seqs, chunks)  # [N, T]
        hidden, feats = self._target(ids, view)  # [N, T, H], [N, T, F]
        return self._chunk_logits(seqs, hidden, chunks), self._context(view, feats)  # [D, V]

    def decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, ContextUpdate]:
        """Vanilla step: the pending token of each sequence -> next-token logits [N, V]."""
        ids, view = self._decode_inputs(seqs)  # [N, 1]
        hidden, feats = self._target(ids, view)  # [N, 1, H], [N, 1, F]
        return self.target.logits(hidden[:, 0]), self._context(view, feats)  # [N, V]

    def decode_with_chunks(
        self, seqs: list[Sequence], prefilling: list[Sequence], chunks: list[int]
    ) -> tuple[tuple[torch.Tensor, ContextUpdate], tuple[torch.Tensor, ContextUpdate]]:
        """`decode(seqs)` and `prefill(prefilling, chunks)` in one forward of the target
        (`CausalLM.forward_groups`): every weight is read once for both. It runs eagerly."""
        decode_ids, decode_view = self._decode_inputs(seqs)  # [N, 1]
        chunk_ids, chunk_view = self._chunk_inputs(prefilling, chunks)  # [P, T]
        batches = [
            Batch(ids, view.positions, self.target_cache.source(view), view.mask)
            for ids, view in ((decode_ids, decode_view), (chunk_ids, chunk_view))
        ]
        (decoded, decode_feats), (chunked, chunk_feats) = self.target.forward_groups(
            batches, self.feature_layers
        )  # [N, 1, H], [P, T, H] and their features
        return (
            (self.target.logits(decoded[:, 0]), self._context(decode_view, decode_feats)),
            (
                self._chunk_logits(prefilling, chunked, chunks),
                self._context(chunk_view, chunk_feats),
            ),
        )  # [N, V] and [D, V]

    def _decode_inputs(self, seqs: list[Sequence]) -> tuple[torch.Tensor, CacheView]:
        ids = torch.tensor([[s.last_token] for s in seqs])  # [N, 1]
        positions = torch.tensor([[s.num_cached] for s in seqs])  # [N, 1]
        slots = [s.slot for s in seqs]
        if self.own_rows:
            return ids, self.target_cache.own_rows(slots, positions)
        length = max(s.num_cached for s in seqs) + 1
        return ids, CacheView.build(slots, positions, positions, length)

    def _chunk_inputs(
        self, seqs: list[Sequence], chunks: list[int]
    ) -> tuple[torch.Tensor, CacheView]:
        width = max(chunks)
        ids = torch.tensor(
            [
                s.prompt_ids[s.num_cached : s.num_cached + n] + [0] * (width - n)
                for s, n in zip(seqs, chunks, strict=True)
            ]
        )  # [N, T]
        starts = torch.tensor([s.num_cached for s in seqs])  # [N]
        return ids, self._ragged_view(seqs, starts, torch.tensor(chunks))

    def _chunk_logits(
        self, seqs: list[Sequence], hidden: torch.Tensor, chunks: list[int]
    ) -> torch.Tensor:
        """hidden [N, T, H] -> the next-token logits [D, V] after the chunks that end their
        prompt, in row order. The others' logits would be thrown away: skipping the LM head
        for them saves a pass over its weights (a fifth of a plain step for SmolLM2) on most
        steps a long prompt joins in."""
        rows = [
            row
            for row, (s, n) in enumerate(zip(seqs, chunks, strict=True))
            if s.num_cached + n == len(s.prompt_ids)
        ]
        if not rows:
            return hidden.new_empty(0, self.target.config.vocab_size)  # [0, V]
        index = torch.tensor(rows)  # [D]
        last = hidden[index, torch.tensor(chunks)[index] - 1]  # [D, H]
        return self.target.logits(last)  # [D, V]

    def draft(self, seqs: list[Sequence], slots: int) -> Draft:
        """One drafter pass over [pending token, `slots` masks] for each sequence (slots <= B),
        after writing the context they owe.

        A cycle that verifies k drafted tokens drafts only those k slots, not the B the
        drafter was trained on: its forward then costs k + 1 positions a row instead of B + 1,
        and the first slots of a block cut short hold about as often as a whole block's
        (SmolLM2's DCOCO drafter on held-out code: slot 1 right 0.54-0.58 of the time at B = 2
        and 4, 0.57-0.61 at 15; docs/engine-profile.md)."""
        assert self.drafter is not None
        assert self.drafter_cache is not None
        self.flush_context(seqs)
        view = self._block_view(seqs, causal=False, width=slots + 1)
        last = torch.tensor([s.last_token for s in seqs])  # [N]
        embeds = self.drafter.embed_block(
            self.target.model.embed_tokens, last, slots
        )  # [N, S+1, H]
        compiled = self.compiled_drafter if self.stalls.allows() else None
        call = compiled.call(view) if compiled is not None else None
        kv = self.drafter_cache.source(view)
        hidden = self.drafter(embeds, view.positions, kv, view.mask, call)  # [N, S+1, H]
        states = hidden[:, 1:]  # [N, S, H]
        return Draft(hidden=states, logits=self.drafter.logits(states, self.target.lm_head))

    def correct(self, draft: Draft, corrected: list[bool]) -> Selection:
        """Picks each row's draft over the slots drafted: the top-1 per slot (dflash), or for the
        rows marked in `corrected`, a rule over corrector scores (dcoco). The global and
        discounted rules thus weigh only the slots the cycle verifies."""
        assert self.drafter is not None
        vocab_ids = self.drafter.vocab_ids  # [V'] or None
        places = draft.logits.max(-1).indices  # [N, S]; max is faster than argmax on CPU
        tokens = token_ids(places, vocab_ids)  # [N, S]
        index = torch.zeros_like(tokens)  # [N, S]
        rows = [row for row, wanted in enumerate(corrected) if wanted]
        if not rows:
            return Selection(index=index, tokens=tokens)
        assert self.drafter.corrector is not None
        which = torch.tensor(rows)  # [C]
        cands = Candidates.top_k(draft.logits[which], self.top_k, vocab_ids)  # [C, S, K] each
        scores = self.drafter.corrector(
            draft.hidden[which], cands.ids, cands.logits, self.target.model.embed_tokens.weight
        )  # [C, S-1, K, K]
        chosen = select(self.cfg.rule, scores, cands, self.cfg.gamma)  # [C, S] each
        tokens[which], index[which] = chosen.tokens, chosen.index
        return Selection(index=index, tokens=tokens)

    def verify(
        self, seqs: list[Sequence], draft: torch.Tensor
    ) -> tuple[torch.Tensor, ContextUpdate]:
        """The target over [pending token, draft [N, k]] -> logits [N, k+1, V], k <= B."""
        view = self._block_view(seqs, causal=True, width=draft.shape[1] + 1)
        last = torch.tensor([[s.last_token] for s in seqs])  # [N, 1]
        hidden, feats = self._target(torch.cat([last, draft], dim=1), view)  # [N, B+1, H]
        return self.target.logits(hidden), self._context(view, feats)  # [N, B+1, V]

    def move(self, moves: list[Move]) -> None:
        """Applies the scheduler's slot moves to both caches."""
        for cache in (self.target_cache, self.drafter_cache):
            if cache is not None:
                cache.move(moves)

    def defer_context(self, seqs: list[Sequence], update: ContextUpdate, kept: list[int]) -> None:
        """Keeps the features of each row's first kept[i] positions (those it committed) for its
        next draft; only sequences that draft keep them (`Sequence.pending_context`)."""
        if self.drafter is None:
            return
        for row, (seq, count) in enumerate(zip(seqs, kept, strict=True)):
            if seq.mode.needs_drafter:
                seq.pending_context.append(update.features[row, :count])  # [count, F]

    def flush_context(self, seqs: list[Sequence]) -> None:
        """Writes the drafter context these sequences still owe, in one batched pass."""
        owing = [s for s in seqs if s.pending_context]
        if not owing:
            return
        counts = torch.tensor([s.pending_positions for s in owing])  # [N]
        width = int(counts.max())
        feats = torch.stack(
            [
                F.pad(torch.cat(s.pending_context), (0, 0, 0, width - n))
                for s, n in zip(owing, counts.tolist(), strict=True)
            ]
        )  # [N, T, F], zero rows after each row's own
        starts = torch.tensor([s.num_cached for s in owing]) - counts  # [N]
        view = self._ragged_view(owing, starts, counts)
        self.extend_context(ContextUpdate(view=view, features=feats))
        for seq in owing:
            seq.pending_context.clear()

    def extend_context(self, update: ContextUpdate) -> None:
        """Stores drafter context keys/values for the tokens the target just processed.

        Entries for tokens that were then rejected lie past num_cached: the next block
        overwrites them before anything reads them.
        """
        if self.drafter is None or self.drafter_cache is None:
            return
        context = self.drafter.context(update.features)  # [N, T, H]
        for layer, (k, v) in enumerate(self.drafter.context_kv(context, update.view.positions)):
            self.drafter_cache.write(layer, update.view, k, v)  # [N, Hkv, T, D] each

    def _target(
        self, ids: torch.Tensor, view: CacheView
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        compiled = self.compiled if self.stalls.allows() else None
        call = compiled.call(view) if compiled is not None else None
        kv = self.target_cache.source(view)
        start = time.perf_counter()
        out = self.target(ids, view.positions, kv, view.mask, self.feature_layers, call)
        if self.compiled is not None:
            self.stalls.observe(tuple(ids.shape), time.perf_counter() - start, call is not None)
        return out

    def _context(self, view: CacheView, feats: torch.Tensor | None) -> ContextUpdate:
        empty = torch.empty(*view.positions.shape, 0)  # [N, T, 0]: vanilla has no drafter
        return ContextUpdate(view=view, features=feats if feats is not None else empty)

    def _ragged_view(
        self, seqs: list[Sequence], starts: torch.Tensor, lengths: torch.Tensor
    ) -> CacheView:
        """Row i holds positions starts[i] .. starts[i]+lengths[i]-1, causal; starts and
        lengths [N]. Padding up to the longest row writes to the scratch cell."""
        width = int(lengths.max())
        offsets = torch.arange(width).expand(len(seqs), width)  # [N, T]
        valid = offsets < lengths.unsqueeze(1)  # [N, T]
        wanted = starts.unsqueeze(1) + offsets  # [N, T]
        positions = torch.where(valid, wanted, self.target_cache.scratch)  # [N, T]
        limits = torch.where(valid, wanted, 0)  # [N, T]
        length = int((starts + lengths).max())
        return CacheView.build([s.slot for s in seqs], positions, limits, length)

    def _block_view(self, seqs: list[Sequence], causal: bool, width: int) -> CacheView:
        """Positions num_cached..num_cached+width-1 for each row; causal for the target's
        verify, the whole block visible for the drafter."""
        start = torch.tensor([s.num_cached for s in seqs]).unsqueeze(1)  # [N, 1]
        positions = start + torch.arange(width)  # [N, W]
        limits = positions if causal else (start + width - 1).expand_as(positions)  # [N, W]
        length = max(s.num_cached for s in seqs) + width
        return CacheView.build([s.slot for s in seqs], positions, limits, length)
