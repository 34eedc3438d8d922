"""vLLM's speculative config for a drafter in DFlash's layout (DCOCO's drafters included): the
one the vllm worker, `make bench-vllm` and `dcoco.vllm.offline` all start vLLM with.

`disable_eagle_block_drop` is on. For drafters that read the target's hidden states (EAGLE,
MTP, DFlash) vLLM drops the last prefix-cache block a request matches, in case the drafter's
state for it is stale, and prefills it again. DFlash keeps its context as keys and values in
the same paged cache, written in the step that verifies the tokens, so a cached block already
holds the drafter's whole context for it. With the drop a repeated prompt of under two blocks
(256 tokens on CPU) reused nothing, where plain decoding reuses every full block: speculation
paid a prefill that plain decoding skipped. Without it a replayed prompt reuses what plain
decoding reuses and drafts exactly as on its first pass (`tests/test_vllm.py`).
"""

from pathlib import Path


def speculative_config(
    drafter: Path, num_speculative_tokens: int, **fields: object
) -> dict[str, object]:
    """`fields`: more of vLLM's speculative-config keys."""
    return {
        "method": "dflash",
        "model": str(drafter),
        "num_speculative_tokens": num_speculative_tokens,
        "disable_eagle_block_drop": True,
    } | fields
