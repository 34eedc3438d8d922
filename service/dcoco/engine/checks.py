"""Whether a target, a drafter and an engine configuration make a working pair."""

from dcoco.model.causal_lm import CausalLM
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.options import Mode
from dcoco.spec import ngram
from dcoco.spec.drafter import DFlashDrafter


def check_models(
    target: CausalLM, drafter: DFlashDrafter | None, cfg: EngineConfig
) -> tuple[int, int]:
    """Validates the pairing; returns (B, K) for this engine, B = 0 in vanilla mode and K = 0
    without a drafter."""
    if cfg.mode is Mode.VANILLA:
        return 0, 0
    if cfg.mode is Mode.NGRAM:
        return cfg.num_speculative_tokens or ngram.TOKENS, 0
    if drafter is None:
        raise ValueError(f"mode {cfg.mode} needs a drafter")
    d, t = drafter.config, target.config
    if d.model.hidden_size != t.hidden_size or d.target_hidden_size != t.hidden_size:
        raise ValueError(
            f"drafter hidden size {d.model.hidden_size} does not match the target's {t.hidden_size}"
        )
    if d.model.vocab_size != t.vocab_size:
        raise ValueError(f"drafter vocabulary {d.model.vocab_size} != target's {t.vocab_size}")
    if max(d.target_layer_ids) >= t.num_hidden_layers:
        raise ValueError(
            f"target_layer_ids {list(d.target_layer_ids)} exceed the target's "
            f"{t.num_hidden_layers} layers"
        )
    block = cfg.num_speculative_tokens or d.block_size
    if cfg.mode is Mode.DFLASH:
        return block, 1
    if drafter.corrector is None:
        raise ValueError("mode dcoco needs a drafter with a corrector (a DCOCODraftModel)")
    top_k = cfg.top_k or drafter.corrector.config.top_k
    if top_k > t.vocab_size:
        raise ValueError(f"top_k {top_k} exceeds the vocabulary size {t.vocab_size}")
    if block < 2:
        raise ValueError("mode dcoco needs at least 2 speculative tokens")
    return block, top_k
