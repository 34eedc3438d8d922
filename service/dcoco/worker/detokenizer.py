"""Incremental detokenization with stop strings.

Token ids arrive a few at a time. `tokenizers`' DecodeStream turns them into text, holding back
a multi-byte character until its last byte arrives. On top of that, text that could be the
beginning of a stop string is held back until it is not. A stop string ends the text just
before it, as in OpenAI's API.
"""

from tokenizers.decoders import DecodeStream

from dcoco.tokenizer import Tokenizer


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
        self.stream = DecodeStream(skip_special_tokens=True)
        self.pending = ""  # decoded, not yet released
        self.stopped = False
        self.skip = len(sent_text)  # released characters the client already has
        unsent = self.push(list(prefix_ids or []))
        self.pending = unsent + self.pending  # goes out with the next tokens

    def push(self, token_ids: list[int]) -> str:
        """Adds tokens; returns the text now final. After a stop string, returns '' forever."""
        if self.stopped or not token_ids:
            return ""
        for token in token_ids:  # one at a time, so a cut character holds back only itself
            self.pending += self.stream.step(self.tokenizer.inner, token) or ""
        return self._release(final=False)

    def flush(self) -> str:
        """The generation ended: everything held back is final, except a character whose
        last bytes never came (it is dropped, never sent as U+FFFD)."""
        if self.stopped:
            return ""
        return self._release(final=True)

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
