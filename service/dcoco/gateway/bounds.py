"""A lower bound on a text's token count that costs a pass over its bytes, not a tokenization.

No token covers more than L bytes of (normalized) input, L being the tokenizer's longest token,
so a text of b bytes has at least ceil(b / L) tokens. A prompt whose bound already exceeds the
context is refused before it is tokenized: a 4 MB body costs milliseconds, not seconds, and what
is tokenized is at most context × L bytes.

The bound holds only where every input byte is covered by a token no longer than its vocabulary
entry, so it is given only for such tokenizers (None otherwise, and prompts are then tokenized
in full, as before):
- a BPE model without dropout, and without an unknown token that fuses runs of unknown
  characters into one (WordPiece and Unigram can cover a whole word with one unknown token);
- pre-tokenizers that split but never remove (no Whitespace, no Split with "removed");
- special tokens that absorb no surrounding whitespace (no lstrip or rstrip).
A normalizer is allowed: the bound measures the normalized text, which the tokenizer's own
normalizer produces in one fast pass.

L counts bytes: a byte-level vocabulary spells each input byte as one character, so its entries
are measured in characters; any other entry, and every special token, in UTF-8 bytes, which is
never less than the bytes it covers (a Metaspace "▁" covers one space in three bytes, a byte
fallback "<0x0A>" one byte in six).
"""

import json
import math
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

KEEPING = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "UnicodeScripts", "Split"}


@dataclass(frozen=True)
class TokenBound:
    longest_token_bytes: int
    inner: HFTokenizer

    def least_tokens(self, text: str) -> int:
        """At least this many tokens encode `text` (without added special tokens)."""
        if self.inner.normalizer is not None:
            text = self.inner.normalizer.normalize_str(text)
        return math.ceil(len(text.encode()) / self.longest_token_bytes)


def token_bound(tokenizer_json: str, inner: HFTokenizer) -> TokenBound | None:
    """The bound for the tokenizer described by `tokenizer_json`, or None if none holds."""
    spec = json.loads(tokenizer_json)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") is not None:
        return None
    if (
        model.get("unk_token") is not None
        and model.get("fuse_unk")
        and not model.get("byte_fallback")
    ):
        return None
    added = spec.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    splitters = _pre_tokenizers(spec.get("pre_tokenizer"))
    if splitters is None:
        return None
    byte_level = any(s.get("type") == "ByteLevel" for s in splitters)
    entries = model.get("vocab") or {}
    longest = max(
        [len(e) if byte_level else len(e.encode()) for e in entries]
        + [len(str(token.get("content", "")).encode()) for token in added]
        + [1]
    )
    return TokenBound(longest, inner)


def _pre_tokenizers(spec: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The pre-tokenizers in `spec`, flattened; None if one of them may drop input."""
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        found: list[dict[str, Any]] = []
        for inner in spec.get("pretokenizers") or []:
            flat = _pre_tokenizers(inner)
            if flat is None:
                return None
            found += flat
        return found
    if spec.get("type") not in KEEPING:
        return None
    if spec.get("type") == "Split" and str(spec.get("behavior", "")).lower() == "removed":
        return None
    return [spec]
