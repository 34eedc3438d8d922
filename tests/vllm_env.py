"""vLLM for tests: it lives in a venv of its own (`.venv-vllm`, made by `make setup`), so tests
run it in subprocesses while pytest runs from `.venv`."""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from dcoco.paths import REPO_ROOT, TINY_DCOCO, TINY_TARGET
from dcoco.vllm.cpu_env import cpu_preload

VLLM_VENV = Path(os.environ.get("DCOCO_VLLM_VENV", REPO_ROOT / ".venv-vllm"))
VLLM_PYTHON = str((VLLM_VENV / "bin" / "python").absolute())  # not resolved: keep the venv
# On CPU, gpu_memory_utilization only sizes vLLM's start-up check of free memory (the KV cache
# is VLLM_CPU_KVCACHE_SPACE); its 0.92 default fails whenever this shared machine is busy.
MEMORY_SHARE = "0.3"
WORKER_ARGS = json.dumps({"gpu_memory_utilization": float(MEMORY_SHARE)})
EMBEDDED = {"target": TINY_TARGET, "dcoco": TINY_DCOCO}


def vllm_env() -> dict[str, str]:
    """What vLLM on CPU needs here: no hub, 1 GiB of KV cache, the bundled OpenMP (and
    tcmalloc where installed) preloaded."""
    return {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "LD_PRELOAD": cpu_preload(VLLM_VENV),
    }


def require_vllm() -> None:
    if not Path(VLLM_PYTHON).exists():
        raise RuntimeError(f"no vLLM venv at {VLLM_VENV}: run `make setup`")


def run_python(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs `code` under vLLM's interpreter."""
    require_vllm()
    return subprocess.run(
        [VLLM_PYTHON, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ) | vllm_env() | env,
        check=False,
    )


FORKS = """
import os, sys, traceback
import vllm  # noqa: F401  (once, before the forks)

folder = sys.argv[1]
for name in sys.argv[2:]:
    path = os.path.join(folder, name)
    pid = os.fork()
    if pid == 0:
        sys.argv = [path + ".py"]
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(path + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        try:
            exec(compile(open(path + ".py").read(), path + ".py", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _, waited = os.waitpid(pid, 0)
    with open(path + ".rc", "w") as rc:
        rc.write(str(os.waitstatus_to_exitcode(waited)))
"""


def run_forked(
    snippets: dict[str, str], folder: Path, timeout: float = 300
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Runs each snippet as `run_python` would, each in a fork of one interpreter that imported
    vLLM first: a start of vLLM's interpreter costs 12-20 s here, most snippets under 2."""
    require_vllm()
    for name, code in snippets.items():
        (folder / f"{name}.py").write_text(code)
    done = subprocess.run(
        [VLLM_PYTHON, "-c", FORKS, str(folder), *snippets],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ) | vllm_env(),
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the forking interpreter failed:\n{done.stderr[-3000:]}")
    return {
        name: subprocess.CompletedProcess(
            name,
            int((folder / f"{name}.rc").read_text()),
            (folder / f"{name}.out").read_text(),
            (folder / f"{name}.err").read_text(),
        )
        for name in snippets
    }


def offline(
    root: Path,
    drafter: Path | None,
    prompts: list[list[int]],
    max_tokens: int,
    extra: tuple[str, ...] = (),
    target: Path = TINY_TARGET,
    eager: bool = True,
    **env: str,
) -> dict[str, Any]:
    """Generation through vLLM's offline LLM (`dcoco.vllm.offline`; `extra`: its flags), eager
    unless asked: compiling the target and the drafter costs about 25 s a start here, and the
    compiled path is what the vllm worker runs in tests/test_serving_vllm.py."""
    require_vllm()
    prompt_file, out = root / "prompts.jsonl", root / "out.json"
    prompt_file.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    args = [VLLM_PYTHON, "-m", "dcoco.vllm.offline", "--target", str(target)]
    args += ["--prompts", str(prompt_file), "--out", str(out), "--max-tokens", str(max_tokens)]
    args += ["--drafter", str(drafter)] if drafter else []
    args += ["--gpu-memory-utilization", MEMORY_SHARE, *(["--enforce-eager"] if eager else [])]
    args += extra
    log = root / "vllm.log"
    with log.open("w") as sink:
        done = subprocess.run(
            args, stdout=sink, stderr=sink, timeout=600, env=dict(os.environ) | vllm_env() | env
        )
    if done.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"vLLM failed ({done.returncode}):\n{tail}")
    return dict(json.loads(out.read_text()))
