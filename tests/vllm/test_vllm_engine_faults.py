"""Faults of the pinned vLLM build that draftsync works around, each shown on the installed engine itself, so the
workaround goes when a new pin no longer has the fault (this test then fails and says so)."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.vllm

# The CPU kernel vLLM's rejection sampler calls to give every draft token its request's temperature, on a float
# output filled with a sentinel: a kernel that writes its output replaces the sentinel.
EXPAND_PROBE = """
import torch
import vllm._C  # noqa: F401  (registers the CPU ops)
from vllm.utils import cpu_triton_utils

temperatures = torch.tensor([0.7, 1.0])
draft_ends = torch.tensor([2, 5])  # two drafts for the first request, three for the second
out = torch.full((5,), -7.0)
cpu_triton_utils._expand_kernel_impl(out, temperatures, draft_ends, -1, 1)
print(" ".join(f"{value:g}" for value in out.tolist()))
"""


def test_the_cpu_build_leaves_sampled_draft_temperatures_unwritten(vllm_engine):
    """vLLM's CPU build expands per-request temperatures into an int64 copy and never writes the float tensor the
    rejection sampler reads, which is why draftsync refuses to measure sampled speculation on it."""
    from draftsync.serving.vllm_engine import CPU_SAMPLED_SPECULATION_FAULT

    if vllm_engine.device != "cpu":
        assert vllm_engine.sampled_speculation_fault() is None
        pytest.skip("the fault is in vLLM's CPU kernels; this engine runs on a GPU")
    done = subprocess.run(
        [vllm_engine.command[0], "-c", EXPAND_PROBE], capture_output=True, text=True, timeout=300, check=True
    )
    expanded = done.stdout.split()
    assert expanded != ["0.7", "0.7", "1", "1", "1"], (
        "this vLLM's CPU kernel now expands temperatures correctly: drop CPU_SAMPLED_SPECULATION_FAULT and let "
        "the vLLM backend measure sampled speculation on CPU"
    )
    assert expanded == ["-7"] * 5  # untouched: the rejection sampler reads whatever memory held
    assert vllm_engine.sampled_speculation_fault() == CPU_SAMPLED_SPECULATION_FAULT


def test_auto_validates_sampled_deployments_on_the_reference_backend_where_vllm_samples_drafts_unsoundly(
    vllm_engine,
):
    from draftsync.tasks.validation import evaluation_backend

    assert evaluation_backend("auto", 0.0) == "vllm"
    expected = "reference" if vllm_engine.sampled_speculation_fault() else "vllm"
    assert evaluation_backend("auto", 0.7) == expected
    assert evaluation_backend("vllm", 0.7) == "vllm"  # asked for explicitly: its first sampled request says why
