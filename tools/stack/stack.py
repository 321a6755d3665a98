"""Bring docker-compose.yml up with podman as compose would, waiting on every depends_on condition.

podman-compose creates the containers (`up --no-start`: it translates the compose file), and this starts them in
dependency order: podman 4.3 has no `podman wait --condition=healthy`, so podman-compose would skip
`service_healthy` (and nothing runs healthchecks without systemd). Here a service starts only once each service it
depends on is started, healthy (its healthcheck, run through `podman healthcheck run`) or completed with exit code 0.

Used by tests/e2e/stack (make test-stack); by hand, from the repository root:
    python tools/stack/stack.py up|down|logs DIR   (PROJECT, PROFILE, and compose's variables from the environment)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PODMAN_COMPOSE = os.environ.get("STACK_PODMAN_COMPOSE", str(ROOT / ".venv-stack" / "bin" / "podman-compose"))
CONTAINERS_CONF = ROOT / "tools" / "stack" / "containers.conf"


class StackError(RuntimeError):
    pass


class Stack:
    def __init__(self, project: str, profile: str, files: list[Path], env: dict[str, str]):
        self.project, self.profile, self.files = project, profile, files
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF), **env}
        self.started = time.monotonic()
        self.timeline: dict[str, float] = {}

    # --- podman and podman-compose --------------------------------------------------------------------------
    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        argv = [PODMAN_COMPOSE, "-p", self.project, "--profile", self.profile]
        for path in self.files:
            argv += ["-f", str(path)]
        done = subprocess.run([*argv, *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise StackError(f"podman-compose {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return done

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise StackError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done

    def config(self) -> dict:
        import yaml

        return yaml.safe_load(self.compose("config").stdout)

    def containers(self) -> dict[str, str]:
        """service -> container name, for this project's containers."""
        listed = self.podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}", "--format", "json"
        ).stdout
        return {c["Labels"]["com.docker.compose.service"]: c["Names"][0] for c in json.loads(listed or "[]")}

    def state(self, service: str) -> dict:
        name = self.containers()[service]
        return json.loads(self.podman("inspect", name).stdout)[0]["State"]

    def mark(self, what: str) -> float:
        self.timeline[what] = round(time.monotonic() - self.started, 1)
        return self.timeline[what]

    # --- up and down ------------------------------------------------------------------------------------------
    def up(self, timeout: float = 900) -> None:
        """Create every container of the profile, then start each once its dependencies' conditions hold."""
        services = self.config()["services"]
        # --no-deps: no podman-level --requires links (podman 4.3 cannot start a container whose required one has
        # exited, as setup does); the order and the conditions are kept here instead.
        self.compose("up", "-d", "--no-build", "--no-start", "--no-deps")
        names = self.containers()
        missing = set(services) - set(names)
        if missing:
            raise StackError(f"podman-compose created no container for {sorted(missing)}")
        done: dict[str, str] = {}  # service -> the condition it reached: started, healthy, completed
        deadline = time.monotonic() + timeout
        pending = list(services)
        while pending:
            for service in list(pending):
                depends = services[service].get("depends_on") or {}
                if isinstance(depends, list):
                    depends = {name: {"condition": "service_started"} for name in depends}
                if all(
                    self._reached(other, spec.get("condition", "service_started"), done, services)
                    for other, spec in depends.items()
                ):
                    self.podman("start", names[service])
                    done[service] = "started"
                    pending.remove(service)
            for service in list(done):
                self._reached(service, "service_healthy", done, services)  # note healthy ones for the timeline
            if time.monotonic() > deadline:
                raise StackError(f"services {pending} never started: waiting on {self._waits(pending, services)}")
            time.sleep(2)
        self.wait_healthy(list(services), deadline - time.monotonic())

    def _reached(self, service: str, condition: str, done: dict[str, str], services: dict) -> bool:
        if service not in done:
            return False
        state = self.state(service)
        if condition == "service_started":
            return True
        if condition == "service_completed_successfully":
            if state["Status"] == "exited":
                if state["ExitCode"] != 0:
                    raise StackError(f"{service} exited with {state['ExitCode']}:\n{self.log_tail(service)}")
                if "completed" not in self.timeline:
                    pass
                self.timeline.setdefault(f"{service} completed", round(time.monotonic() - self.started, 1))
                return True
            return False
        # service_healthy
        if done[service] == "healthy":
            return True
        if "healthcheck" not in services[service]:
            return True
        if state["Status"] == "exited":
            raise StackError(f"{service} exited ({state['ExitCode']}) before it was healthy:\n{self.log_tail(service)}")
        if self.podman("healthcheck", "run", self.containers()[service], check=False).returncode == 0:
            done[service] = "healthy"
            self.mark(f"{service} healthy")
            return True
        return False

    def _waits(self, pending: list[str], services: dict) -> dict:
        return {s: services[s].get("depends_on") for s in pending}

    def wait_healthy(self, services: list[str], timeout: float) -> None:
        config = self.config()["services"]
        deadline = time.monotonic() + max(timeout, 60)
        done = {s: "started" for s in services}
        while True:
            waiting = [
                s
                for s in services
                if "healthcheck" in config[s]
                and config[s].get("restart") != "no"
                and not self._reached(s, "service_healthy", done, config)
            ]
            if not waiting:
                return
            if time.monotonic() > deadline:
                tails = "\n".join(f"--- {s}\n{self.log_tail(s)}" for s in waiting)
                raise StackError(f"not healthy in time: {waiting}\n{tails}")
            time.sleep(3)

    def log_tail(self, service: str, lines: int = 40) -> str:
        name = self.containers().get(service)
        if name is None:
            return "(no container)"
        done = self.podman("logs", "--tail", str(lines), name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def save_logs(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        for service, name in self.containers().items():
            done = self.podman("logs", "-t", name, check=False)
            (folder / f"{service}.log").write_text(done.stdout + done.stderr)
        return folder

    def down(self) -> None:
        self.compose("down", "-v", "-t", "10", check=False, timeout=300)
        for name in self.containers().values():  # anything podman-compose left behind
            self.podman("rm", "-f", "-v", name, check=False)
        volumes = self.podman(
            "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={self.project}", check=False
        ).stdout.split()
        for volume in volumes:
            self.podman("volume", "rm", "-f", volume, check=False)
        self.podman("network", "rm", "-f", f"{self.project}_default", check=False)


def main(argv: list[str]) -> int:
    stack = Stack(
        os.environ.get("PROJECT", "draftsync"),
        os.environ.get("PROFILE", "cpu"),
        [ROOT / "docker-compose.yml"],
        {},
    )
    command = argv[1] if len(argv) > 1 else "up"
    if command == "up":
        stack.up()
        print(json.dumps(stack.timeline, indent=2))
    elif command == "down":
        stack.down()
    elif command == "logs":
        print(stack.save_logs(Path(argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
