"""The Docker files, without building them: hadolint on each Dockerfile, the compose file
against the Compose specification, and each image's install steps replayed in a fresh venv.
`make images-test` (tests/image_checks.py) builds and runs them with podman."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vllm_env import VLLM_PYTHON, require_vllm

ROOT = Path(__file__).parents[1]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
IMAGES = {
    "gateway": "dcoco-gateway",
    "worker-cpu": "dcoco-worker-cpu",
    "worker-vllm": "dcoco-worker-vllm",
}


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_dockerfiles_pass_hadolint(name: str) -> None:
    done = subprocess.run(
        [BIN / "hadolint", "--failure-threshold", "warning", DOCKER / f"{name}.Dockerfile"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_vllm_image_is_pinned_and_runs_our_worker() -> None:
    text = (DOCKER / "worker-vllm.Dockerfile").read_text()
    assert "ARG VLLM_IMAGE_TAG=v0.32.0" in text
    assert "FROM vllm/vllm-openai:${VLLM_IMAGE_TAG}" in text
    assert 'CMD ["dcoco", "worker", "--engine", "vllm"]' in text
    assert "--entrypoint vllm" in text  # the documented plain `vllm serve` alternative


def test_make_images_builds_the_three_names() -> None:
    done = subprocess.run(["make", "-n", "images"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name, image in IMAGES.items():
        assert f"-f docker/{name}.Dockerfile" in done.stdout
        assert f"-t {image} " in done.stdout + " "


def test_the_compose_file_is_valid_and_complete() -> None:
    done = subprocess.run(
        [
            BIN / "check-jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            DOCKER / "compose.yaml",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    assert set(services) == {"redis", "worker", "gateway"}
    assert "--appendonly" in services["redis"]["command"]
    assert services["gateway"]["read_only"] is True
    assert services["gateway"]["image"] == IMAGES["gateway"]
    assert services["worker"]["image"] == IMAGES["worker-cpu"]
    for service in ("worker", "gateway"):
        dockerfile = services[service]["build"]["dockerfile"]
        assert (DOCKER / services[service]["build"]["context"] / dockerfile).resolve().exists()


def fresh_venv(folder: Path, base: str = sys.executable) -> Path:
    """A new venv and a copy of what the Dockerfiles COPY in."""
    subprocess.run([base, "-m", "venv", folder / "venv"], check=True)
    source = folder / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "service",
        source / "service",
        ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"),
    )
    return folder / "venv" / "bin"


def pip(bin_dir: Path, *args: str, cwd: Path) -> None:
    """An image's `pip install`, without compiling the modules to bytecode (which images do,
    for their read-only filesystems): that is most of an install's time here (torch: 32 s
    against 10), and it decides nothing these replays check."""
    done = subprocess.run(
        [bin_dir / "pip", "install", "-q", "--no-compile", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def layered(bin_dir: Path, base: Path) -> None:
    """Makes the venv at `bin_dir` see the packages of the one at `base` (a .pth file), as an
    image sees the layers of the stage it is built FROM."""
    below = run(base, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    purelib = run(bin_dir, "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (Path(purelib.strip()) / "base_image.pth").write_text(below.strip() + "\n")


@pytest.fixture(scope="module")
def torch_stage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU worker image's `torch` stage, which its convert stage and the image itself are
    built FROM: torch alone (the Dockerfile takes it from the CPU index)."""
    folder = tmp_path_factory.mktemp("torch-stage")
    bin_dir = fresh_venv(folder)
    pip(bin_dir, "torch==2.13.0", cwd=folder)
    return bin_dir


def run(bin_dir: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [bin_dir / "python", "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_the_gateway_image_installs_no_torch(tmp_path: Path) -> None:
    bin_dir = fresh_venv(tmp_path)
    pip(bin_dir, ".[serve]", cwd=tmp_path / "src")
    out = run(
        bin_dir,
        "import importlib.util, dcoco.cli\n"
        "print([m for m in ('torch', 'vllm') if importlib.util.find_spec(m)])\n"
        "dcoco.cli.build_parser().parse_args(['gateway'])",
    )
    assert out.strip() == "[]"


@pytest.mark.slow
def test_the_cpu_worker_image_installs_the_torch_engine(tmp_path: Path, torch_stage: Path) -> None:
    bin_dir = fresh_venv(tmp_path)
    layered(bin_dir, torch_stage)
    pip(bin_dir, ".[engine,serve]", cwd=tmp_path / "src")
    out = run(
        bin_dir,
        "from dcoco.engine.load import load_engine\n"
        "from dcoco.shared.engine_config import EngineConfig\n"
        f"engine = load_engine({str(ROOT / 'models/tiny/target')!r}, "
        f"{str(ROOT / 'models/tiny/dcoco')!r}, EngineConfig())\n"
        "print('engine', engine.block)",
    )
    assert out.strip() == "engine 15"


@pytest.mark.slow
def test_the_cpu_worker_images_convert_stage_runs_the_cli(
    tmp_path: Path, torch_stage: Path
) -> None:
    """The stage that converts the default target installs the engine and train extras only."""
    bin_dir = fresh_venv(tmp_path)
    layered(bin_dir, torch_stage)
    pip(bin_dir, ".[engine,train]", cwd=tmp_path / "src")
    out = run(
        bin_dir,
        "import dcoco.cli\n"
        "print(dcoco.cli.build_parser().parse_args(['convert', '--out', 'target']).out)",
    )
    assert out.strip() == "target"


@pytest.mark.slow
@pytest.mark.vllm
def test_the_vllm_image_adds_the_plugin_without_another_torch(tmp_path: Path) -> None:
    """The base image's packages are stood in for by vLLM's venv, seen through a .pth file."""
    require_vllm()
    bin_dir = fresh_venv(tmp_path)
    layered(bin_dir, Path(VLLM_PYTHON).parent)
    before = run(bin_dir, "import torch; print(torch.__version__)")
    pip(bin_dir, ".[serve]", cwd=tmp_path / "src")
    assert run(bin_dir, "import torch; print(torch.__version__)") == before
    out = run(
        bin_dir,
        "from importlib.metadata import entry_points\n"
        "print([e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'dcoco'])",
    )
    assert out.strip() == "['dcoco.vllm.plugin:register']"
