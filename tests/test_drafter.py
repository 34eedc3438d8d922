import torch

from dcoco.engine.engine import Engine
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.spec.drafter import DFlashDrafter, teacher_forced_blocks
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
            cached.append(eng.runner.draft([seq]).hidden[0])  # [B, H]
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
