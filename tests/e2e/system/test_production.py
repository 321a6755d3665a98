"""Production-like: real `prefect server` and `mlflow server` processes on Postgres, `draftsync serve`, the
webhook receiver; a target version registered in MLflow becomes exactly one completed drafter-sync run, and a
stale finding's retrain request becomes a second one that registers the next drafter for the same version.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from draftsync.serving.process import ServerProcess, free_port, log_tail

from tests.support.servers import mlflow_server, prefect_server
from tests.support.sync_profiles import tiny_sync_profile

SECRET = "whsec-production-test-8d1f"
PROFILE = tiny_sync_profile("production-test")


def draftsync_bin() -> str:
    return str(Path(sys.executable).with_name("draftsync"))


@contextmanager
def prefect_client(api_url: str):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}):
        with get_client(sync_client=True) as client:
            yield client


def wait_for(what: str, check, timeout: float, logs: list[Path], every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{log_tail(p, 40)}" for p in logs)
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n{tails}")
        time.sleep(every)


def signed(body: bytes, delivery_id: str) -> dict[str, str]:
    timestamp = str(int(time.time()))
    digest = hmac.new(SECRET.encode(), f"{delivery_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return {
        "Content-Type": "application/json",
        "X-MLflow-Delivery-Id": delivery_id,
        "X-MLflow-Timestamp": timestamp,
        "X-MLflow-Signature": "v1," + base64.b64encode(digest).decode(),
    }


def sync_runs(client, deployment_id) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


@pytest.mark.slow
@pytest.mark.system
def test_a_registered_target_version_becomes_one_completed_sync_run_through_prefect_and_mlflow_servers(
    postgres_server, tmp_path
):
    from draftsync.flows.prefect_deployments import WORK_POOLS
    from draftsync.monitors.store import Store
    from draftsync.registry.model_registry import Registry
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.targets import describe_target
    from draftsync.tasks.events import target_resource
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    target_dir = build_target(builtin_recipe(1, "test"), tmp_path / "target-cache")
    monitor_url = postgres_server.create_database()
    (tmp_path / "profile.yaml").write_text(PROFILE)
    with (
        prefect_server(tmp_path, postgres_server.create_database()) as (api_url, prefect_process),
        mlflow_server(tmp_path, backend_store_uri=postgres_server.create_database()) as mlflow,
    ):
        env = {
            "PREFECT_API_URL": api_url,
            "PREFECT_HOME": str(tmp_path / "prefect-client-home"),
            "MLFLOW_TRACKING_URI": mlflow.url,
            "DRAFTSYNC_WORKDIR": str(tmp_path / "work"),
            "DRAFTSYNC_MONITOR_DB_URL": monitor_url,
            "DRAFTSYNC_WEBHOOK_SECRET": SECRET,
            "DRAFTSYNC_SYNC_PROFILE": str(tmp_path / "profile.yaml"),
            "PREFECT_RUNNER_POLL_FREQUENCY": "2",
            "PREFECT_LOGGING_LEVEL": "INFO",
        }
        receiver_port = free_port()
        receiver = ServerProcess(
            [draftsync_bin(), "webhooks", "serve", "--host", "127.0.0.1", "--port", str(receiver_port)],
            "127.0.0.1",
            receiver_port,
            tmp_path / "receiver.log",
            env=env,
        )
        serve_log = tmp_path / "serve.log"
        serve = ServerProcess(
            [draftsync_bin(), "serve", "--watch-interval", "600"], "127.0.0.1", free_port(), serve_log, env=env
        )
        logs = [serve_log, tmp_path / "receiver.log", tmp_path / "prefect-server.log", mlflow.log_path]
        with receiver, serve:
            receiver.wait_healthy(120, health_path="/healthz")
            registered = subprocess.run(
                [draftsync_bin(), "webhooks", "register", "--url", f"{receiver.url}/mlflow/webhook"],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert registered.returncode == 0, registered.stderr
            assert SECRET not in registered.stdout + registered.stderr

            with prefect_client(api_url) as client:

                def served():
                    found = client.read_deployments(
                        deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=list(WORK_POOLS)))
                    )
                    return found if len(found) == len(WORK_POOLS) else None

                deployments = {d.name: d for d in wait_for("the five deployments", served, 240, logs)}
                assert sorted(deployments) == sorted(WORK_POOLS)
                intervals = {
                    name: d.schedules[0].schedule.interval.total_seconds()
                    for name, d in deployments.items()
                    if d.schedules and hasattr(d.schedules[0].schedule, "interval")
                }
                assert intervals == {"registry-watch": 600.0, "acceptance-scrape": 60.0}
                cron = deployments["weekly-acceptance-report"].schedules[0].schedule
                assert (cron.cron, cron.timezone) == ("0 9 * * 1", "UTC")
                sync_deployment = deployments["drafter-sync"]
                assert sync_deployment.global_concurrency_limit.limit == 1  # one sync at a time; the rest queue
                assert sync_deployment.concurrency_options.collision_strategy.value == "ENQUEUE"
                automations = {a.name: a for a in client.read_automations()}
                triggers = {name: a.trigger.expect for name, a in automations.items()}
                assert {
                    "draftsync.target.version.created",
                    "draftsync.sync.requested",
                    "draftsync.drafter.stale",
                } in triggers.values()
                assert {"draftsync.drafter.validated", "draftsync.target.alias.moved"} in triggers.values()

                # A model team registers a target version: MLflow calls the receiver, which asks for one sync.
                registry = Registry(mlflow.url)
                facts = {**describe_target(target_dir), "task_mix": {"code": 0.5, "math": 0.5}}
                version = registry.register_target("prod-llm", target_dir, target_tags(**facts))
                ledger = Store(monitor_url).ledger
                job = wait_for(
                    "the webhook's sync request", lambda: ledger.get("prod-llm", version, "eagle3"), 60, logs, every=0.5
                )
                assert job.source == "webhook"

                # 20 more triggers for the same version at once, each a valid, distinct delivery: no second sync.
                body = json.dumps(
                    {
                        "entity": "model_version",
                        "action": "created",
                        "timestamp": "now",
                        "data": {
                            "name": "prod-llm",
                            "version": str(version),
                            "source": "x",
                            "run_id": None,
                            "tags": {"draftsync.kind": "target"},
                            "description": None,
                        },
                    }
                ).encode()
                deliveries = [str(uuid.uuid4()) for _ in range(20)]
                with httpx.Client(timeout=60) as http, ThreadPoolExecutor(20) as pool:
                    answers = list(
                        pool.map(
                            lambda d: http.post(
                                f"{receiver.url}/mlflow/webhook", content=body, headers=signed(body, d)
                            ),
                            deliveries,
                        )
                    )
                    replay = http.post(
                        f"{receiver.url}/mlflow/webhook", content=body, headers=signed(body, deliveries[0])
                    )
                assert [a.status_code for a in answers] == [200] * 20, [a.text for a in answers]
                assert all("already requested" in a.json()["action"] for a in answers)
                assert replay.status_code == 409

                def finished():
                    runs = sync_runs(client, sync_deployment.id)
                    return runs if runs and all(r.state is not None and r.state.is_final() for r in runs) else None

                runs = wait_for("the drafter-sync run", finished, 600, logs, every=3)
                time.sleep(5)  # any second run an extra event would start has been scheduled by now
                runs = sync_runs(client, sync_deployment.id)
                assert len(runs) == 1, [(r.name, r.state_name, r.parameters) for r in runs]
                (run,) = runs
                assert run.state.is_completed(), (run.state, log_tail(serve_log, 60))
                assert run.parameters["target_name"] == "prod-llm" and int(run.parameters["target_version"]) == version
                # the receiver sized it on a node of one GPU (the default pool): the 1-GPU trigger started it
                assert run.job_variables["gpu_limit"] == 1, run.job_variables
                # What a person finds in the Prefect UI: the sync's summary with its gate table and links, and the
                # training's progress bar at 100 %.
                from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

                artifacts = client.read_artifacts(
                    artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
                )
                summary = next(a for a in artifacts if a.key == f"sync-prod-llm-v{version}")
                assert "| validation_acceptance_mean |" in summary.data and "| tpot_speedup |" in summary.data
                assert f"{mlflow.url}/#/models/prod-llm-drafter/versions/" in summary.data
                assert f"/runs/flow-run/{run.id}" in summary.data
                assert [a.data for a in artifacts if a.type == "progress"] == [100.0]

                # The weekly review finds the drafter stale: it asks the ledger for a retrain and emits
                # draftsync.drafter.stale (as `request_sync(..., retrain=True)` does, labelled with the GPUs its sync
                # asks for: an unlabelled event matches no trigger); the same deployment trains the next generation.
                first = ledger.get("prod-llm", version, "eagle3")
                assert ledger.request(
                    "prod-llm",
                    version,
                    "eagle3",
                    source="weekly-review",
                    retrain=True,
                    reason="acceptance 0.41 sustained: stale",
                )
                stale = {
                    "occurred": datetime.now(UTC).isoformat(),
                    "event": "draftsync.drafter.stale",
                    "id": str(uuid.uuid4()),
                    "resource": target_resource("prod-llm", version, gpus="1"),
                    "payload": {"reason": "acceptance 0.41 sustained: stale", "retrain": True},
                }
                assert httpx.post(f"{api_url}/events", json=[stale], timeout=30).status_code == 204

                def retrained():
                    runs = sync_runs(client, sync_deployment.id)
                    return runs if len(runs) == 2 and all(r.state.is_final() for r in runs) else None

                runs = wait_for("the retrain run", retrained, 600, logs, every=3)
                assert all(r.state.is_completed() for r in runs), [r.state for r in runs]
        assert first.status == "succeeded" and first.run_id.startswith(str(run.id)) and first.generation == 0
        drafter = registry.version_tags("prod-llm-drafter", first.drafter_version)
        assert drafter["draftsync.target.version"] == str(version)
        job = ledger.get("prod-llm", version, "eagle3")
        assert (job.status, job.generation, job.source) == ("succeeded", 1, "weekly-review")
        assert job.drafter_version > first.drafter_version  # a new drafter version, for the same target version
        retrained_tags = registry.version_tags("prod-llm-drafter", job.drafter_version)
        assert retrained_tags["draftsync.target.version"] == str(version)
        assert retrained_tags["draftsync.sync.generation"] == "1"
        assert SECRET not in receiver.log_path.read_text() and SECRET not in serve_log.read_text()
