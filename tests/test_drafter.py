import itertools
from pathlib import Path

import pytest
import torch

from dcoco.checkpoint import load_drafter, save_drafter
from dcoco.engine import engine as engine_module
from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter, teacher_forced_blocks
from dcoco.spec.planner import Plan
from factories import greedy_reference


def test_the_training_path_sees_what_the_cached_engine_path_sees(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    """Blocks computed in one teacher-forced pass equal the engine's cached, incremental ones."""
    target, drafter = pair
    prompt = [3, 1, 4, 1, 5, 9, 2]
    continuation = greedy_reference(target, prompt, 20)
    tokens = torch.tensor([prompt + continuation])  # [1, T]
    eng = Engine(
        target, drafter, EngineConfig(mode=Mode.DFLASH, max_batch_size=1, max_model_len=64)
    )
    eng.add_request("r", prompt, SamplingParams(max_tokens=20))
    anchors, cached = [], []
    with torch.no_grad():
        eng.step()  # prefill only admits; the first cycle runs in the same step
        while eng.has_unfinished() and len(anchors) < 3:
            seq = eng.scheduler.running[0]
            anchors.append(seq.num_cached)  # the pending token's position
            cached.append(eng.runner.draft([seq], eng.runner.block).hidden[0])  # [B, H]
            eng.step()
        _, feats = target(
            tokens,
            torch.arange(tokens.shape[1]).unsqueeze(0),
            feature_layers=drafter.config.target_layer_ids,
        )
        forced = teacher_forced_blocks(
            drafter, target.model.embed_tokens, feats, tokens, torch.tensor([anchors])
        )
    assert len(set(anchors)) == 3
    torch.testing.assert_close(forced[0], torch.stack(cached), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cap", [256, 2])
def test_context_deferred_through_plain_steps_drafts_the_same_block(
    pair: tuple[CausalLM, DFlashDrafter], monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    """Plain steps leave the drafter context owed (at most `cap` positions); the next draft
    writes it first and sees what a teacher-forced pass sees, and the output stays the
    target's own."""
    monkeypatch.setattr(engine_module, "MAX_PENDING_CONTEXT", cap)
    target, drafter = pair
    prompt = [3, 1, 4, 1, 5, 9, 2]
    continuation = greedy_reference(target, prompt, 20)
    tokens = torch.tensor([prompt + continuation])  # [1, T]
    cfg = EngineConfig(mode=Mode.DCOCO, max_batch_size=1, max_model_len=64, adaptive=True)
    eng = Engine(target, drafter, cfg)
    assert eng.planner is not None
    plans = itertools.chain([Plan(0)] * 6, itertools.repeat(Plan(eng.block)))
    monkeypatch.setattr(eng.planner, "plan", lambda found, exploring_allowed=True: next(plans))
    eng.add_request("r", prompt, SamplingParams(max_tokens=20))
    output: list[int] = []
    with torch.no_grad():
        for _ in range(6):  # the prefill and six plain steps
            output += [t for out in eng.step().outputs for t in out.new_token_ids]
        seq = eng.scheduler.running[0]
        assert 0 < seq.pending_positions == min(6, cap)
        anchor = seq.num_cached
        cached = eng.runner.draft([seq], eng.runner.block).hidden[0]  # [B, H]
        assert seq.pending_positions == 0
        while eng.has_unfinished():
            output += [t for out in eng.step().outputs for t in out.new_token_ids]
        _, feats = target(
            tokens,
            torch.arange(tokens.shape[1]).unsqueeze(0),
            feature_layers=drafter.config.target_layer_ids,
        )
        forced = teacher_forced_blocks(
            drafter, target.model.embed_tokens, feats, tokens, torch.tensor([[anchor]])
        )
    torch.testing.assert_close(forced[0, 0], cached, rtol=1e-4, atol=1e-4)
    assert output == continuation


def test_a_reduced_vocabulary_scores_its_tokens_as_the_whole_one_and_stays_lossless(
    pair: tuple[CausalLM, DFlashDrafter], tmp_path: Path
) -> None:
    """Drafting over every other token (vLLM's d2t layout) gives those tokens the logits the
    whole vocabulary gives them, survives a save and load, and greedy output is the target's."""
    target, drafter = pair
    vocab = target.config.vocab_size
    kept = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: vocab // 2]  # [V']
    reduced = drafter.with_vocab(kept, target.lm_head.weight)
    save_drafter(reduced, tmp_path / "reduced")
    loaded = load_drafter(tmp_path / "reduced")
    assert loaded.config.draft_vocab_size == vocab // 2
    ids = loaded.vocab_ids
    assert ids is not None
    assert ids.dtype == torch.long
    assert ids.tolist() == sorted(kept.tolist())
    hidden = torch.randn(3, drafter.config.model.hidden_size)  # [3, H]
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.logits(hidden, target.lm_head), target.lm_head(hidden)[:, ids]
        )  # [3, V']
    prompt = [3, 1, 4, 1, 5, 9, 2]
    for mode in (Mode.DFLASH, Mode.DCOCO):
        eng = Engine(target, loaded, EngineConfig(mode=mode, max_batch_size=1, max_model_len=64))
        (done,), _ = eng.generate([prompt], SamplingParams(max_tokens=24))
        assert done.token_ids == greedy_reference(target, prompt, 24)
        eng.add_request("r", prompt, SamplingParams(max_tokens=8))
        eng.step()
        with torch.no_grad():
            draft = eng.runner.draft(eng.scheduler.running, eng.runner.block)
            drafted = eng.runner.correct(draft, [mode is Mode.DCOCO]).tokens  # [1, B]
            best = ids[target.lm_head(draft.hidden)[..., ids].argmax(-1)]  # [1, B]
        assert set(drafted.flatten().tolist()) <= set(ids.tolist())
        if mode is Mode.DFLASH:
            assert torch.equal(drafted, best)


def test_a_draft_of_k_slots_is_what_a_block_of_k_drafts(
    pair: tuple[CausalLM, DFlashDrafter],
) -> None:
    """A cycle that verifies k of B drafted tokens drafts a block of k masks: the draft (and
    the corrector's pick) of an engine whose B is k, the slots beyond it leaving no trace."""
    target, drafter = pair
    drafts = []
    for block in (None, 3):  # the drafter's own B, then B = 3
        cfg = EngineConfig(
            mode=Mode.DCOCO, max_batch_size=1, max_model_len=64, num_speculative_tokens=block
        )
        eng = Engine(target, drafter, cfg)
        eng.add_request("r", [3, 1, 4, 1, 5, 9, 2], SamplingParams(max_tokens=8))
        eng.step()
        with torch.no_grad():
            draft = eng.runner.draft(eng.scheduler.running, 3)
            drafts.append((draft, eng.runner.correct(draft, [True]).tokens))  # [1, 3]
    (short, picked), (alone, picked_alone) = drafts
    assert short.logits.shape[1] == 3
    torch.testing.assert_close(short.logits, alone.logits)
    assert torch.equal(picked, picked_alone)
