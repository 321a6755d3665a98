"""A worker killed (-9, with everything it started) at each stage of a sync, and MLflow stopped in the middle of one.

Real servers on loopback: `mlflow server`, `prefect server`, and `draftsync sync` as the worker process. After every
kill the registry holds at most one drafter for the target version, `production` points at the old drafter or the
new one and nothing else, and a new `production` always has the old one as `previous`. Each rerun takes the dead
run's ledger job over and resumes; the last one ends with exactly one drafter, every alias new.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from draftsync.serving.process import log_tail

from tests.e2e.system.fault_proxy import FaultProxy, KillRule, kill_process_tree
from tests.support.servers import mlflow_server, prefect_server
from tests.support.sync_profiles import tiny_sync_profile

TARGET = "crashy"
TRAIN_STEPS = 48
PROFILE = tiny_sync_profile("crash-test", train_steps=TRAIN_STEPS, warm_start=False, checkpoint_every=12)
RUN_TIMEOUT = 600


def draftsync_bin() -> str:
    return str(Path(sys.executable).with_name("draftsync"))


class Worker:
    """`draftsync sync crashy 2` as a subprocess, the way a Prefect worker runs a flow on its host."""

    def __init__(self, tmp_path: Path, tracking_uri: str, api_url: str, profile: Path, extra_env: dict | None = None):
        self.work = tmp_path / "work"
        self.logs = tmp_path / "worker-logs"
        self.logs.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "DRAFTSYNC_WORKDIR": str(self.work),
            "MLFLOW_TRACKING_URI": tracking_uri,
            "PREFECT_API_URL": api_url,
            **(extra_env or {}),
        }
        self.env.pop("DRAFTSYNC_MONITOR_DB_URL", None)
        self.argv = [draftsync_bin(), "sync", TARGET, "2", "--profile", str(profile)]
        self.runs = 0

    def start(self) -> tuple[subprocess.Popen, Path]:
        self.runs += 1
        log = self.logs / f"run-{self.runs}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(
                self.argv, env=self.env, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return process, log

    def run_to_end(self) -> tuple[int, str]:
        process, log = self.start()
        try:
            code = process.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_process_tree(process.pid)
            raise AssertionError(f"sync did not finish within {RUN_TIMEOUT} s:\n{log_tail(log, 60)}") from None
        return code, log.read_text(errors="replace")


def result_json(output: str) -> dict:
    """The sync's JSON result: the CLI prints it last, after Prefect's log lines."""
    start = output.rindex("\n{\n") + 1 if "\n{\n" in output else output.index("{")
    return json.loads(output[start : output.rindex("}") + 1])


def wait_until(what: str, check: Callable[[], bool], process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while not check():
        if process.poll() is not None:
            raise AssertionError(f"the worker ended (code {process.returncode}) before {what}:\n{log_tail(log, 60)}")
        if time.monotonic() > deadline:
            kill_process_tree(process.pid)
            raise AssertionError(f"{what}: not within {RUN_TIMEOUT} s:\n{log_tail(log, 60)}")
        time.sleep(0.05)


def publish(registry, targets: dict[int, Path], tmp_path: Path) -> int:
    """Target v1 with a production drafter (the old one), then target v2 with no drafter: what a sync starts from."""
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.targets import describe_target

    from tests.support.tiny_models import build_tiny_drafter

    for version, path in targets.items():
        facts = {**describe_target(path), "task_mix": {"code": 0.5, "prose": 0.5}}
        registered = registry.register_target(TARGET, path, target_tags(**facts))
        assert registered == version
        registry.set_target_alias(TARGET, "production", version)
        if version == 1:
            drafter_dir = build_tiny_drafter(path, tmp_path / "old-drafter", gamma=2)
            old = registry.register_drafter(TARGET, 1, drafter_dir, "eagle3", 2, {}, validation_passed=True)
            registry.promote(TARGET, old)
    return old


def drafters_for_v2(registry) -> list[int]:
    from draftsync.registry.model_registry import drafter_model_name
    from draftsync.registry.tags import TARGET_VERSION_TAG

    return [v.version for v in registry._versions(drafter_model_name(TARGET)) if v.tags.get(TARGET_VERSION_TAG) == "2"]


def aliases(registry) -> dict[str, int | None]:
    return registry.alias_snapshot(TARGET)


def checkpoint_written(work: Path) -> bool:
    return any((work / "syncs" / TARGET).glob("v2-eagle3/checkpoints/*/trainer-state.pt"))


def dataset_started(work: Path) -> bool:
    return any((work / "syncs" / TARGET).glob("v2-eagle3/dataset-*"))


# Each stage: what it is, and either a file the worker writes there or a registry request the proxy kills it at.
KILL_POINTS: list[tuple[str, Callable[[Path], bool] | KillRule]] = [
    ("dataset build", dataset_started),
    ("training, after its first checkpoint", checkpoint_written),
    ("registration: uploading the checkpoint", KillRule("PUT", "/mlflow-artifacts/artifacts/")),
    ("registration: version created, answer lost", KillRule("POST", "/model-versions/create", when="after")),
    ("validation recorded half-way", KillRule("POST", "/model-versions/set-tag", ("draftsync.gate.",), nth=3)),
    ("alias flip: before `production` moves", KillRule("POST", "/registered-models/alias", ("production",))),
    (
        "alias flip: after `production` moved",
        KillRule("POST", "/registered-models/alias", ("production",), when="after"),
    ),
]


@pytest.mark.slow
@pytest.mark.system
def test_a_sync_killed_at_every_stage_converges_to_one_drafter_with_whole_aliases(tmp_path, built_targets, monkeypatch):
    from draftsync.monitors.store import Store
    from draftsync.registry.model_registry import Registry, drafter_model_name
    from draftsync.registry.tags import SYNC_KEY_TAG, VALIDATION_STATUS_TAG

    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", f"{tmp_path},{built_targets[1].parent}")
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    with (
        prefect_server(tmp_path) as (api_url, _),
        mlflow_server(tmp_path) as mlflow,
        FaultProxy(mlflow.url).running() as proxy,
    ):
        registry = Registry(mlflow.url, tmp_path / "test-client")
        old = publish(registry, built_targets, tmp_path)
        worker = Worker(tmp_path, proxy.url, api_url, profile)
        observed = []
        for stage, point in KILL_POINTS:
            process, log = worker.start()
            if isinstance(point, KillRule):
                rule = proxy.arm(point, process.pid)
                wait_until(f"the kill at {stage}", rule.fired.is_set, process, log)
            else:
                wait_until(f"the {stage}", lambda point=point: point(worker.work), process, log)
                kill_process_tree(process.pid)
            assert process.wait(timeout=60) == -9, f"{stage}: the worker was not killed:\n{log_tail(log, 40)}"

            versions, now = drafters_for_v2(registry), aliases(registry)
            observed.append((stage, versions, now))
            assert len(versions) <= 1, f"{stage}: more than one drafter registered for v2: {versions}"
            assert now["production"] in (old, *versions), f"{stage}: production points at {now['production']}"
            if now["production"] != old:
                assert now["previous"] == old, f"{stage}: a new production without the old one as previous: {now}"

        assert [len(v) for _, v, _ in observed] == [0, 0, 0, 1, 1, 1, 1], observed
        new = observed[-1][1][0]
        assert [a["production"] for _, _, a in observed] == [old] * 6 + [new], observed

        code, output = worker.run_to_end()
        assert code == 0, output[-6000:]
        result = result_json(output)
        assert result["drafter_version"] == new and result["passed"] and result["validation"]["promoted"]
        # the dataset and the training were not redone: the last run resumed training at its final checkpoint
        assert result["training"]["resumed_from_step"] == TRAIN_STEPS

        assert drafters_for_v2(registry) == [new]
        assert aliases(registry) == {"candidate": None, "production": new, "previous": old}
        tags = registry.version_tags(drafter_model_name(TARGET), new)
        assert tags[VALIDATION_STATUS_TAG] == "passed"
        assert {k for k in tags if k.startswith("draftsync.gate.")} == {
            f"draftsync.gate.{g['name']}" for g in result["validation"]["gates"]
        }

        # the run killed while uploading was closed as KILLED by the rerun, and no run is left RUNNING
        from mlflow import MlflowClient

        runs = MlflowClient(mlflow.url).search_runs(
            [registry._experiment()], filter_string=f"tags.`{SYNC_KEY_TAG}` = '{TARGET}:2:eagle3'"
        )
        statuses = sorted(r.info.status for r in runs)
        assert statuses == ["FINISHED", "KILLED"], statuses

        job = Store(f"sqlite:///{worker.work / 'monitor.db'}").ledger.get(TARGET, 2, "eagle3")
        assert (job.status, job.drafter_version, job.attempts) == ("succeeded", new, len(KILL_POINTS) + 1)


@pytest.mark.slow
@pytest.mark.system
def test_mlflow_stopped_mid_sync_fails_clearly_then_the_rerun_resumes_once_it_is_back(
    tmp_path, built_targets, monkeypatch
):
    """The server goes down while the worker trains: registration retries with backoff, then the sync fails naming
    MLflow and the fix, with nothing registered; with the server back, the rerun registers exactly one drafter
    without training again."""
    from draftsync.monitors.store import Store
    from draftsync.registry.model_registry import Registry

    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", f"{tmp_path},{built_targets[1].parent}")
    profile = tmp_path / "profile.yaml"
    profile.write_text(PROFILE)
    quick_retries = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    }
    with prefect_server(tmp_path) as (api_url, _), mlflow_server(tmp_path) as mlflow:
        registry = Registry(mlflow.url, tmp_path / "test-client")
        old = publish(registry, built_targets, tmp_path)
        worker = Worker(tmp_path, mlflow.url, api_url, profile, quick_retries)

        process, log = worker.start()
        wait_until("the first training checkpoint", lambda: checkpoint_written(worker.work), process, log)
        mlflow.process.stop()
        code = process.wait(timeout=RUN_TIMEOUT)
        output = log.read_text(errors="replace")
        assert code == 2, output[-6000:]
        error_line, fix_line = output.strip().splitlines()[-2:]
        assert error_line.startswith(f"error: MLflow at {mlflow.url} could not be reached"), output[-3000:]
        assert fix_line.strip().startswith("fix: start the tracking server again"), fix_line
        # backoff at two levels: MLflow's client retried each call twice, and the task ran three times (2 retries)
        assert output.count("Retrying (Retry(") == 2 * 3, output[-6000:]

        mlflow.process.start()
        mlflow.process.wait_healthy(120, health_path="/health")
        assert drafters_for_v2(registry) == [], "the failed registration left a drafter version behind"
        assert aliases(registry)["production"] == old
        ledger = Store(f"sqlite:///{worker.work / 'monitor.db'}").ledger
        failed = ledger.get(TARGET, 2, "eagle3")
        assert failed.status == "failed" and "could not be reached" in failed.detail

        code, output = worker.run_to_end()
        assert code == 0, output[-6000:]
        result = result_json(output)
        assert result["training"]["resumed_from_step"] == TRAIN_STEPS
        assert drafters_for_v2(registry) == [result["drafter_version"]]
        assert aliases(registry) == {"candidate": None, "production": result["drafter_version"], "previous": old}
        assert ledger.get(TARGET, 2, "eagle3").status == "succeeded"
