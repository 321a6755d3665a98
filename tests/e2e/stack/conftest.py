"""The compose stack of docker-compose.yml, profile `cpu`, on podman (make test-stack builds the images first):
a project of its own, its own secrets and deployments file, every port on a free loopback port, and torn down
with its volumes at the end, pass or fail. Each container's log is kept in STACK_LOG_DIR (default
/tmp/draftsync-stack/logs)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.sync_profiles import tiny_sync_profile

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tools" / "stack"))
from stack import Stack  # noqa: E402  (tools/stack is no package)

PROJECT = "draftsync-stacktest"
# The forced acceptance drop: a fallback threshold of 0.95, above what the tiny drafter accepts, once 30 draft tokens
# were scored within a minute.
DEPLOYMENTS = """\
deployments:
  - name: chat
    target_name: stack-llm
    target_alias: production
    task_mix: {code: 0.5, math: 0.5}
    temperature: 0.0
    launch: reference
    host: 0.0.0.0
    port: 8000
    fallback_threshold: 0.95
    fallback_window_minutes: 1
    fallback_min_draft_tokens: 30
"""


@dataclass
class RunningStack:
    stack: Stack
    config_dir: Path
    ports: dict[str, int]
    secrets: dict[str, str]
    timeline: dict[str, float] = field(default_factory=dict)

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"


def _free_port() -> int:
    from draftsync.serving.process import free_port

    return free_port()


def _env_file(path: Path) -> dict[str, str]:
    return dict(
        line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")
    )


@pytest.fixture(scope="session")
def running_stack(tmp_path_factory) -> RunningStack:
    config = tmp_path_factory.mktemp("stack-config")
    subprocess.run([str(ROOT / "tools" / "stack" / "make-env.sh"), str(config)], check=True, capture_output=True)
    ports = {name: _free_port() for name in ("mlflow", "prefect", "mailpit", "webhooks", "serving", "router")}
    (config / "deployments.yaml").write_text(DEPLOYMENTS)
    (config / "sync-profile.yaml").write_text(tiny_sync_profile("stack-test"))
    with (config / "draftsync.env").open("a") as extra:
        extra.write("DRAFTSYNC_SYNC_PROFILE=/etc/draftsync/sync-profile.yaml\n")
        extra.write("DRAFTSYNC_REPORT_TIMEZONE=UTC\n")
    for path in config.iterdir():
        path.chmod(0o644)  # the containers' users read the bind-mounted files
    env = {
        "DRAFTSYNC_ENV_DIR": str(config),
        "DRAFTSYNC_DEPLOYMENTS_FILE": str(config / "deployments.yaml"),
        "STACK_SYNC_PROFILE": str(config / "sync-profile.yaml"),
        "DRAFTSYNC_BIND_ADDRESS": "127.0.0.1",
        **{f"DRAFTSYNC_{name.upper()}_PORT": str(port) for name, port in ports.items()},
    }
    stack = Stack(PROJECT, "cpu", [ROOT / "docker-compose.yml", ROOT / "tools" / "stack" / "compose.test.yml"], env)
    stack.down()  # a previous run's leftovers
    secrets = {}
    for name in ("mlflow", "prefect", "draftsync", "webhook", "serving"):
        secrets.update(_env_file(config / f"{name}.env"))
    running = RunningStack(stack, config, ports, secrets, stack.timeline)
    logs = Path(os.environ.get("STACK_LOG_DIR", "/tmp/draftsync-stack")) / "logs"
    try:
        stack.up(timeout=1200)
        yield running
    finally:
        print(f"\ncontainer logs: {stack.save_logs(logs)}")
        print("timeline (s since the stack's start): " + ", ".join(f"{k} {v}" for k, v in stack.timeline.items()))
        if os.environ.get("STACK_KEEP") != "1":
            stack.down()
