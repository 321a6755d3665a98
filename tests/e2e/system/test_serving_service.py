"""The serving service as production runs it: a `draftsync serving run` process of its own, with its own work dir,
owns the servers and routers; the rollout flow and the scrape's fallback (run here, as a worker of any pool would)
steer it through its admin API and start no server themselves."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest

TOKEN = "serving-service-test-token"


def _completion(endpoint: str, prompt: str = "def add(a, b):") -> dict:
    answer = httpx.post(
        f"{endpoint}/v1/completions",
        timeout=60,
        json={"model": "svc", "prompt": prompt, "max_tokens": 12, "temperature": 0},
    )
    answer.raise_for_status()
    return answer.json()


def _healthy(endpoint: str) -> bool:
    try:
        return httpx.get(f"{endpoint}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _draft_tokens(completion: dict) -> int:
    from draftsync.tasks.traffic import spec_decode_counts

    return spec_decode_counts(completion)["draft_tokens"]


def test_flows_steer_the_serving_service_which_outlives_them_and_refuses_calls_without_its_token(
    workdir, built_targets, tmp_path, monkeypatch
):
    from draftsync.flows.rollout import rollout
    from draftsync.flows.scrape import scrape
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.service_client import ServingServiceClient
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.serving import captured_prompts

    from tests.support.tiny_models import build_tiny_drafter

    registry = context.registry()
    v1 = publish_target("svc-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    drafter_dir = build_tiny_drafter(built_targets[1], tmp_path / "drafter", gamma=3)
    drafter = registry.register_drafter("svc-llm", v1, drafter_dir, "eagle3", 3, {}, validation_passed=True)
    registry.promote("svc-llm", drafter)
    router_port = free_port()
    deployments = tmp_path / "deployments.yaml"
    deployments.write_text(
        "deployments:\n"
        f"  - {{name: svc, target_name: svc-llm, launch: reference, host: 127.0.0.1, port: {router_port},\n"
        "     fallback_threshold: 0.95, fallback_min_draft_tokens: 30, capture: {rate: 1.0}}\n"
    )
    service_port = free_port()
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("DRAFTSYNC_", "PREFECT_API"))}
    environment.update(
        DRAFTSYNC_WORKDIR=str(tmp_path / "service-work"),  # its own: it shares MLflow with the flows, no folder
        DRAFTSYNC_DEPLOYMENTS_FILE=str(deployments),
        DRAFTSYNC_SERVING_TOKEN=TOKEN,
        DRAFTSYNC_MODEL_ROOTS=os.environ.get("DRAFTSYNC_MODEL_ROOTS", ""),
    )
    draftsync = Path(sys.executable).with_name("draftsync")
    argv = [str(draftsync), "serving", "run", "--port", str(service_port)]
    service = ServerProcess(argv, "127.0.0.1", service_port, tmp_path / "service.log", env=environment).start()
    try:
        service.wait_healthy(timeout=120, health_path="/healthz")
        monkeypatch.setenv("DRAFTSYNC_DEPLOYMENTS_FILE", str(deployments))
        monkeypatch.setenv("DRAFTSYNC_SERVING_URL", service.url)
        monkeypatch.setenv("DRAFTSYNC_SERVING_TOKEN", TOKEN)
        context.reset()
        spec = ServingDeployment(
            name="svc",
            target_name="svc-llm",
            launch="reference",
            host="127.0.0.1",
            port=router_port,
            fallback_threshold=0.95,
            fallback_min_draft_tokens=30,
            capture={"rate": 1.0},
        )

        served = rollout(spec)

        assert (served["state"], served["drafter_version"]) == ("serving", drafter)
        assert served["endpoint"] == f"http://127.0.0.1:{router_port}"
        assert not list((workdir / "serving").glob("*.json")), "the flow's process started no server of its own"
        assert _draft_tokens(_completion(served["endpoint"])) > 0  # the router outlived the flow run and speculates

        client = ServingServiceClient(service.url, TOKEN)
        before = client.deployments()["svc"]
        upstream = before["backend"]["endpoint"]
        put = f"{service.url}/draftsync/deployments/svc/pair"
        plain = {"target_version": v1, "drafter_version": None, "gamma": 0, "method": None, "schedule": None}
        refused = [
            httpx.put(put, json=plain, timeout=30),
            httpx.put(put, json=plain, headers={"Authorization": "Bearer a-stale-token"}, timeout=30),
            httpx.get(f"{service.url}/draftsync/deployments", timeout=30),
        ]
        assert [r.status_code for r in refused] == [401, 403, 401]
        assert TOKEN not in "".join(r.text for r in refused)
        assert client.deployments()["svc"]["backend"]["endpoint"] == upstream  # the pair is unchanged
        assert _draft_tokens(_completion(served["endpoint"])) > 0

        for prompt in ("def add(a, b):", "The sum of 12 and 30", "Permission is hereby", "for i in range(10):"):
            _completion(served["endpoint"], prompt)
        result = scrape(deployments=[spec])

        decision = result["guard"][0]
        assert decision["action"] == "fallback", decision
        [scraped] = result["deployments"]
        assert scraped["requests_booked"] >= 4  # the router's capture file lies with the service: read through it
        prompts, where = captured_prompts("svc-llm")
        assert "for i in range(10):" in [p.text for p in prompts] and where.startswith("svc: "), where
        after = client.deployments()["svc"]
        assert after["backend"]["endpoint"] != upstream  # the service switched the router to a plain server
        assert _draft_tokens(_completion(served["endpoint"])) == 0
        pair = context.store().pairs.get("svc")
        assert (pair.state, pair.drafter_version, pair.endpoint) == ("fallback", None, served["endpoint"])
        assert not list((workdir / "serving").glob("*.json"))
    finally:
        service.stop()
    with pytest.raises(httpx.TransportError):  # the routers are the service's children: they stop with it
        httpx.get(f"http://127.0.0.1:{router_port}/draftsync/live", timeout=5)

    restarted = ServerProcess(argv, "127.0.0.1", service_port, tmp_path / "restarted.log", env=environment).start()
    try:
        restarted.wait_healthy(timeout=120, health_path="/healthz")
        deadline = time.monotonic() + 180
        while not _healthy(served["endpoint"]):  # the router's /health: an upstream is set and answers
            assert time.monotonic() < deadline, "the restarted service did not serve the deployment again"
            time.sleep(0.5)
        assert _draft_tokens(_completion(served["endpoint"])) == 0  # the pair it was last switched to: plain
    finally:
        restarted.stop()
