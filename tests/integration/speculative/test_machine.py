"""The training precision `auto` picks: measured on this CPU once, kept in the user cache, read by every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative import machine

NATIVE_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A user cache of the test's own, and no answer remembered from earlier in this process."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    machine.cpu_bf16_speedup.cache_clear()
    yield tmp_path / "draftsync"
    machine.cpu_bf16_speedup.cache_clear()


def test_the_probe_is_measured_once_and_read_back_by_another_process(own_cache):
    ratio = machine.cpu_bf16_speedup()
    files = list(own_cache.glob("cpu-bf16-speedup-*.json"))
    assert len(files) == 1, files
    stored = json.loads(files[0].read_text())
    assert stored["fp32_over_bf16"] == ratio > 0
    assert torch.__version__ in stored["cpu"]
    # Another process reads the stored answer instead of measuring: the file is the only source of a changed figure.
    files[0].write_text(json.dumps({**stored, "fp32_over_bf16": 7.5}))
    script = "from draftsync.speculative.machine import cpu_bf16_speedup; print(cpu_bf16_speedup())"
    read = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "XDG_CACHE_HOME": str(own_cache.parent)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(read.stdout) == 7.5


@pytest.mark.skipif(not NATIVE_BF16, reason="this CPU's oneDNN has no bf16: auto is fp32 without measuring")
@pytest.mark.parametrize(("stored", "bf16"), [(0.66, False), (1.05, False), (1.1, True), (1.5, True)])
def test_auto_takes_bf16_only_where_it_measured_faster(own_cache, stored, bf16):
    machine.cpu_bf16_speedup()  # writes the file for this CPU
    (cache,) = own_cache.glob("cpu-bf16-speedup-*.json")
    cache.write_text(json.dumps({"fp32_over_bf16": stored}))
    machine.cpu_bf16_speedup.cache_clear()
    assert machine.trains_in_bf16("auto", torch.device("cpu")) is bf16
    # An explicit precision is never second-guessed, and CUDA always trains in bf16.
    assert machine.trains_in_bf16("fp32", torch.device("cpu")) is False
    assert machine.trains_in_bf16("bf16", torch.device("cpu")) is True
    assert machine.trains_in_bf16("auto", torch.device("cuda")) is True


def test_an_unreadable_answer_is_measured_again(own_cache):
    first = machine.cpu_bf16_speedup()
    (cache,) = own_cache.glob("cpu-bf16-speedup-*.json")
    cache.write_text("{not json")
    machine.cpu_bf16_speedup.cache_clear()
    again = machine.cpu_bf16_speedup()
    assert first > 0 and again > 0
    assert json.loads(cache.read_text())["fp32_over_bf16"] == again


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(DraftsyncError, match="fp8") as error:
        machine.trains_in_bf16("fp8", torch.device("cpu"))
    assert error.value.fix == "use auto, bf16 or fp32"


def test_the_machine_record_names_the_cpu_its_cores_and_the_vector_extensions_its_flags_list(monkeypatch):
    from pathlib import Path

    real_read_text = Path.read_text
    cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse avx avx2 fma\n\nprocessor\t: 1\n"

    def read_text(path, *args, **kwargs):
        return cpuinfo if str(path) == "/proc/cpuinfo" else real_read_text(path, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    record = machine.machine_record()
    assert record["cpu_model"] == "AMD EPYC 7B13"
    assert record["vector_extensions"] == ["AVX2"]  # no AVX-512, AVX512-BF16 or AMX on this CPU
    assert record["cores"] == len(os.sched_getaffinity(0))
    cpuinfo = cpuinfo.replace("avx2 fma", "avx2 avx512f avx512_bf16 amx_tile amx_bf16")
    assert machine.machine_record()["vector_extensions"] == ["AVX2", "AVX-512", "AVX512-BF16", "AMX"]
