"""Continuous batching: sequences join and leave between cycles, one KV slot each.

Running sequences always hold slots 0..n-1, with `running[i].slot == i`, so that a cycle reads
its rows' caches as one slice rather than gathering them. When sequences leave, the ones in the
highest slots move into the holes; the engine copies their cached prefixes (`Move`).
"""

from collections import deque
from dataclasses import dataclass

from dcoco.engine.sequence import Sequence


@dataclass(frozen=True)
class Move:
    """A running sequence's cache rows to copy from one slot to another."""

    source: int
    target: int
    length: int  # cached positions: 0..length-1


class Scheduler:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Moves waiting sequences into the slots after the running ones; returns them."""
        admitted: list[Sequence] = []
        while self.waiting and len(self.running) + len(admitted) < self.num_slots:
            seq = self.waiting.popleft()
            seq.slot = len(self.running) + len(admitted)
            admitted.append(seq)
        self.running.extend(admitted)
        return admitted

    def release_finished(self) -> list[Move]:
        """Drops finished sequences; returns the moves that close the holes they left."""
        for seq in self.running:
            if seq.finished:
                seq.slot = -1
        return self._compact()

    def abort(self, request_id: str) -> tuple[Sequence | None, list[Move]]:
        """Drops a request wherever it is; returns it (None when unknown) and the moves."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish_reason = "abort"
                return seq, []
        for seq in self.running:
            if seq.request_id == request_id:
                seq.finish_reason = "abort"
                seq.slot = -1
                return seq, self._compact()
        return None, []

    def _compact(self) -> list[Move]:
        """Keeps the sequences that hold a slot and moves the highest into the free low slots."""
        kept = [seq for seq in self.running if seq.slot >= 0]
        holes = sorted(set(range(len(kept))) - {seq.slot for seq in kept})
        movers = [seq for seq in kept if seq.slot >= len(kept)]
        moves = []
        for seq, hole in zip(movers, holes, strict=True):
            moves.append(Move(seq.slot, hole, seq.num_cached))
            seq.slot = hole
        self.running = sorted(kept, key=lambda seq: seq.slot)
        return moves

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
