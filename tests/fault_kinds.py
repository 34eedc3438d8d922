"""The faults `make faults` tries (tests/fault_trials.py): what each does to a running stack once
every stream is generating, how its streams sample, and what their text is promised to be.

- kill, kill-seeded, kill-unseeded: SIGKILL of the worker that holds the most streams, with
  greedy, seeded and unseeded sampling (the continue, replay and continue-sampling paths);
- seeded-control: kill-seeded without the kill, the measure of what batching alone does to
  seeded text against a single-request reference;
- stop-resume: SIGSTOP of that worker past its lease, then SIGCONT once another worker took its
  streams over (the owner fence must refuse the resumed worker's writes);
- drain: SIGTERM of that worker with requests in flight (a 1 s drain, then hand-back);
- gateway-kill: two gateways in front of one queue, SIGKILL of one of them (its streams are cut;
  the other's must not notice);
- vllm-kill: SIGKILL of a vLLM engine worker, whose requests another vLLM worker, started
  after the kill, takes over.
"""

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from dcoco.serve import free_port
from stack import Service, Stack, http_status, owner_pid, wait_for
from vllm_env import EMBEDDED, VLLM_PYTHON, WORKER_ARGS, vllm_env

LEASE_S = 2.0
VLLM_STARTUP_S = 300.0  # vLLM starts in 35-60 s here, minutes on a cold compile cache


@dataclass
class Scene:
    """A trial's stack and where each of its streams is, for a kind to disturb."""

    stack: Stack
    gateways: list[str]  # the base URL of each gateway, streams spread over them in turn
    response_ids: list[str | None]  # each stream's response id, once it is generating
    extra: list[Service] = field(default_factory=list)  # gateways beyond the stack's own
    killed_gateway: str | None = None  # the URL whose streams are expected to be cut
    hit_ids: set[str] = field(default_factory=set)  # the streams the fault hit

    def busiest_worker(self) -> tuple[int, int]:
        """The pid of the worker holding the most streams, and how many it holds (which are
        then the streams the fault hits)."""
        owners = {r: owner_pid(self.stack.redis, r) for r in self.response_ids if r is not None}
        held = Counter(pid for pid in owners.values() if pid is not None)
        victim, count = held.most_common(1)[0] if held else (self.stack.workers[0].pid, 0)
        self.hit_ids = {r for r, pid in owners.items() if pid == victim}
        return victim, count


async def _kill_busiest(scene: Scene) -> int:
    victim, held = scene.busiest_worker()
    os.kill(victim, signal.SIGKILL)
    return held


async def _stop_then_resume(scene: Scene) -> int:
    """SIGSTOP past the lease; SIGCONT once none of the streams is owned by it any more (or
    after 10 leases): it then resumes writing to streams it no longer owns."""
    victim, held = scene.busiest_worker()
    os.kill(victim, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10 * LEASE_S
        await asyncio.sleep(LEASE_S)
        while time.monotonic() < deadline:
            owners = {owner_pid(scene.stack.redis, r) for r in scene.response_ids if r}
            if victim not in owners:
                break
            await asyncio.sleep(0.2)
    finally:
        os.kill(victim, signal.SIGCONT)
    return held


async def _drain_busiest(scene: Scene) -> int:
    victim, held = scene.busiest_worker()
    os.kill(victim, signal.SIGTERM)
    return held


async def _kill_a_gateway(scene: Scene) -> int:
    """SIGKILL of the second gateway; returns how many streams went through it."""
    doomed = scene.extra[0]
    scene.killed_gateway = scene.gateways[1]
    doomed.signal(signal.SIGKILL)
    scene.hit_ids = {r for i, r in enumerate(scene.response_ids) if i % 2 == 1 and r}
    return len(scene.hit_ids)


async def _nothing(scene: Scene) -> int:
    return 0


async def _kill_the_vllm_worker(scene: Scene) -> int:
    held = await _kill_busiest(scene)
    await asyncio.to_thread(scene.stack.add_worker)  # starts; reclaims once it is ready
    return held


@dataclass(frozen=True)
class Kind:
    name: str
    what: str
    temperature: float = 0.0
    seeded: bool = False
    gateways: int = 1
    env: dict[str, str] = field(default_factory=dict)
    vllm: bool = False
    disturb: Callable[[Scene], Awaitable[int]] = _kill_busiest  # returns the streams it hit

    @property
    def compares(self) -> bool:
        """Whether every stream's text must equal its prompt's reference answer."""
        return self.temperature == 0.0 or self.seeded

    def sampling(self, index: int) -> dict[str, object]:
        sampling: dict[str, object] = {"temperature": self.temperature}
        return sampling | ({"seed": 1000 + index} if self.seeded else {})


KINDS = {
    kind.name: kind
    for kind in (
        Kind("kill", "SIGKILL of the busiest worker; greedy streams (continue exactly)"),
        Kind(
            "kill-seeded",
            "SIGKILL of the busiest worker; seeded sampling (replay, checked, then continue)",
            temperature=1.0,
            seeded=True,
        ),
        Kind(
            "seeded-control",
            "no fault: the seeded streams of kill-seeded, each against its single-request "
            "reference, to tell batching's effect on sampled text from the faults'",
            temperature=1.0,
            seeded=True,
            disturb=_nothing,
        ),
        Kind(
            "kill-unseeded",
            "SIGKILL of the busiest worker; unseeded sampling (continue, same distribution)",
            temperature=1.0,
        ),
        Kind(
            "stop-resume",
            f"SIGSTOP of the busiest worker past its {LEASE_S:g} s lease, SIGCONT once another "
            "took its streams; greedy (the owner fence refuses the resumed worker's writes)",
            disturb=_stop_then_resume,
        ),
        Kind(
            "drain",
            "SIGTERM of the busiest worker with streams in flight: a 1 s drain, the rest handed "
            "back and continued by the other worker; greedy",
            env={"DCOCO_DRAIN_TIMEOUT_S": "1"},
            disturb=_drain_busiest,
        ),
        Kind(
            "gateway-kill",
            "two gateways in front of one queue, streams spread over both, SIGKILL of one "
            "gateway; greedy (its streams are cut, the other's must finish unharmed)",
            gateways=2,
            disturb=_kill_a_gateway,
        ),
        Kind(
            "vllm-kill",
            "SIGKILL of a vLLM engine worker (the embedded tiny pair, DCOCO drafting); another "
            "vLLM worker, started after the kill, takes its streams over; greedy",
            vllm=True,
            disturb=_kill_the_vllm_worker,
        ),
    )
}


def build_stack(kind: Kind, folder: Path, models: dict[str, Path], env: dict[str, str]) -> Stack:
    if not kind.vllm:
        return Stack(folder, models, **(env | kind.env))
    vllm = {
        "DCOCO_ENGINE": "vllm",
        "DCOCO_VLLM_ARGS": WORKER_ARGS,
        "DCOCO_STALL_TIMEOUT_S": str(int(VLLM_STARTUP_S)),  # the reclaiming worker starts up
        "DCOCO_LEASE_S": str(LEASE_S),
    }
    return Stack(folder, dict(EMBEDDED), worker_python=VLLM_PYTHON, **(vllm | vllm_env()))


def start(kind: Kind, stack: Stack, folder: Path) -> list[Service]:
    """Starts the stack for `kind`; returns the gateways it added beyond the stack's own."""
    if kind.vllm:
        stack.start(workers=1, timeout=VLLM_STARTUP_S)
        return []
    stack.start(workers=2)
    extra = []
    for number in range(1, kind.gateways):
        port = str(free_port())
        env = stack.env | {"DCOCO_PORT": port}
        extra.append(Service("gateway", env, folder / f"gateway{number}.log").start())
    for gateway in extra:
        url = f"http://127.0.0.1:{gateway.env['DCOCO_PORT']}"
        wait_for(lambda u=url: http_status(f"{u}/readyz") == 200, what=f"the gateway at {url}")
    return extra
