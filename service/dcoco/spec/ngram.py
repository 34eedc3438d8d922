"""Prompt-lookup (n-gram) drafting: the zero-training baseline, as vLLM's `ngram` method and
llama.cpp's lookup decoding draft.

The last n tokens of a sequence are looked up earlier in its own prompt and output; the tokens
that followed their latest earlier occurrence with k tokens after it are the draft (or, if none
has, the earliest: the longest continuation). The longest n from `MAX_N` down to `MIN_N` with a
match wins. No match drafts nothing, and the cycle is a plain step for that
sequence. Code and quoted text repeat themselves, which is where it pays.
"""

import torch

MAX_N = 4  # the longest suffix looked up (vLLM's prompt_lookup_max in its examples)
MIN_N = 2  # one-token matches propose mostly noise and cost a wider verification
TOKENS = 5  # drafted tokens of an n-gram engine, unless told (vLLM's examples use 5)


def lookup(tokens: list[int], k: int) -> list[int]:
    """Up to `k` drafted tokens continuing `tokens` (prompt then output), possibly none."""
    if k < 1 or len(tokens) < MIN_N + 1:
        return []
    context = torch.tensor(tokens)  # [L]
    for n in range(min(MAX_N, len(tokens) - 1), MIN_N - 1, -1):
        windows = context[:-1].unfold(0, n, 1)  # [L-n, n]: every n-gram that has a successor
        starts = (windows == context[-n:]).all(dim=1).nonzero().squeeze(1) + n  # [M]
        if len(starts):
            whole = starts[starts + k <= len(tokens)]  # [W] matches followed by k tokens
            start = int(whole[-1]) if len(whole) else int(starts[0])
            return tokens[start : start + k]
    return []
