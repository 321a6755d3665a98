"""Targets as MLflow users register them: the transformers flavor with its weights and by reference to a hub
repository, and sources written `runs:/...`, `models:/name/version` or `models:/m-...`. Each is logged with MLflow's
own `mlflow.transformers.log_model` against a real MLflow (a server and the SQLite store) and synced by the real flow;
a by-reference target's weights come from a Hugging Face cache laid out as huggingface_hub lays it out. The hub
itself is a loopback stand-in that answers the one call MLflow makes when it logs by reference (the commit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError

from tests.support.http_stub import HttpStub
from tests.support.servers import mlflow_server, serve_asgi_in_thread
from tests.support.sync_profiles import tiny_sync_profile

REPO = "acme/tiny-chat"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
MIX = json.dumps({"code": 0.5, "math": 0.5})


def _tiny_profile(tmp_path: Path):
    """The smallest sync that trains, registers and runs every gate (tests/support/sync_profiles.py)."""
    from draftsync.profiles import profile

    path = tmp_path / "tiny-profile.yaml"
    path.write_text(tiny_sync_profile("layouts"))
    return profile(str(path))


def _pipeline_parts(checkpoint: Path, name_or_path: str | None = None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    if name_or_path is not None:  # what from_pretrained(REPO) would have set
        model.name_or_path = model.config.name_or_path = name_or_path
        tokenizer.name_or_path = name_or_path
    return {"model": model, "tokenizer": tokenizer}


def _log_transformers(tracking_uri: str, name: str, parts: dict, **options):
    """What a model team runs: mlflow.transformers.log_model with a registered model name (requirements given,
    so MLflow does not load the model again in a subprocess to infer them)."""
    import mlflow
    import mlflow.transformers

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    return mlflow.transformers.log_model(
        parts,
        name="model",
        task="text-generation",
        registered_model_name=name,
        pip_requirements=["transformers", "torch"],
        **options,
    )


def _tag_as_target(tracking_uri: str, name: str, version: int) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    client.set_model_version_tag(name, str(version), "draftsync.kind", "target")
    client.set_model_version_tag(name, str(version), "draftsync.task_mix", MIX)


def _hub_cache(root: Path, checkpoint: Path, commit: str = COMMIT) -> Path:
    """`checkpoint` placed in a Hugging Face cache as huggingface_hub lays it out (refs/main -> the commit)."""
    repo = root / "hub" / ("models--" + REPO.replace("/", "--"))
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


@pytest.fixture
def hub():
    """A loopback stand-in for the hub: MLflow asks it for the repository's commit when it logs by reference, and
    for a model card and a file list (answered 404: MLflow logs without them). No request leaves the machine."""

    def answer(request):
        if request.path == f"/api/models/{REPO}":
            return 200, "application/json", json.dumps({"id": REPO, "sha": COMMIT, "siblings": []})
        return 404, "application/json", json.dumps({"error": "not found"})

    with HttpStub(answer) as stub:
        yield stub


def log_by_reference_here(tracking_uri: str, name: str, checkpoint: str) -> int:
    """Run in a process whose huggingface_hub reads HF_ENDPOINT (the stand-in) at import, as every hub call does."""
    info = _log_transformers(tracking_uri, name, _pipeline_parts(Path(checkpoint), REPO), save_pretrained=False)
    return int(info.registered_model_version)


@pytest.fixture(autouse=True)
def fluent_mlflow_uris():
    """mlflow.transformers.log_model works through MLflow's process-wide URIs, globals that it also exports as
    MLFLOW_TRACKING_URI and MLFLOW_REGISTRY_URI: unset the globals after each test and put the variables back, so
    no later test talks to this test's (stopped) server."""
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    yield
    import mlflow

    mlflow.set_tracking_uri(None)
    mlflow.set_registry_uri(None)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _log_by_reference(tracking_uri: str, name: str, checkpoint: Path, hub) -> int:
    code = "import sys; from tests.integration.registry.test_target_layouts import log_by_reference_here as log; "
    code += "print(log(*sys.argv[1:]))"
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
    logged = subprocess.run(
        [sys.executable, "-c", code, tracking_uri, name, str(checkpoint)],
        cwd=Path(__file__).resolve().parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert logged.returncode == 0, logged.stderr[-3000:]
    assert "huggingface.co" not in logged.stderr, "a hub request went past the stand-in"
    return int(logged.stdout.strip().splitlines()[-1])


# --- layouts, read ---------------------------------------------------------------------------------------------
@pytest.mark.system  # a whole sync: make test-system
def test_a_target_logged_with_the_transformers_flavor_syncs_from_its_webhook_against_an_mlflow_server(
    workdir, built_targets, monkeypatch, tmp_path
):
    """MLflow's webhook reports the new version, the receiver asks for one sync, the sync reads the flavor's layout,
    and the drafter is registered linked to the target's logged model."""
    from draftsync.flows.sync import sync
    from draftsync.receiver.app import app_from_settings
    from draftsync.registry.webhooks import create_or_update_webhook
    from draftsync.tasks import context
    from mlflow import MlflowClient

    secret = "s" * 40
    with mlflow_server(tmp_path / "mlflow") as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        monkeypatch.setenv("DRAFTSYNC_WEBHOOK_SECRET", secret)
        monkeypatch.setenv("DRAFTSYNC_TARGETS", "hf-chat")  # its versions are targets, tagged or not
        context.reset()
        with serve_asgi_in_thread(app_from_settings()) as receiver:
            create_or_update_webhook(server.url, "draftsync", f"{receiver}/mlflow/webhook", secret)
            info = _log_transformers(server.url, "hf-chat", _pipeline_parts(built_targets[1]))
            version = int(info.registered_model_version)
            client = MlflowClient(tracking_uri=server.url, registry_uri=server.url)  # no task-mix tag: as logged
            ledger = context.sync_ledger()
            deadline = time.monotonic() + 60
            while ledger.get("hf-chat", version, "eagle3") is None and time.monotonic() < deadline:
                time.sleep(0.2)
        requested = ledger.get("hf-chat", version, "eagle3")
        assert requested is not None and requested.source == "webhook", f"no sync request; log {server.log_path}"

        # what the drafter-sync deployment runs on the request's event
        result = sync("hf-chat", version, _tiny_profile(tmp_path), reason="webhook")

        registry = context.registry()
        target_info = registry.version_info("hf-chat", version)
        assert target_info.source == f"models:/{info.model_id}" and target_info.model_id == info.model_id
        target_tags = registry.version_tags("hf-chat", version)
        assert target_tags["draftsync.checkpoint.layout"] == "transformers"
        assert target_tags["draftsync.transformers.task"] == "text-generation"
        assert target_tags["draftsync.transformers.version"] == __import__("transformers").__version__
        assert target_tags["draftsync.family"] == "llama" and target_tags["draftsync.vocab_size"] == "1024"

        drafter = registry.version_info("hf-chat-drafter", result["drafter_version"])
        assert drafter.tags["draftsync.target.version"] == str(version)
        assert drafter.tags["draftsync.target.model_id"] == info.model_id
        assert drafter.tags["draftsync.validation.status"] == "passed" and result["passed"]
        described = client.get_model_version("hf-chat-drafter", str(result["drafter_version"])).description
        assert info.model_id in described and "hf-chat version 1" in described
        # a target that declares no task mix is synced for the profile's, and its drafter says which and why
        assert json.loads(drafter.tags["draftsync.trained.task_mix"]) == pytest.approx(
            {"code": 1 / 3, "math": 1 / 3, "prose": 1 / 3}
        )
        why = "the sync profile's default: the target declares no draftsync.task_mix tag"
        assert drafter.tags["draftsync.trained.task_mix_source"] == why
        assert f"Trained for the task mix code 0.33, math 0.33, prose 0.33: {why}" in described
        jobs = ledger.jobs("hf-chat")
        assert [(job.target_version, job.status, job.source) for job in jobs] == [(version, "succeeded", "webhook")]


@pytest.mark.system  # a whole sync: make test-system
def test_a_target_logged_by_reference_syncs_from_the_workers_hugging_face_cache(
    workdir, built_targets, hub, monkeypatch, tmp_path
):
    from draftsync.flows.sync import sync
    from draftsync.tasks import context

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    snapshot = _hub_cache(tmp_path / "hf-home", built_targets[1])
    tracking = context.registry().tracking_uri
    version = _log_by_reference(tracking, "ref-chat", built_targets[1], hub)
    _tag_as_target(tracking, "ref-chat", version)
    registry = context.registry()
    stored = registry.version_info("ref-chat", version)
    downloaded = Path(workdir) / "mlartifacts" / "downloads" / "ref-chat" / str(version)

    result = sync("ref-chat", version, _tiny_profile(tmp_path))

    weights = list(downloaded.rglob("*.safetensors"))
    assert weights and all(file.resolve().is_relative_to(snapshot) for file in weights), "linked, not copied"
    target_tags = registry.version_tags("ref-chat", version)
    assert target_tags["draftsync.checkpoint.layout"] == "transformers-by-reference"
    assert target_tags["draftsync.source_model.name"] == REPO
    assert target_tags["draftsync.source_model.revision"] == COMMIT
    drafter = registry.version_tags("ref-chat-drafter", result["drafter_version"])
    assert drafter["draftsync.target.revision"] == COMMIT
    assert drafter["draftsync.target.model_id"] == stored.model_id and stored.model_id
    assert drafter["draftsync.validation.status"] == "passed" and result["passed"]


@pytest.mark.slow
def test_sources_written_runs_and_models_name_version_read_as_the_checkpoint(workdir, built_targets):
    """A version made from `runs:/<run>/<path>` or from another version's `models:/<name>/<version>`."""
    from draftsync.tasks import context
    from draftsync.tasks.registration import fetch_target
    from mlflow import MlflowClient

    tracking = context.registry().tracking_uri
    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    experiment = client.create_experiment("by-hand", artifact_location=(Path(workdir) / "by-hand").as_uri())
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(built_targets[1]), "weights")
    client.create_registered_model("runs-llm")
    first = client.create_model_version("runs-llm", f"runs:/{run.info.run_id}/weights", run_id=run.info.run_id)
    second = client.create_model_version("runs-llm", "models:/runs-llm/1")
    import mlflow

    # another library in the worker's process set MLflow's process-wide registry: draftsync still reads its own
    mlflow.set_registry_uri(f"sqlite:///{Path(workdir) / 'another-registry.db'}")
    for version in (first.version, second.version):
        client.set_model_version_tag("runs-llm", version, "draftsync.task_mix", MIX)
        fetched = fetch_target.fn("runs-llm", int(version))
        assert (Path(fetched.path) / "config.json").is_file() and fetched.layout == "checkpoint"
        assert fetched.tags["draftsync.num_hidden_layers"] == "4"
        assert fetched.lineage == {}  # made from a run's files: the registered version is the whole link


# --- by reference: where the weights are looked for -------------------------------------------------------------
def test_a_local_dir_download_in_a_mirror_is_found_at_its_recorded_revision(built_targets, tmp_path, monkeypatch):
    from draftsync.registry.target_layouts import find_local_copy
    from huggingface_hub._local_folder import write_download_metadata

    mirror = tmp_path / "mirror"
    copy = Path(shutil.copytree(built_targets[1], mirror / REPO))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    monkeypatch.setenv("DRAFTSYNC_MODEL_MIRRORS", str(mirror))
    with pytest.raises(DraftsyncError) as unrecorded:
        find_local_copy(REPO, COMMIT, "target x v1")
    assert "an unrecorded revision" in unrecorded.value.what and str(copy) in unrecorded.value.what

    write_download_metadata(copy, "config.json", COMMIT, etag="e")
    assert find_local_copy(REPO, COMMIT, "target x v1") == copy.resolve()


# --- bad input ----------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_by_reference_target_whose_weights_are_not_on_the_worker_is_refused_naming_where_it_looked(
    workdir, built_targets, hub, monkeypatch, tmp_path
):
    from draftsync.tasks import context
    from draftsync.tasks.registration import fetch_target

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("DRAFTSYNC_MODEL_MIRRORS", str(tmp_path / "mirror"))
    tracking = context.registry().tracking_uri
    version = _log_by_reference(tracking, "ref-chat", built_targets[1], hub)
    _tag_as_target(tracking, "ref-chat", version)

    with pytest.raises(DraftsyncError) as missing:
        fetch_target.fn("ref-chat", version)
    what, fix = missing.value.what, missing.value.fix
    assert REPO in what and COMMIT in what and "no copy of it is on this worker" in what
    assert str(tmp_path / "hf-home" / "hub") in what and str(tmp_path / "mirror") in what
    assert "DRAFTSYNC_MODEL_MIRRORS" in fix and "DRAFTSYNC_HUB_DOWNLOADS=true" in fix
    downloads = Path(workdir) / "mlartifacts" / "downloads" / "ref-chat"
    assert not (downloads / str(version)).exists(), "a download whose layout cannot be read is not kept"
    assert context.registry().alias_version("ref-chat-drafter", "candidate") is None

    # the cache holds another commit of the same repository: both are named
    _hub_cache(tmp_path / "hf-home", built_targets[1], OTHER_COMMIT)
    with pytest.raises(DraftsyncError) as mismatch:
        fetch_target.fn("ref-chat", version)
    assert COMMIT in mismatch.value.what and OTHER_COMMIT in mismatch.value.what
    assert f"fetch revision {COMMIT}" in mismatch.value.fix

    # the right commit placed: the same version now reads
    _hub_cache(tmp_path / "hf-home", built_targets[1], COMMIT)
    assert fetch_target.fn("ref-chat", version).tags["draftsync.source_model.revision"] == COMMIT


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["sklearn", "python_function"])
def test_a_registered_model_of_another_flavor_is_refused_naming_the_flavor(workdir, flavor):
    import mlflow
    from draftsync.tasks import context
    from draftsync.tasks.registration import fetch_target

    tracking = context.registry().tracking_uri
    mlflow.set_tracking_uri(tracking)
    if flavor == "sklearn":
        import mlflow.sklearn
        from sklearn.linear_model import LinearRegression

        info = mlflow.sklearn.log_model(
            LinearRegression().fit([[0.0], [1.0]], [0.0, 1.0]), name="model", registered_model_name="odd-model"
        )
    else:

        class Echo(mlflow.pyfunc.PythonModel):
            def predict(self, context, model_input):
                return model_input

        info = mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name="odd-model")
    version = int(info.registered_model_version)
    _tag_as_target(tracking, "odd-model", version)
    with pytest.raises(DraftsyncError) as refused:
        fetch_target.fn("odd-model", version)
    assert "is an MLflow model of flavor" in refused.value.what and flavor in refused.value.what
    assert "not a transformers checkpoint" in refused.value.what
    assert "mlflow.transformers.log_model" in refused.value.fix


@pytest.mark.system  # a whole sync: make test-system
def test_the_terminal_gets_one_line_for_an_unreadable_target_and_the_traceback_with_debug(workdir):
    """`draftsync sync` of a version it cannot read: the error and its fix, no traceback, no retry of the download
    (it would only say the same); `--debug` shows the traceback."""
    import mlflow
    import mlflow.pyfunc
    from draftsync.tasks import context

    tracking = context.registry().tracking_uri
    mlflow.set_tracking_uri(tracking)

    class Echo(mlflow.pyfunc.PythonModel):
        def predict(self, context, model_input):
            return model_input

    info = mlflow.pyfunc.log_model(name="model", python_model=Echo(), registered_model_name="odd-model")
    _tag_as_target(tracking, "odd-model", int(info.registered_model_version))
    command = [str(Path(sys.executable).with_name("draftsync")), "--workdir", str(workdir)]
    sync = ["sync", "odd-model", str(info.registered_model_version), "--profile", "test"]
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "INFO"}
    quiet = subprocess.run(command + sync, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 2, quiet.stderr
    assert "is an MLflow model of flavor python_function" in quiet.stderr
    assert "Traceback" not in quiet.stderr and "Retry 1/2" not in quiet.stderr, quiet.stderr
    # said once, as error and fix: Prefect's own lines about the failed task, flow and states stay in its log
    assert quiet.stderr.count("is an MLflow model of flavor python_function") == 1, quiet.stderr
    said = [line for line in quiet.stderr.splitlines() if "python_function" in line or line.startswith("  fix:")]
    assert said[0].startswith("error: ") and said[1].startswith("  fix: "), quiet.stderr
    loud = subprocess.run(command[:1] + ["--debug"] + command[1:] + sync, env=env, capture_output=True, text=True)
    assert loud.returncode == 2 and "Traceback" in loud.stderr
