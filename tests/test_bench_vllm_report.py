"""`make bench-vllm`'s tables from made-up cells: ratios against vLLM's plain server, passes'
ranges, unmeasured cells, and each goal stated met or missed."""

from dcoco.bench.vllm_report import Results, tables


def cell(rate: float, ttft: float = 20.0, length: float = 1.0) -> dict[str, float]:
    return {"tokens_per_s": rate, "ttft_p50_ms": ttft, "accepted_length": length}


def test_tables_compare_every_server_with_plain_and_state_the_goals() -> None:
    results: Results = {
        "vllm-plain": {(0, "greedy", 1): cell(100), (1, "greedy", 1): cell(100)},
        "vllm-dcoco": {(0, "greedy", 1): cell(90, length=2.0), (1, "greedy", 1): cell(110)},
        "vllm-adaptive": {
            (0, "greedy", 1): cell(120, 21.0, 1.8),
            (1, "greedy", 1): cell(130, 21.0),
        },
        "gateway+vllm-adaptive": {(0, "greedy", 1): cell(118, 29.0)},
        "gateway+vllm-dcoco": {(0, "greedy", 1): cell(99, 23.0)},
        "vllm-table": {},  # timed out: nothing measured
    }
    text = tables(results, ["greedy"], [1], "heading")
    assert "| vllm-dcoco | 100 (1.00x (0.90-1.10)) |" in text
    assert "| vllm-table | n/m |" in text
    assert "our gateway's TTFT p50 +8.0 ms against vLLM's own server, both vllm-adaptive" in text
    assert "(goal at most +5 ms: missed)" in text
    assert "TTFT p50 +3.0 ms against vLLM's own server, both vllm-dcoco (goal" in text
    assert "+5 ms: met); tokens/s 1.10x" in text  # against its first pass, 90
    assert "adaptive DCOCO 1.25x (1.20-1.30) of the best fixed policy (vllm-plain)" in text
    assert "tokens/s 0.98x (goal at least 0.97x)" in text


def test_the_cpu_table_splits_each_server_by_role_and_leaves_unmeasured_cells_out() -> None:
    cpu = {"cpu_engine_ms": 6.0, "cpu_front_ms": 1.25, "cpu_client_ms": 0.5}
    results: Results = {
        "vllm-plain": {(0, "greedy", 1): cell(100) | cpu},
        "gateway+vllm-adaptive": {(0, "greedy", 1): cell(90)},  # measured without CPU figures
    }
    text = tables(results, ["greedy"], [1], "heading")
    assert "| vllm-plain | 6.0 / 1.2 / 0.5 |" in text
    assert "| gateway+vllm-adaptive | n/m |" in text
