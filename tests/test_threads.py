"""The torch engine's thread count: asked, or one less than the CPUs it has."""

from pathlib import Path

from dcoco.worker.threads import cgroup_cpus, engine_threads


def test_the_cgroup_limit_is_read_from_v2_then_v1(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "cpu.max", tmp_path / "v1"
    assert cgroup_cpus(v2, v1) is None  # no cgroup files: no limit known
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpus(v2, v1) == 3  # 2.5 CPUs, rounded up
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpus(v2, v1) is None
    v2.write_text("max 100000\n")
    assert cgroup_cpus(v2, v1) is None
    v2.write_text("50000 100000\n")
    assert cgroup_cpus(v2, v1) == 1  # half a CPU still gets a thread
    v2.write_text("garbage\n")
    assert cgroup_cpus(v2, v1) is None  # unreadable v2, v1 says unlimited


def test_asked_wins_else_one_less_than_the_cpus_it_has() -> None:
    assert engine_threads(asked=3, default=64, limit=2) == 3  # asked for: as it is
    # one less than the CPUs it has, leaving one to the event loop and its neighbours
    assert engine_threads(asked=0, default=64, limit=2) == 1
    assert engine_threads(asked=0, default=2, limit=8) == 1
    assert engine_threads(asked=0, default=16, limit=None) == 15
    assert engine_threads(asked=0, default=64, limit=None, cpus=4) == 3  # the pod's request
    assert engine_threads(asked=0, default=64, limit=8, cpus=16) == 7
    assert engine_threads(asked=0, default=1, limit=None) == 1  # never none
