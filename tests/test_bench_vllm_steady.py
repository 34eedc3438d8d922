"""`make bench-vllm`'s tokens/s under a steady load: the requests that end after the work ran
out (a batch draining at its slowest request's pace) do not count."""

import pytest

from dcoco.bench.vllm import Done, steady_tokens_per_s


def test_the_drained_tail_does_not_count() -> None:
    done = [  # stream A: 10-token requests of 1 s; stream B: of 2 s; the work ran out at 4 s
        Done(0.1, 10, 0.0, 1.0),
        Done(0.1, 10, 1.0, 2.0),
        Done(0.1, 10, 2.0, 3.0),
        Done(0.1, 10, 3.0, 4.0),
        Done(0.1, 10, 0.0, 2.0),
        Done(0.1, 10, 2.0, 4.0),
        Done(0.1, 10, 4.0, 9.0),  # taken last, run alone and slowly: the tail
    ]
    rate = steady_tokens_per_s(done, 2, drained=4.0)
    assert rate == pytest.approx(2 * 60 / 8)  # 15 a second: 10 from A and 5 from B
    assert rate > 70 / 9  # the makespan's rate, the slow tail included


def test_with_no_request_done_before_the_work_ran_out_every_request_counts() -> None:
    done = [Done(0.1, 10, 0.0, 2.0), Done(0.1, 30, 0.0, 3.0)]
    assert steady_tokens_per_s(done, 2, drained=0.0) == pytest.approx(2 * 40 / 5)
