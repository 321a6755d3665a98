"""`draftsync webhooks serve` as a process: stopped by SIGTERM after it has emitted an event, it leaves no child
behind. Prefect's API subprocess, started by the first event, outlived it with PPID 1: uvicorn re-raises the signal
after its graceful shutdown, and with the default handler the process died before its `finally` could stop it."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.receiver.test_webhook_receiver import SECRET, signed, version_created_body


@pytest.mark.system
def test_a_sigterm_after_an_emitted_event_stops_the_receiver_and_its_prefect_api(workdir, built_targets, tmp_path):
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.tasks.registration import publish_target

    version = publish_target("orphan-llm", str(built_targets[1]), {"code": 1.0})
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PREFECT_") and key not in ("DRAFTSYNC_DEBUG",)
    }
    env.update(
        {
            "DRAFTSYNC_WORKDIR": str(workdir),
            "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"],
            "DRAFTSYNC_WEBHOOK_SECRET": SECRET,
            "PREFECT_HOME": str(tmp_path / "receiver-prefect"),  # no API configured: Prefect starts its own
        }
    )
    port = free_port()
    command = [str(Path(sys.executable).parent / "draftsync"), "webhooks", "serve", "--port", str(port)]
    receiver = ServerProcess(command, "127.0.0.1", port, tmp_path / "receiver.log", env=env).start()
    try:
        receiver.wait_healthy(120, health_path="/healthz")
        body = version_created_body("orphan-llm", str(version))
        answer = httpx.post(f"{receiver.url}/mlflow/webhook", content=body, headers=signed(body), timeout=120)
        assert answer.status_code == 200 and "sync requested" in answer.text, answer.text
        parent = psutil.Process(receiver.pid)
        children = parent.children(recursive=True)
        assert children, "emitting the event started Prefect's API"
        os.kill(receiver.pid, signal.SIGTERM)  # to the receiver alone, as `docker stop` does, not its group
        assert parent.wait(timeout=60) == 128 + signal.SIGTERM  # a clean exit, not death by the signal
        deadline = time.monotonic() + 30
        while any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children):
            assert time.monotonic() < deadline, [child.cmdline() for child in children if child.is_running()]
            time.sleep(0.5)
    finally:
        receiver.stop()
