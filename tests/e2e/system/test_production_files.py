"""The compose `setup` service's own script against a real Prefect server on Postgres: it creates the work pools
and deploys prefect.yaml, twice, and the server's automations turn draftsync's events into flow runs. The static
checks of the production files are tests/integration/flows/test_production_files.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.flows.test_production_files import ROOT, _compose, _prefect_deployments, _prefect_yaml, _scripts


def _start_prefect_server(tmp_path: Path, database_url: str) -> tuple[subprocess.Popen, str, dict]:
    import httpx
    from draftsync.serving.process import free_port

    port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PREFECT_", "DRAFTSYNC_WEBHOOK", "MLFLOW_TRACKING"))
    }
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "PREFECT_API_DATABASE_CONNECTION_URL": database_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "true",
            "PREFECT_LOGGING_LEVEL": "WARNING",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        }
    )
    log = open(tmp_path / "prefect-server.log", "w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    api = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.5)
    else:
        server.terminate()
        pytest.fail(f"the Prefect server did not answer: {(tmp_path / 'prefect-server.log').read_text()[-2000:]}")
    if server.poll() is not None:
        pytest.fail(f"the Prefect server exited: {(tmp_path / 'prefect-server.log').read_text()[-2000:]}")
    env["PREFECT_API_URL"] = api
    return server, api, env


@pytest.mark.system  # a real Prefect server and `prefect deploy --all`: make test-system
def test_setup_script_creates_pools_and_deploys_prefect_yaml_on_a_real_server(tmp_path, postgres_server):
    """The compose `setup` service's own script, run twice against a Prefect server on Postgres."""
    import httpx
    from mlflow import MlflowClient

    from tests.support.servers import mlflow_server

    database_url = postgres_server.create_database().replace("postgresql+psycopg://", "postgresql+asyncpg://")
    server, api, env = _start_prefect_server(tmp_path, database_url)
    script = _scripts(_compose()["services"]["setup"])[0]
    env["DRAFTSYNC_REPORT_TIMEZONE"] = "Europe/Berlin"
    env["DRAFTSYNC_WORKDIR"] = str(tmp_path / "work")
    leftovers = [ROOT / ".prefect", ROOT / ".prefectignore"]
    existed = {path for path in leftovers if path.exists()}
    try:
        without_secret = subprocess.run(["sh", "-ec", script], cwd=ROOT, env=env, capture_output=True, text=True)
        assert without_secret.returncode != 0 and "DRAFTSYNC_WEBHOOK_SECRET is required" in without_secret.stderr
        with mlflow_server(tmp_path) as mlflow:
            env.update(
                MLFLOW_TRACKING_URI=mlflow.url,
                DRAFTSYNC_WEBHOOK_SECRET="setup-test-secret",
                DRAFTSYNC_WEBHOOK_URL="http://127.0.0.1:8765/mlflow/webhook",
            )
            for attempt in range(2):  # the stack runs it on every `docker compose up`: the second run changes nothing
                run = subprocess.run(
                    ["sh", "-ec", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
                )
                assert run.returncode == 0, (
                    f"setup run {attempt + 1} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
                )
            webhooks = [(w.name, w.url) for w in MlflowClient(mlflow.url).list_webhooks()]
        assert webhooks == [("draftsync", "http://127.0.0.1:8765/mlflow/webhook")]  # registered once, updated after
        pools = {p["name"]: p["type"] for p in httpx.post(f"{api}/work_pools/filter", json={}, timeout=30).json()}
        deployments = {d["name"]: d for d in httpx.post(f"{api}/deployments/filter", json={}, timeout=30).json()}
        automations = httpx.post(f"{api}/automations/filter", json={}, timeout=30).json()
        triggered = _runs_started_by_events(api, {deployments[n]["id"]: n for n in ("drafter-sync", "rollout")})
        time.sleep(3)  # a second trigger that matched would have started its run by now
        all_runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert {path for path in leftovers if path.exists()} <= existed, "prefect deploy left files in the repository"
    assert pools == {"draftsync-cpu": "process", "draftsync-gpu": "process"}
    expected = _prefect_deployments()
    assert set(deployments) == set(expected)
    for name, deployment in deployments.items():
        assert deployment["work_pool_name"] == expected[name]["work_pool"]["name"]
        assert deployment["pull_steps"] == _prefect_yaml()["pull"]
        assert deployment["entrypoint"] == expected[name]["entrypoint"]
    schedules = {
        name: sorted(str(s["schedule"].get("interval") or s["schedule"].get("cron")) for s in d["schedules"])
        for name, d in deployments.items()
    }
    assert schedules["registry-watch"] == ["300.0"] and schedules["acceptance-scrape"] == ["60.0"]
    assert schedules["weekly-acceptance-report"] == ["0 9 * * 1"]
    assert deployments["weekly-acceptance-report"]["schedules"][0]["schedule"]["timezone"] == "Europe/Berlin"
    sync = deployments["drafter-sync"]
    assert sync["global_concurrency_limit"]["limit"] == 1
    assert sync["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    assert all(d["global_concurrency_limit"] is None for name, d in deployments.items() if name != "drafter-sync")
    by_deployment: dict[str, list[set[str]]] = {}
    ids = {d["id"]: name for name, d in deployments.items()}
    for automation in automations:
        (action,) = automation["actions"]
        by_deployment.setdefault(ids[action["deployment_id"]], []).append(set(automation["trigger"]["expect"]))
    assert by_deployment == {
        name: [set(t["expect"]) for t in d["triggers"]] for name, d in expected.items() if d.get("triggers")
    }, "one automation per trigger"
    # The server's own automations turned the events into runs, with parameters taken from the labels.
    assert triggered["drafter-sync"]["parameters"] == {
        "target_name": "llama-chat",
        "target_version": 7,
        "reason": "draftsync.target.version.created: registered",
    }
    # only the 4-GPU trigger matched the event's label: every sync run it started asks a pool for 4 GPUs
    sync_runs = [r for r in all_runs if r.get("deployment_id") == sync["id"]]
    assert sync_runs and all(r["job_variables"]["gpu_limit"] == 4 for r in sync_runs), sync_runs
    requests = triggered["drafter-sync"]["job_variables"]["container_create_kwargs"]["device_requests"]
    assert [(r["driver"], r["count"]) for r in requests] == [("nvidia", 4)]
    assert triggered["rollout"]["parameters"]["target_name"] == "llama-chat"
    assert triggered["rollout"]["parameters"]["reason"] == "draftsync.drafter.validated for llama-chat v7"
    for run in triggered.values():
        assert run["state"]["type"] == "SCHEDULED"  # no worker here: it waits for one on its pool


def _runs_started_by_events(api: str, deployment_names: dict[str, str]) -> dict[str, dict]:
    """Post one sync event and one rollout event as draftsync emits them; the flow runs they start, by deployment."""
    import httpx
    from draftsync.tasks.events import SYNC_EVENTS, target_resource

    now = datetime.now(UTC).isoformat()
    events = [
        {
            "occurred": now,
            "event": name,
            "id": str(uuid.uuid4()),
            "payload": {"reason": "registered"},
            # a sync event says how many GPUs its sync asks for; the trigger for that count gives the run its GPUs
            "resource": target_resource("llama-chat", 7, **({"gpus": "4"} if name in SYNC_EVENTS else {})),
        }
        for name in ("draftsync.target.version.created", "draftsync.drafter.validated")
    ]
    runs: dict[str, dict] = {}
    for _ in range(240):  # automations act within seconds; a slow machine gets two minutes
        if len(runs) < len(deployment_names) and _ % 20 == 0:  # until the triggers service has loaded them
            assert httpx.post(f"{api}/events", json=events, timeout=30).status_code == 204
            for event in events:
                event["id"] = str(uuid.uuid4())
        found = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
        runs = {deployment_names[r["deployment_id"]]: r for r in found if r.get("deployment_id") in deployment_names}
        if len(runs) == len(deployment_names):
            return runs
        time.sleep(0.5)
    failures = (
        httpx.post(f"{api}/events/filter", json={"filter": {"event": {"prefix": ["prefect.automation"]}}}, timeout=30)
        .json()
        .get("events", [])
    )
    pytest.fail(
        f"events started {sorted(runs)} of {sorted(deployment_names.values())}; automation events: "
        f"{[(e['event'], e.get('payload')) for e in failures][:10]}"
    )
