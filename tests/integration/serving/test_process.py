"""ServerProcess with plain child processes: death before health, timeouts, stopping a whole group."""

import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.process import ServerProcess, free_port


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (killed, not yet reaped) counts as dead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_a_process_that_dies_at_start_raises_with_its_log_tail(tmp_path):
    argv = python("""
        import sys
        print("loading weights from /nowhere", flush=True)
        print("boom: no such checkpoint", file=sys.stderr, flush=True)
        sys.exit(3)
    """)
    with ServerProcess(argv, "127.0.0.1", free_port(), tmp_path / "server.log") as server:
        with pytest.raises(DraftsyncError) as raised:
            server.wait_healthy(timeout=60)
    message = str(raised.value)
    assert "exited with code 3" in message
    assert "loading weights from /nowhere" in message and "boom: no such checkpoint" in message
    assert str(tmp_path / "server.log") in raised.value.fix


def test_a_process_that_never_answers_times_out_with_the_fix(tmp_path):
    with ServerProcess(python("import time; time.sleep(60)"), "127.0.0.1", free_port(), tmp_path / "s.log") as server:
        with pytest.raises(DraftsyncError, match="was not healthy after 1 s"):
            server.wait_healthy(timeout=1)
        assert server.running()
    assert not server.running()


def test_stop_kills_a_process_group_that_ignores_sigterm(tmp_path):
    pid_file = tmp_path / "child.pid"
    argv = python(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        child = subprocess.Popen([sys.executable, "-c", ignore_sigterm])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        print("ready", flush=True)
        time.sleep(120)
    """)
    server = ServerProcess(argv, "127.0.0.1", free_port(), tmp_path / "s.log").start()
    while not (pid_file.exists() and pid_file.read_text()):
        assert server.running(), (tmp_path / "s.log").read_text()
    child_pid = int(pid_file.read_text())
    assert alive(child_pid)
    assert server.stop(grace_seconds=0.5) == -9
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously to the grandchild
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)


def test_stop_kills_the_children_a_server_that_died_left_behind(tmp_path):
    """vLLM's API server killed on its own leaves its engine core running: stop() still takes the group down."""
    pid_file = tmp_path / "child.pid"
    argv = python(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(120)
    """)
    server = ServerProcess(argv, "127.0.0.1", free_port(), tmp_path / "s.log").start()
    while not (pid_file.exists() and pid_file.read_text()):
        assert server.running(), (tmp_path / "s.log").read_text()
    child_pid = int(pid_file.read_text())
    os.kill(server.pid, signal.SIGKILL)
    while server.running():
        time.sleep(0.05)
    assert alive(child_pid)  # orphaned, still in the server's process group
    server.stop()
    deadline = time.monotonic() + 10
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child_pid)


def test_a_missing_program_is_a_clear_error(tmp_path):
    with pytest.raises(DraftsyncError, match="could not be started"):
        ServerProcess(["/nonexistent/vllm", "serve"], "127.0.0.1", free_port(), tmp_path / "s.log").start()
