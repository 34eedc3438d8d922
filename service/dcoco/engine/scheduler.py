"""Continuous batching: sequences join and leave between cycles, one KV slot each."""

from collections import deque

from dcoco.engine.sequence import Sequence


class Scheduler:
    def __init__(self, num_slots: int) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots = list(range(num_slots - 1, -1, -1))  # pop() hands out the lowest

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Moves waiting sequences into free slots; returns the newly admitted."""
        admitted = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            admitted.append(seq)
        self.running.extend(admitted)
        return admitted

    def release_finished(self) -> None:
        for seq in self.running:
            if seq.finished:
                self._free(seq)
        self.running = [seq for seq in self.running if not seq.finished]

    def abort(self, request_id: str) -> Sequence | None:
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    seq.finish_reason = "abort"
                    self._free(seq)
                    return seq
        return None

    def _free(self, seq: Sequence) -> None:
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            self.free_slots.sort(reverse=True)
            seq.slot = -1

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
