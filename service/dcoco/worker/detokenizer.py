"""Incremental detokenization with stop strings.

Token ids arrive a few at a time. Text is released only once it is final: not the start of a
multi-byte character still being decoded (a trailing U+FFFD), and not a possible beginning of
a stop string. A stop string ends the text just before it, as in OpenAI's API.
"""

from dcoco.tokenizer import Tokenizer

# Tokens decoded again before the unread ones, so that merges across the boundary come out right.
CONTEXT_TOKENS = 6


class Detokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        stops: tuple[str, ...] = (),
        prefix_ids: list[int] | None = None,
        sent_text: str = "",
    ) -> None:
        """`prefix_ids` and `sent_text` resume a request: the tokens an earlier attempt
        generated and the part of their text the client already has."""
        self.tokenizer, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.pending = ""  # decoded, not yet released
        self.stopped = False
        self.skip = len(sent_text)  # released characters the client already has
        unsent = self.push(list(prefix_ids or []))
        self.pending = unsent + self.pending  # goes out with the next tokens

    def push(self, token_ids: list[int]) -> str:
        """Adds tokens; returns the text now final. After a stop string, returns '' forever."""
        if self.stopped or not token_ids:
            return ""
        self.ids += token_ids
        self.pending += self._decode_new()
        return self._release(final=False)

    def flush(self) -> str:
        """The generation ended: everything still held back is final (except a cut character)."""
        if self.stopped:
            return ""
        self.pending = self.pending.rstrip("\ufffd")
        return self._release(final=True)

    def _decode_new(self) -> str:
        before = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new, or a character cut in half: wait for more tokens
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def _release(self, final: bool) -> str:
        hits = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self.pending = self.pending[: min(hits)], ""
        else:
            hold = 0 if final else self._partial_stop_length()
            out = self.pending[: len(self.pending) - hold]
            self.pending = self.pending[len(self.pending) - hold :]
        skipped = min(self.skip, len(out))
        self.skip -= skipped
        return out[skipped:]

    def _partial_stop_length(self) -> int:
        """Length of the longest suffix of `pending` that begins some stop string."""
        best = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(self.pending)), best, -1):
                if stop.startswith(self.pending[-size:]):
                    best = size
                    break
        return best
