"""Podman containers for the image checks (tests/image_checks.py): run, inspect, probe and kill
them by name, through the podman command line."""

import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

# As the chart runs its pods: no capabilities, no privilege escalation, a read-only root
# filesystem with a writable /tmp (podman mounts tmpfs on /tmp, /var/tmp and /run), HOME in it.
LOCKED_DOWN = (
    "--read-only",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--env=HOME=/tmp",
)


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def http_status(url: str) -> int:
    """The HTTP status of a GET, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, urllib.error.URLError):
        return 0


def wait_until(check: "object", timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class Container:
    """A detached container on `network`, its `ports` published on 127.0.0.1."""

    name: str
    image: str
    network: str
    env: dict[str, str] = field(default_factory=dict)
    ports: tuple[int, ...] = ()
    options: tuple[str, ...] = LOCKED_DOWN
    command: tuple[str, ...] = ()

    def start(self) -> "Container":
        args = ["run", "--detach", f"--name={self.name}", f"--network={self.network}"]
        args += [*self.options, *(f"--env={k}={v}" for k, v in self.env.items())]
        args += [f"--publish=127.0.0.1::{port}" for port in self.ports]
        podman(*args, self.image, *self.command)
        return self

    def url(self, port: int) -> str:
        """http://127.0.0.1:<host port> for a published container port."""
        return "http://" + podman("port", self.name, str(port)).splitlines()[0]

    def running(self) -> bool:
        return podman("inspect", "--format={{.State.Running}}", self.name) == "true"

    def exit_code(self) -> int:
        return int(podman("inspect", "--format={{.State.ExitCode}}", self.name))

    def inspect(self, template: str) -> str:
        return podman("inspect", f"--format={template}", self.name)

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", "exec", self.name, *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def logs(self) -> str:
        done = subprocess.run(
            ["podman", "logs", self.name], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout + done.stderr

    def kill(self) -> None:
        podman("kill", "--signal=KILL", self.name)

    def remove(self) -> None:
        podman("rm", "--force", "--time=5", self.name, check=False)
