"""CPU seconds a server's processes and the benchmark's client spend, by role.

On a small machine every process of the serving path shares the CPUs the engine computes on, so
the CPU a serving front spends per token comes out of the engine's time. The roles:
- engine: vLLM's engine processes (EngineCore and its Workers, titled `VLLM::...`);
- front: every other process of the server (vLLM's API server; or our gateway, our worker's
  own process, which hosts vLLM's output handling, and Redis);
- client: the benchmark's own process.
A process that exits between two readings drops out of both, so a reading covers a running
server, never its start or stop.
"""

import psutil

ROLES = ("engine", "front", "client")


def role(title: str) -> str:
    """The role of a server process by its title (vLLM retitles its engine processes)."""
    return "engine" if title.startswith("VLLM::") else "front"


def cpu_seconds(roots: list[int]) -> dict[str, float]:
    """User plus system CPU seconds so far of `roots` and their descendants, by role, and of
    this process (the client)."""
    totals = dict.fromkeys(ROLES, 0.0)
    processes: list[psutil.Process] = []
    for pid in roots:
        try:
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    for process in processes:
        try:
            times = process.cpu_times()
            totals[role(process.name())] += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    own = psutil.Process().cpu_times()
    totals["client"] = own.user + own.system
    return totals


def per_token_ms(
    before: dict[str, float], after: dict[str, float], tokens: int
) -> dict[str, float]:
    """Milliseconds of CPU per output token, by role, between two readings."""
    return {f"cpu_{r}_ms": (after[r] - before[r]) * 1000 / max(tokens, 1) for r in ROLES}
