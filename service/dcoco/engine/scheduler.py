"""Continuous batching: sequences join and leave between cycles, one KV slot each.

A forward reads its rows' caches as one slice (`kv_cache`), so the rows of every forward hold
consecutive slots:
- `running` sequences (prompt cached, decoding) hold slots 0..n-1, `running[i].slot == i`;
- `prefilling` sequences (prompt partly cached, chunk by chunk) hold the top slots S-p..S-1.

When a running sequence leaves, the highest running one moves into its slot; when a prompt is
fully cached, its sequence moves down to slot n and joins `running`, and the lowest prefilling
one moves up into the slot it left. Each move copies the cached prefix (`Move`).
"""

from collections import deque
from dataclasses import dataclass

from dcoco.engine.sequence import Sequence


@dataclass(frozen=True)
class Move:
    """A sequence's cache rows to copy from one slot to another."""

    source: int
    target: int
    length: int  # cached positions: 0..length-1


class Scheduler:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.spare = num_slots  # a slot past the last, for swaps: caches hold num_slots + 1
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefilling: list[Sequence] = []  # in slot order

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> None:
        """Moves waiting sequences into free slots, just below the prefilling ones."""
        while self.waiting and len(self.running) + len(self.prefilling) < self.num_slots:
            seq = self.waiting.popleft()
            seq.slot = self.num_slots - len(self.prefilling) - 1
            self.prefilling.insert(0, seq)

    def prefilled(self, done: list[Sequence]) -> list[Move]:
        """Moves sequences whose prompt is cached into `running`; returns the moves. When
        every slot is taken, slot n belongs to a prefilling sequence: the two swap, through the
        caches' spare slot (`spare`)."""
        moves = []
        for seq in sorted(done, key=lambda s: s.slot):
            self.prefilling.remove(seq)
            free = len(self.running)
            occupant = next((s for s in self.prefilling if s.slot == free), None)
            if occupant is not None:
                moves += [
                    Move(seq.slot, self.spare, seq.num_cached),
                    Move(free, seq.slot, occupant.num_cached),
                    Move(self.spare, free, seq.num_cached),
                ]
                occupant.slot = seq.slot
            elif seq.slot != free:
                moves.append(Move(seq.slot, free, seq.num_cached))
            seq.slot = free
            self.running.append(seq)
        self.prefilling.sort(key=lambda s: s.slot)
        return moves + self._compact_prefilling()

    def release_finished(self) -> list[Move]:
        """Drops finished running sequences; returns the moves that close their holes."""
        for seq in self.running:
            if seq.finished:
                seq.slot = -1
        return self._compact_running()

    def abort(self, request_id: str) -> tuple[Sequence | None, list[Move]]:
        """Drops a request wherever it is; returns it (None when unknown) and the moves."""
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                seq.finish_reason = "abort"
                return seq, []
        for group, compact in (
            (self.running, self._compact_running),
            (self.prefilling, self._compact_prefilling),
        ):
            for seq in group:
                if seq.request_id == request_id:
                    seq.finish_reason = "abort"
                    seq.slot = -1
                    return seq, compact()
        return None, []

    def _compact_running(self) -> list[Move]:
        """Keeps running sequences that hold a slot; the highest move into free low slots."""
        kept = [seq for seq in self.running if seq.slot >= 0]
        holes = sorted(set(range(len(kept))) - {seq.slot for seq in kept})
        movers = [seq for seq in kept if seq.slot >= len(kept)]
        moves = self._fill(movers, holes)
        self.running = sorted(kept, key=lambda seq: seq.slot)
        return moves

    def _compact_prefilling(self) -> list[Move]:
        """Keeps prefilling sequences that hold a slot; the lowest move into free top slots."""
        kept = [seq for seq in self.prefilling if seq.slot >= 0]
        low = self.num_slots - len(kept)
        holes = sorted(set(range(low, self.num_slots)) - {seq.slot for seq in kept})
        movers = [seq for seq in kept if seq.slot < low]
        moves = self._fill(movers, holes)
        self.prefilling = sorted(kept, key=lambda seq: seq.slot)
        return moves

    @staticmethod
    def _fill(movers: list[Sequence], holes: list[int]) -> list[Move]:
        moves = []
        for seq, hole in zip(movers, holes, strict=True):
            moves.append(Move(seq.slot, hole, seq.num_cached))
            seq.slot = hole
        return moves

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.prefilling)
