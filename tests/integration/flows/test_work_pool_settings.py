"""A flow run a work pool starts gets only what the pool gives it: without the shared settings it fails at its start,
naming each; with them in the env file at DRAFTSYNC_ENV_FILE it runs on them. Without a pool the embedded defaults
stay. Real runs: Prefect's test harness, a
`process` work pool and Prefect's own process worker, which starts each flow run as a process of its own."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[3]
POOL = "draftsync-settings-test"


SHARED_KEYS = ("MLFLOW_TRACKING_URI", "DRAFTSYNC_MONITOR_DB_URL", "DRAFTSYNC_ENV_FILE", "DRAFTSYNC_DEPLOYMENTS_FILE")


@pytest.fixture(scope="module")
def bare_environment(tmp_path_factory, prefect_harness):
    """No shared setting in this process's environment, which the process worker hands to its flow runs."""
    from draftsync.tasks import context

    saved = dict(os.environ)
    for key in SHARED_KEYS:
        os.environ.pop(key, None)
    root = tmp_path_factory.mktemp("pool-settings")
    os.environ["DRAFTSYNC_WORKDIR"] = str(root / "work")
    context.reset()
    yield root
    context.reset()
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def pool_runs(bare_environment) -> dict:
    """Two runs of registry-watch on a process pool, executed side by side by one process worker: without the
    shared settings, and with them in an env file the `env` job variable names (an env file that cannot be read:
    tests/unit/test_env_file.py)."""
    shared = bare_environment / "shared"
    shared.mkdir()
    env_file = bare_environment / "draftsync.env"
    env_file.write_text(
        f"MLFLOW_TRACKING_URI=sqlite:///{shared / 'mlflow.db'}\n"
        f"DRAFTSYNC_MONITOR_DB_URL=sqlite:///{shared / 'monitor.db'}\n"
    )
    cases = {
        "without-settings": {},
        "with-env-file": {"env": {"DRAFTSYNC_ENV_FILE": str(env_file)}},
    }
    return {**asyncio.run(_run_on_pool(cases)), "root": bare_environment}


async def _run_on_pool(cases: dict[str, dict]) -> dict:
    """A registry-watch deployment per case (its job variables) on a process pool, a run of each, all executed by
    one process worker; case -> the finished run."""
    from draftsync.flows.watch import watch
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    runs = {}
    async with get_client() as client:
        await client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
        flow_id = await client.create_flow(watch)
        for case, job_variables in cases.items():
            deployment_id = await client.create_deployment(
                flow_id=flow_id,
                name=f"watch-{case}",
                entrypoint="draftsync/flows/watch.py:watch",
                work_pool_name=POOL,
                job_variables=job_variables,
                parameters={"dispatch": "event"},  # as prefect.yaml's registry-watch: the ledger is used too
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPOSITORY)}}],
            )
            runs[case] = (await client.create_flow_run_from_deployment(deployment_id)).id
    async with ProcessWorker(work_pool_name=POOL) as worker:
        await worker.get_and_submit_flow_runs()
    async with get_client() as client:
        return {case: await client.read_flow_run(run_id) for case, run_id in runs.items()}


@pytest.mark.slow
def test_a_pool_run_without_the_shared_settings_fails_at_its_start_naming_each(pool_runs):
    finished = pool_runs["without-settings"]
    message = finished.state.message or ""
    assert finished.state.is_failed(), (finished.state.type, message)
    assert f"flow run of registry-watch on work pool '{POOL}' lacks MLFLOW_TRACKING_URI" in message, message
    assert "DRAFTSYNC_MONITOR_DB_URL (unset: the monitor store would be sqlite:///" in message
    assert "DRAFTSYNC_ENV_FILE" in message and "`env` job variable" in message
    assert not (pool_runs["root"] / "work" / "monitor.db").exists()  # it failed before any work


@pytest.mark.slow
def test_a_pool_run_reads_its_settings_from_the_env_file_the_pool_names(pool_runs):
    finished, shared = pool_runs["with-env-file"], pool_runs["root"] / "shared"
    assert finished.state.is_completed(), (finished.state.type, finished.state.message)
    assert (shared / "mlflow.db").is_file() and (shared / "monitor.db").is_file()  # the file's, not the work dir's
    with sqlite3.connect(shared / "monitor.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "sync_jobs" in tables, tables


def test_a_run_without_a_pool_keeps_the_embedded_defaults(bare_environment):
    """The demo and `draftsync watch` run the flow in their own process: SQLite under the work dir is right there."""
    from draftsync.flows.watch import watch

    assert watch(dispatch="event") == {"targets": [], "resent": [], "released": []}
    assert (bare_environment / "work" / "monitor.db").is_file() and (bare_environment / "work" / "mlflow.db").is_file()
