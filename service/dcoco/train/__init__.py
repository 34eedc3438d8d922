"""Training the embedded model pairs on CPU (`dcoco train`).

Stages, each resumable: corpus (stdlib code, synthetic math, docstring prose, as chat turns),
tokenizer (byte-level BPE), target (a small Qwen3), distill (the target's greedy
continuations), dflash (the block drafter), dcoco (drafter and corrector jointly, from dflash)
and dcoco-frozen (the corrector alone on the frozen dflash drafter); then an export.
"""
