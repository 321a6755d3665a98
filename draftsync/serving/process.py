"""A model server as a child process on loopback: start, wait until healthy, stop cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from draftsync.errors import DraftsyncError

LOG_TAIL_LINES = 30


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it; a race with other processes is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


class ServerProcess:
    """Runs `argv` (an argument list, never a shell string) with its output in `log_path`.

    The child gets its own process group, so `stop` also ends the workers a server spawns (vLLM does).
    """

    def __init__(
        self,
        argv: Sequence[str],
        host: str,
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ):
        self.argv = [str(arg) for arg in argv]
        self.host = host
        self.port = int(port)
        self.log_path = Path(log_path)
        self.env = dict(env) if env is not None else None
        self._process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> ServerProcess:
        if self.running():
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **self.env} if self.env is not None else None,
                    start_new_session=True,
                )
            except OSError as error:
                raise DraftsyncError(
                    f"server command {self.argv[0]!r} could not be started ({error})",
                    "check that the program is installed and on PATH",
                ) from error
        return self

    def wait_healthy(self, timeout: float, health_path: str = "/health") -> None:
        """Poll the health endpoint until it answers 200; fail with the log's tail if the child dies."""
        import httpx

        if self._process is None:
            raise DraftsyncError("server process was never started", "call start() before wait_healthy()")
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self._process.poll()
                if code is not None:
                    raise DraftsyncError(
                        f"server `{' '.join(self.argv[:4])} ...` exited with code {code} before it became "
                        f"healthy; last lines of {self.log_path}:\n{log_tail(self.log_path)}",
                        f"read the full log at {self.log_path} and fix the cause shown there",
                    )
                try:
                    if client.get(self.url + health_path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise DraftsyncError(
                        f"server at {self.url} was not healthy after {timeout:.0f} s; last lines of "
                        f"{self.log_path}:\n{log_tail(self.log_path)}",
                        "give it longer to load the model, or read the log for what it is stuck on",
                    )
                time.sleep(0.2)

    def stop(self, grace_seconds: float = 10.0) -> int | None:
        """SIGTERM to the process group, then SIGKILL after the grace period; returns the exit code. A server whose
        own process has already died may have left children (vLLM's engine core), so its group is killed anyway."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                process.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                process.wait()
        else:
            self._signal_group(signal.SIGKILL)
        return process.returncode

    def _signal_group(self, signum: int) -> None:
        assert self._process is not None, "signalled only once started"
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
