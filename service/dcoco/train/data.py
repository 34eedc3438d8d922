"""Token data for the stages: a packed stream for the target, padded continuations for drafters.

Every document is a rendered chat: the prompt exactly as `dcoco generate --chat` and
evaluation build it, then the answer and `<|im_end|>`, so training sees what inference sees.
"""

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import numpy as np
import torch

from dcoco.tokenizer import END_OF_TEXT, IM_END, Tokenizer, chat_prompt
from dcoco.train.corpus import Record


def document(tokenizer: Tokenizer, record: Record) -> str:
    return chat_prompt(tokenizer, record.user) + record.assistant + IM_END + "\n"


def encode_stream(tokenizer: Tokenizer, records: list[Record]) -> np.ndarray:
    """All records' documents, each followed by <|endoftext|>, as one uint16 stream [L]."""
    eot = tokenizer.token_id(END_OF_TEXT)
    encoded = tokenizer.inner.encode_batch(
        [document(tokenizer, r) for r in records], add_special_tokens=False
    )
    pieces = [np.asarray([*e.ids, eot], dtype=np.uint16) for e in encoded]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint16)  # [L]


def random_windows(
    stream: torch.Tensor, count: int, length: int, generator: torch.Generator
) -> torch.Tensor:
    """`count` windows of length + 1 tokens at random offsets: [count, length + 1]."""
    starts = torch.randint(0, len(stream) - length - 1, (count,), generator=generator)  # [N]
    return stream[starts.unsqueeze(1) + torch.arange(length + 1)].long()  # [N, T+1]


def tiled_windows(stream: torch.Tensor, length: int, limit: int) -> torch.Tensor:
    """Up to `limit` consecutive, non-overlapping windows: [N, length + 1]."""
    count = max(0, min(limit, (len(stream) - 1) // length))
    starts = torch.arange(count) * length  # [N]
    return stream[starts.unsqueeze(1) + torch.arange(length + 1)].long()  # [N, T+1]


class Labels(StrEnum):
    """Where a block's slot labels come from, for rows with `predicted` (teacher-forced text).

    Rows without it hold the target's own greedy answers, where all three agree.
    """

    TEXT = "text"  # the text's own next tokens
    ARGMAX = "argmax"  # the target's argmax after the text's prefix
    # The target's argmax, up to the first slot whose prefix leaves the target's greedy path
    # (a text token there that is not the argmax); later slots are unlabelled. Where labelled,
    # the label is exactly what self-distillation from that anchor would give.
    AGREED = "agreed"


@dataclass(frozen=True)
class Continuations:
    """Training rows: a prompt, then the target's own greedy continuation or a fixed text.

    With `features`, the target's features at every position but a row's last one, computed
    while generating (or in one prefill), so that training needs no target pass: row s's
    positions are rows offsets[s] .. offsets[s] + lengths[s] - 2 of the flat table. With
    `predicted`, the rows are fixed text, and `labels` says what the slots learn.
    """

    tokens: torch.Tensor  # [S, T] prompt then continuation, padded with <|endoftext|>
    prompt_lens: torch.Tensor  # [S]
    lengths: torch.Tensor  # [S] prompt plus continuation
    features: torch.Tensor | None = None  # [P, F], P = sum(lengths - 1)
    offsets: torch.Tensor | None = None  # [S] where each row's features start
    feature_layers: tuple[int, ...] = ()  # the target layers they come from
    predicted: torch.Tensor | None = None  # [S, T] the target's argmax for each position
    teacher_forced: bool = False  # the answers are fixed text, not the target's own
    labels: Labels = Labels.TEXT  # a training setting, not stored

    def save(self, path: Path) -> None:
        torch.save(
            {
                "tokens": self.tokens,
                "prompt_lens": self.prompt_lens,
                "lengths": self.lengths,
                "features": self.features,
                "offsets": self.offsets,
                "feature_layers": list(self.feature_layers),
                "predicted": self.predicted,
                "teacher_forced": self.teacher_forced,
            },
            path,
        )

    @classmethod
    def load(cls, path: Path) -> "Continuations":
        raw = torch.load(path, weights_only=True, mmap=True)
        return cls(
            raw["tokens"],
            raw["prompt_lens"],
            raw["lengths"],
            raw.get("features"),
            raw.get("offsets"),
            tuple(raw.get("feature_layers", ())),
            raw.get("predicted"),
            bool(raw.get("teacher_forced", False)),
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, rows: torch.Tensor) -> "Continuations":
        offsets = None if self.offsets is None else self.offsets[rows]  # [S']
        predicted = None if self.predicted is None else self.predicted[rows]  # [S', T]
        return Continuations(
            self.tokens[rows],
            self.prompt_lens[rows],
            self.lengths[rows],
            self.features,
            offsets,
            self.feature_layers,
            predicted,
            self.teacher_forced,
            self.labels,
        )

    def batch(
        self, rows: torch.Tensor, anchors: int, block: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows [N] -> tokens [N, T], anchors [N, A], labels [N, A, B].

        Anchors are pending-token positions inside the continuation, where the engine drafts.
        Slot p's label is the token at anchor + p + 1 (on a greedy continuation, the target's
        argmax after the true prefix), or the target's prediction there (`Labels`). Slots past
        the end are labelled -100.
        """
        width = int(self.lengths[rows].max())
        tokens = self.tokens[rows, :width]  # [N, T]
        low = self.prompt_lens[rows].unsqueeze(1)  # [N, 1]
        span = self.lengths[rows].unsqueeze(1) - 1 - low  # [N, 1] anchors with a label
        draw = torch.rand(len(rows), anchors, generator=generator)  # [N, A]
        starts = low + (draw * span).long()  # [N, A]
        targets = starts.unsqueeze(-1) + torch.arange(1, block + 1)  # [N, A, B]
        valid = targets < self.lengths[rows].view(-1, 1, 1)  # [N, A, B]
        places = targets.clamp(max=width - 1).view(len(rows), -1)  # [N, A*B]
        source = tokens
        if self.predicted is not None and self.labels is not Labels.TEXT:
            source = self.predicted[rows, :width]  # [N, T]
            if self.labels is Labels.AGREED:
                valid &= _on_greedy_path(tokens, source, starts, places.view_as(targets))
        gathered = source.gather(1, places).view_as(targets)  # [N, A, B]
        labels = torch.where(valid, gathered, -100)  # [N, A, B]
        return tokens, starts, labels

    def batch_features(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """The kept features of rows [N], zero past each row's end: [N, width, F]."""
        assert self.features is not None
        assert self.offsets is not None
        known = (self.lengths[rows] - 1).unsqueeze(1)  # [N, 1]
        positions = torch.arange(width)  # [T]
        index = self.offsets[rows].unsqueeze(1) + positions  # [N, T]
        inside = positions < known  # [N, T]
        index = torch.where(inside, index, self.offsets[rows].unsqueeze(1))  # [N, T]
        feats = self.features[index]  # [N, T, F]
        return feats * inside.unsqueeze(-1)  # [N, T, F]


def _on_greedy_path(
    tokens: torch.Tensor, predicted: torch.Tensor, starts: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """tokens, predicted [N, T], anchors [N, A], label positions [N, A, B] -> [N, A, B]: slot
    p's prefix, text positions anchor + 1 .. anchor + p, all hold the target's argmax."""
    off = (tokens != predicted).long().cumsum(1)  # [N, T] off-path text tokens so far
    n, a, b = targets.shape
    before = off.gather(1, (targets - 1).view(n, -1)).view(n, a, b)  # [N, A, B] up to a + p
    at_anchor = off.gather(1, starts).unsqueeze(-1)  # [N, A, 1]
    return before == at_anchor  # [N, A, B]
