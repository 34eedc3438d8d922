"""What one engine cycle reports: each sequence's kept tokens with where each came from, and
the cycle's statistics split by the speculation each sequence asked for.

Terms: a *drafted* token is the drafter's own top-1 the target accepted; a *corrected* one was
re-selected by the corrector (not the top-1) and accepted; a *target* token is the target's
own: the bonus after the accepted drafts, or a plain decoding step's token. The *rejected*
draft of a cycle is what the cycle drafted past the accepted prefix.
"""

from dataclasses import dataclass, field, replace

import torch

from dcoco.engine.outputs import RequestOutput, StepResult
from dcoco.engine.sequence import Sequence
from dcoco.shared.stats import CycleStats, SpecStats

DRAFTED, CORRECTED, TARGET = "drafted", "corrected", "target"


@dataclass
class CycleBook:
    """A cycle's statistics by speculation method, each with the cycle's phase seconds."""

    seconds: dict[str, float]
    by_method: dict[str, CycleStats] = field(default_factory=dict)

    def record(
        self,
        seq: Sequence,
        row: SpecStats,
        accepted_length: int,
        output_row: SpecStats | None = None,
    ) -> None:
        """Adds one verification to its method's statistics as the verifier saw it (what the
        metrics count, as vLLM's do), and to the request's as its output saw it (what `usage`
        reports): `output_row` leaves out accepted drafted tokens that a stop or the length
        limit kept from the output."""
        method = seq.mode.speculation
        cycle = self.by_method.setdefault(method, CycleStats(method=method, seconds=self.seconds))
        cycle.add(replace(row, seconds={}))
        cycle.accepted_lengths.append(accepted_length)
        seq.stats.add(replace(output_row or row, seconds=self.seconds))

    def cycles(self) -> list[CycleStats]:
        return list(self.by_method.values())


def provenance(held: int, index: list[int] | None) -> list[str]:
    """Where the held drafted tokens and the target's token after them came from; `index` is
    the row's chosen candidate per slot (0: the drafter's top-1), None for a plain step."""
    drafted = [CORRECTED if index and index[p] else DRAFTED for p in range(held)]
    return [*drafted, TARGET]


def report(
    seq: Sequence,
    kept: list[int],
    result: StepResult,
    sources: list[str],
    rejected: tuple[int, ...] = (),
    features: torch.Tensor | None = None,
) -> None:
    """The step's output for one sequence: the tokens it kept, where each came from, and its
    statistics so far."""
    result.outputs.append(
        RequestOutput(
            seq.request_id,
            kept,
            seq.finished,
            seq.finish_reason,
            replace(seq.stats),
            features,
            provenance=tuple(sources[: len(kept)]),
            rejected=rejected,
            cycle=seq.stats.verifications,
        )
    )
