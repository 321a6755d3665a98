"""Model paths are confined to the configured roots, and vLLM never runs a checkpoint's own code unless configured.

A target or drafter directory that enters from outside the registry (a registration, the reference server's
arguments, a deployment's vLLM launch, the vLLM evaluation backend) is resolved with symlinks and `..` followed and
refused, naming the path, where it resolves, the roots and the fix, when that lies outside the work dir and every
DRAFTSYNC_MODEL_ROOTS entry. Registry downloads land under the work dir and pass.

`--trust-remote-code` appears only when DRAFTSYNC_TRUST_REMOTE_CODE is set, and a deployments file cannot add it."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from draftsync.errors import DraftsyncError
from draftsync.model_paths import confined_model_path

ROOTS = "DRAFTSYNC_MODEL_ROOTS"
TRUST = "DRAFTSYNC_TRUST_REMOTE_CODE"
TARGET = "roots-llm"
MIX = {"code": 0.5, "math": 0.5}


@pytest.fixture
def places(tmp_path, monkeypatch) -> SimpleNamespace:
    """A work dir, one configured root and a folder outside both (with a look-alike sibling of the root)."""
    work, root, outside, sibling = (tmp_path / name for name in ("work", "models", "outside", "models-private"))
    for folder in (work, root / "target", outside / "target", sibling / "target"):
        folder.mkdir(parents=True)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(work))
    monkeypatch.setenv(ROOTS, str(root))
    return SimpleNamespace(work=work, root=root, outside=outside, sibling=sibling)


def assert_refusal_names_everything(error: DraftsyncError, given: Path | str, resolved: Path, roots: list[Path]):
    """The message names the path as given, where it resolves and every root; the fix names the variable."""
    assert str(given) in error.what and "outside every model root" in error.what
    assert str(resolved) in error.what
    for root in roots:
        assert str(root) in error.what
    assert ROOTS in error.fix and str(resolved.parent) in error.fix


# ---- the check itself ---------------------------------------------------------------------------------------
def test_a_path_inside_a_root_passes_and_comes_back_resolved(places):
    inside = places.root / "target"
    assert confined_model_path(inside, "target checkpoint") == inside.resolve()
    assert confined_model_path(places.work / "mlartifacts" / "downloads" / "t" / "1", "x").is_relative_to(places.work)
    hop = places.root / "alias"  # a symlink whose target is inside a root is fine: what counts is where it leads
    hop.symlink_to(places.work, target_is_directory=True)
    assert confined_model_path(hop, "target checkpoint") == places.work.resolve()


def test_a_refusal_names_a_configured_root_that_is_not_a_folder(places, monkeypatch):
    """A misspelt DRAFTSYNC_MODEL_ROOTS entry read as a root that holds nothing; the refusal now says so."""
    typo = places.root.parent / "modles"
    monkeypatch.setenv(ROOTS, f"{places.root},{typo}")
    with pytest.raises(DraftsyncError) as refused:
        confined_model_path(places.outside / "target", "target checkpoint")
    assert f"of those, {typo} is not a folder here" in refused.value.what
    assert "spelling" in refused.value.fix
    monkeypatch.setenv(ROOTS, str(places.root))
    with pytest.raises(DraftsyncError) as refused:
        confined_model_path(places.outside / "target", "target checkpoint")
    assert "not a folder" not in refused.value.what


def test_a_symlink_inside_a_root_that_points_outside_is_refused(places):
    link = places.root / "escape"
    link.symlink_to(places.outside / "target", target_is_directory=True)
    with pytest.raises(DraftsyncError) as error:
        confined_model_path(link, "target checkpoint")
    assert_refusal_names_everything(
        error.value, link, (places.outside / "target").resolve(), [places.work.resolve(), places.root.resolve()]
    )
    assert error.value.what.startswith(f"target checkpoint {link} resolves to ")


def test_dot_dot_out_of_a_root_is_refused(places):
    climbing = f"{places.root}/../outside/target"
    with pytest.raises(DraftsyncError) as error:
        confined_model_path(climbing, "drafter checkpoint")
    assert_refusal_names_everything(
        error.value, climbing, (places.outside / "target").resolve(), [places.work.resolve(), places.root.resolve()]
    )


def test_a_sibling_whose_name_starts_like_a_root_is_outside(places):
    """`/x/models-private` is not inside `/x/models`: roots are compared by path parts, not by string prefix."""
    with pytest.raises(DraftsyncError, match="outside every model root"):
        confined_model_path(places.sibling / "target", "target checkpoint")


def test_the_default_root_is_the_work_dir_alone_and_the_variable_adds_more(places, monkeypatch):
    from draftsync.settings import Settings

    monkeypatch.delenv(ROOTS)
    assert Settings().model_root_paths == [places.work.resolve()]
    with pytest.raises(DraftsyncError):
        confined_model_path(places.root / "target", "target checkpoint")
    other = places.outside / "more"
    monkeypatch.setenv(ROOTS, f" {places.root} ,{other}{os.pathsep}{places.work}")
    assert Settings().model_root_paths == [places.work.resolve(), places.root.resolve(), other.resolve()]
    assert confined_model_path(places.root / "target", "target checkpoint") == (places.root / "target").resolve()


# ---- registration -------------------------------------------------------------------------------------------
def registry_state(registry, client, artifacts: Path) -> dict:
    """Everything a refused registration must leave alone: models, versions, aliases, runs and stored files."""
    experiment = client.get_experiment_by_name("draftsync")
    drafters = f"{TARGET}-drafter"
    return {
        "models": sorted(model.name for model in client.search_registered_models()),
        "targets": [info.version for info in registry.target_versions_after(TARGET, 0)],
        "drafters": [info.version for info in registry.target_versions_after(drafters, 0)],
        "aliases": registry.alias_snapshot(TARGET),
        "runs": len(client.search_runs([experiment.experiment_id], max_results=1000)),
        "files": sorted(str(path.relative_to(artifacts)) for path in artifacts.rglob("*") if path.is_file()),
    }


def test_registering_a_directory_outside_the_roots_is_refused_and_stores_nothing(
    workdir, tiny_target, tiny_drafter, tmp_path, monkeypatch
):
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.targets import describe_target
    from draftsync.tasks import context
    from mlflow import MlflowClient

    monkeypatch.delenv(ROOTS)  # the product default: the work dir is the only root
    inside_target, inside_drafter = workdir / "checkpoints" / "target", workdir / "checkpoints" / "drafter"
    shutil.copytree(tiny_target, inside_target)
    shutil.copytree(tiny_drafter, inside_drafter)
    outside_target, outside_drafter = tmp_path / "elsewhere" / "target", tmp_path / "elsewhere" / "drafter"
    shutil.copytree(tiny_target, outside_target)
    shutil.copytree(tiny_drafter, outside_drafter)
    escape = workdir / "checkpoints" / "escape"
    escape.symlink_to(outside_target, target_is_directory=True)

    registry = context.registry()
    tags = target_tags(**{**describe_target(inside_target), "task_mix": MIX})
    version = registry.register_target(TARGET, inside_target, tags)  # inside the work dir: accepted
    first = registry.register_drafter(TARGET, version, inside_drafter, "eagle3", 2, {}, validation_passed=True)
    registry.promote(TARGET, first)
    client = MlflowClient(tracking_uri=registry.tracking_uri, registry_uri=registry.tracking_uri)
    artifacts = context.settings().mlflow_artifacts_dir
    before = registry_state(registry, client, artifacts)
    assert before["targets"] == [version] and before["drafters"] == [first] and before["files"]

    refusals = [
        lambda: registry.register_target(TARGET, outside_target, tags),
        lambda: registry.register_target(TARGET, escape, tags),
        lambda: registry.register_target(f"{TARGET}-new", f"{workdir}/../elsewhere/target", tags),
        lambda: registry.register_drafter(
            TARGET,
            version,
            outside_drafter,
            "eagle3",
            2,
            {},
            validation_passed=True,
            sync_key=f"{TARGET}:{version}:eagle3",
        ),
    ]
    for register in refusals:
        with pytest.raises(DraftsyncError) as error:
            register()
        assert "outside every model root" in error.value.what and str(workdir.resolve()) in error.value.what
        assert ROOTS in error.value.fix
        assert registry_state(registry, client, artifacts) == before

    # What the registry hands back lands under the work dir and passes the same check.
    downloaded = registry.download(TARGET, version)
    assert confined_model_path(downloaded, "target checkpoint") == downloaded.resolve()


# ---- the reference server -----------------------------------------------------------------------------------
def test_the_reference_server_refuses_to_start_on_a_path_outside_the_roots(places, tiny_target, tiny_drafter):
    import sys

    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.reference_server import reference_server_command

    inside = places.root / "target"
    shutil.rmtree(inside)
    shutil.copytree(tiny_target, inside)
    escape = places.root / "drafter-link"
    escape.symlink_to(tiny_drafter, target_is_directory=True)

    # The command is refused before any process starts ...
    with pytest.raises(DraftsyncError, match="outside every model root"):
        reference_server_command(tiny_target, None, 0, "127.0.0.1", free_port(), "tiny")
    with pytest.raises(DraftsyncError, match=f"drafter checkpoint {escape} resolves to"):
        reference_server_command(inside, escape, 2, "127.0.0.1", free_port(), "tiny")

    # ... and the server itself, started by hand with the same arguments, exits before it reads them.
    for target, drafter, named in ((tiny_target, None, tiny_target), (inside, escape, escape)):
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "draftsync.serving.reference_server",
            "--target",
            str(target),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
        ]
        if drafter is not None:
            argv += ["--drafter", str(drafter), "--gamma", "2"]
        log = places.work / f"server-{port}.log"
        with ServerProcess(argv, "127.0.0.1", port, log) as server:
            with pytest.raises(DraftsyncError) as raised:
                server.wait_healthy(timeout=120)
        assert "exited with code 2" in raised.value.what
        text = log.read_text()
        assert f"{named}" in text and "outside every model root" in text and ROOTS in text
        assert "serving tiny" not in text


# ---- vLLM ---------------------------------------------------------------------------------------------------
def test_a_vllm_launch_is_refused_for_paths_outside_the_roots(places, monkeypatch):
    from draftsync.serving.deployment import ServingDeployment

    monkeypatch.delenv(TRUST, raising=False)
    deployment = ServingDeployment(name="chat", target_name="llama-chat", launch="vllm")
    inside, outside = places.root / "target", places.outside / "target"
    link = places.root / "drafter-link"
    link.symlink_to(outside, target_is_directory=True)
    for target, drafter in ((outside, None), (inside, outside), (inside, link), (f"{places.root}/../outside", None)):
        with pytest.raises(DraftsyncError, match="outside every model root") as error:
            deployment.vllm_launch(target, drafter, "eagle3", 3)
        assert ROOTS in error.value.fix
    launch = deployment.vllm_launch(inside, places.work, "eagle3", 3)
    assert launch.argv[2] == str(inside.resolve()) and launch.speculative_config["model"] == str(places.work.resolve())
    assert "--trust-remote-code" not in launch.argv


def test_trust_remote_code_reaches_vllm_only_when_the_setting_is_on(monkeypatch):
    from draftsync.serving.vllm_args import SpeculationSpec, render_vllm_command

    def argv(**options) -> list[str]:
        speculation = SpeculationSpec(method="eagle3", model="/d", num_speculative_tokens=2)
        return render_vllm_command("/t", port=9000, served_model_name="m", speculation=speculation, **options).argv

    monkeypatch.delenv(TRUST, raising=False)
    assert "--trust-remote-code" not in argv()
    assert "--trust-remote-code" not in argv(trust_remote_code=False)
    with pytest.raises(DraftsyncError) as error:
        argv(trust_remote_code=True)
    assert f"{TRUST}=true" in error.value.fix

    monkeypatch.setenv(TRUST, "true")
    assert argv().count("--trust-remote-code") == 1
    assert "--trust-remote-code" not in argv(trust_remote_code=False)


@pytest.mark.parametrize("setting", ["false", "true"])
@pytest.mark.parametrize(
    "extra",
    [
        ["--trust-remote-code"],
        ["--trust_remote_code"],
        ["--trust-remote-code=true"],
        ["--max-model-len", "512", "--trust-remote"],
    ],
)
def test_a_deployment_cannot_add_trust_remote_code_through_extra_arguments(tmp_path, monkeypatch, setting, extra):
    from draftsync.serving.deployment import load_deployments
    from draftsync.serving.vllm_args import SpeculationSpec, render_vllm_command

    monkeypatch.setenv(TRUST, setting)
    path = tmp_path / "deployments.yaml"
    path.write_text(
        textwrap.dedent(f"""
        deployments:
          - name: chat
            target_name: llama-chat
            launch: vllm
            extra_vllm_args: {extra!r}
    """)
    )
    with pytest.raises(DraftsyncError) as error:
        load_deployments(path)
    assert str(path) in error.value.what and "'chat'" in error.value.what and "extra_vllm_args" in error.value.what
    assert TRUST in error.value.fix
    with pytest.raises(DraftsyncError, match="run Python code shipped inside the checkpoint"):
        speculation = SpeculationSpec(method="eagle3", num_speculative_tokens=2)
        render_vllm_command("/t", port=9000, served_model_name="m", speculation=speculation, extra_args=extra)


def test_the_vllm_evaluation_backend_gets_trust_remote_code_only_from_the_setting(
    tiny_target, tiny_drafter, tmp_path, monkeypatch
):
    from draftsync.serving.vllm_evaluation import VllmBackend

    monkeypatch.delenv(TRUST, raising=False)
    backend = VllmBackend(tiny_target, tiny_drafter, log_dir=tmp_path)
    assert "--trust-remote-code" not in backend.launch(2, 9000).argv
    assert "--trust-remote-code" not in backend.launch(0, 9000).argv

    monkeypatch.setenv(TRUST, "true")
    assert backend.launch(2, 9000).argv.count("--trust-remote-code") == 1


def test_the_vllm_evaluation_backend_refuses_paths_outside_the_roots(places, tiny_target, tiny_drafter, tmp_path):
    from draftsync.serving.vllm_evaluation import VllmBackend

    inside = places.root / "target"
    shutil.rmtree(inside)
    shutil.copytree(tiny_target, inside)
    for target, drafter in ((tiny_target, None), (inside, tiny_drafter)):
        with pytest.raises(DraftsyncError, match="outside every model root") as error:
            VllmBackend(target, drafter, log_dir=tmp_path)
        assert str(drafter or target) in error.value.what
