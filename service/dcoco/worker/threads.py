"""How many threads the torch engine computes with.

torch's default is every CPU the process may run on, which in a container is every CPU of the
node: a pod allowed 2 CPUs on a 64-CPU node would run 64 threads in 2 CPUs' time, and OpenMP
threads waiting at barriers for partners that are not scheduled stall each step (the compiled
layers worst of all, docs/engine-profile.md). So the worker asks for what its cgroup allows,
and what its pod is guaranteed (DCOCO_CPUS, from the chart).

Of those CPUs it leaves one to everything else (where it has more than one): its own event loop,
which detokenizes and sends every token, and whatever shares the machine (the gateway, Redis,
clients). A step's OpenMP threads wait at each barrier for any one of them that was preempted.
On a 2-core machine serving through the gateway, one engine thread made 1.9x the tokens of two
(docs/engine-profile.md, "Threads beside the server").
"""

import math
from pathlib import Path

CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")  # "<quota> <period>" or "max <period>"
CGROUP_V1 = Path("/sys/fs/cgroup/cpu")  # cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us


def cgroup_cpus(v2: Path = CGROUP_V2, v1: Path = CGROUP_V1) -> int | None:
    """The CPUs this process's cgroup may use, rounded up; None without a limit or a cgroup."""
    try:
        quota, period = v2.read_text().split()[:2]
    except (OSError, ValueError):
        try:
            quota = (v1 / "cpu.cfs_quota_us").read_text().strip()
            period = (v1 / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    if quota in ("max", "-1"):
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def engine_threads(asked: int, default: int, limit: int | None, cpus: int = 0) -> int:
    """`asked` when it is set (above 0); else one less than the CPUs this worker has (at least
    one): torch's `default`, capped by the cgroup's `limit` and by `cpus` (0: not known)."""
    if asked > 0:
        return asked
    have = min(n for n in (default, limit, cpus) if n)
    return max(1, have - 1)
