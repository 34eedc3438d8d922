"""The stream extension's token pieces: each generated token's text, decoded by the gateway with
the model's tokenizer, with where it came from (drafted, corrected, target) and its cycle, and
the cycle's rejected draft when asked.

Each choice decodes its tokens incrementally (`tokenizers`' DecodeStream, as the worker's
detokenizer does), so the pieces of a choice join into its text: a token that ends inside a
multi-byte character has an empty piece, and the next token's piece carries the character.
A rejected draft is decoded on its own, from its first token.
"""

from tokenizers.decoders import DecodeStream

from dcoco.gateway.replies import ChunkProvenance, RejectedPiece, TokenPiece
from dcoco.queue.protocol import Event
from dcoco.tokenizer import Tokenizer


class Pieces:
    def __init__(self, tokenizer: Tokenizer, rejected: bool) -> None:
        self.tokenizer, self.rejected = tokenizer, rejected
        self.streams: dict[int, DecodeStream] = {}  # per choice

    def of(self, index: int, event: Event) -> ChunkProvenance | None:
        """The provenance of one choice's delta event; None if it carries no tokens."""
        if not event.token_ids:
            return None
        stream = self.streams.setdefault(index, DecodeStream(skip_special_tokens=True))
        known = len(event.provenance) == len(event.token_ids)  # else the engine did not say
        sources = event.provenance if known else (None,) * len(event.token_ids)
        tokens = [
            TokenPiece(id=token, text=self._step(stream, token), source=source)
            for token, source in zip(event.token_ids, sources, strict=True)
        ]
        return ChunkProvenance(
            cycle=event.cycle if known else None,
            tokens=tokens,
            rejected=self._rejected(event.rejected_ids) if self.rejected else None,
        )

    def _rejected(self, ids: tuple[int, ...]) -> list[RejectedPiece]:
        stream = DecodeStream(skip_special_tokens=True)
        return [RejectedPiece(id=token, text=self._step(stream, token)) for token in ids]

    def _step(self, stream: DecodeStream, token: int) -> str:
        return stream.step(self.tokenizer.inner, token) or ""
