"""What the worker adds to the environment of vLLM's processes on a CPU machine: the preloads,
and on at most 2 CPUs the engine core sharing the model's cores; never over a value the
environment already sets."""

from pathlib import Path

from dcoco.vllm.cpu_env import RESERVED, SHARE_UP_TO, cpu_env


def test_on_two_cpus_the_model_gets_every_core() -> None:
    assert cpu_env(Path("/nowhere"), {}, 2)[RESERVED] == "0"
    assert cpu_env(Path("/nowhere"), {}, 1)[RESERVED] == "0"


def test_above_the_measured_size_vllm_s_default_reservation_stands() -> None:
    assert RESERVED not in cpu_env(Path("/nowhere"), {}, SHARE_UP_TO + 1)


def test_the_environment_wins() -> None:
    environ = {RESERVED: "1", "LD_PRELOAD": "/lib/other.so"}
    assert cpu_env(Path("/nowhere"), environ, 2) == {}


def test_only_libraries_that_exist_are_preloaded(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").touch()
    preload = cpu_env(tmp_path, {}, 8)["LD_PRELOAD"].split(":")
    assert str(tmp_path / "lib" / "libiomp5.so") in preload
    assert all(Path(p).exists() for p in preload)
