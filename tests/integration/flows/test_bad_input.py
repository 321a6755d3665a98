"""Bad input stops a sync with one clear error, and nothing half-written reaches the registry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError


def _register(name: str, checkpoint: Path) -> int:
    from draftsync.tasks.registration import publish_target

    return publish_target(name, str(checkpoint), {"code": 0.5, "math": 0.5})


def test_unreachable_mlflow_is_one_clear_error_from_the_cli(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "DRAFTSYNC_"))}
    env["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:9"
    result = subprocess.run(
        [sys.executable, "-m", "draftsync.cli", "--workdir", str(tmp_path), "watch", "demo-llm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "http://127.0.0.1:9" in result.stderr and "not reachable" in result.stderr
    assert "fix:" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_broken_target_checkpoint_names_itself(tmp_path, built_targets, damage):
    from draftsync.speculative.targets import load_target

    broken = tmp_path / "target"
    shutil.copytree(built_targets[1], broken)
    if damage == "missing":
        shutil.rmtree(broken)
    else:
        (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(DraftsyncError) as error:
        load_target(broken)
    assert str(broken) in str(error.value)
    assert error.value.fix


def test_sync_of_a_corrupt_registered_target_registers_no_drafter(workdir, built_targets):
    from draftsync.flows.sync import sync
    from draftsync.tasks import context

    version = _register("broken-llm", built_targets[1])
    stored = context.registry().download("broken-llm", version)
    (stored / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(DraftsyncError, match="corrupt"):
        sync("broken-llm", version, "test")
    registry = context.registry()
    assert registry.drafter_for_target_version("broken-llm", version, validated_only=False) is None
    assert registry.alias_version("broken-llm-drafter", "production") is None


@pytest.mark.system  # make test-system
def test_a_dataset_larger_than_the_disk_budget_is_refused_before_a_byte_is_written(
    workdir, built_targets, monkeypatch, tmp_path
):
    """The shards' size is planned from the texts' and prompts' tokens at 8 x hidden + 5 bytes a token (EAGLE-3)."""
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.tasks import context
    from draftsync.tasks.dataset import build_dataset

    version = _register("roomless-llm", built_targets[1])
    monkeypatch.setenv("DRAFTSYNC_DISK_BUDGET_GB", "0.001")  # 1 MB; the test profile's dataset is several
    context.reset()
    offline = profile("test").model_copy(update={"hidden_states": "offline"})  # auto would train online
    with pytest.raises(DraftsyncError) as refused:
        sync("roomless-llm", version, offline)
    what = refused.value.what  # the plan, the sync's first step, refuses on its estimate
    assert "hidden_states stage needs" in what and "no dataset was written and no training started" in what
    assert f"at {8 * 128 + 5:,} bytes each" in what and "0.00093 GiB free" in what  # hidden 128; 1 MB
    estimated_gib = float(what.split("needs ")[1].split(" GiB")[0])
    assert "DRAFTSYNC_DISK_BUDGET_GB" in refused.value.fix and "training_texts" in refused.value.fix
    sync_dir = workdir / "syncs" / "roomless-llm"
    assert not sync_dir.exists() or not any(sync_dir.rglob("*")), "nothing was written"
    assert context.registry().drafter_for_target_version("roomless-llm", version, validated_only=False) is None

    # the dataset task checks the exact count (the texts tokenized) again before it writes
    stored = context.registry().download("roomless-llm", version)
    with pytest.raises(DraftsyncError) as exact:
        build_dataset.fn(str(stored), {"code": 1.0}, offline, str(tmp_path / "shards"))
    assert "DRAFTSYNC_DISK_BUDGET_GB allows 0.001 GB" in exact.value.what and "nothing was written" in exact.value.what
    planned = float(exact.value.what.split("needs up to ")[1].split(" GB")[0])
    assert 0.001 < planned <= estimated_gib * 1.074  # the exact count within the plan's estimate
    assert not (tmp_path / "shards").exists() or not any((tmp_path / "shards").rglob("*.safetensors"))

    # with room, the same sync's dataset lands within the plan
    monkeypatch.delenv("DRAFTSYNC_DISK_BUDGET_GB")
    context.reset()
    small = profile("test").model_copy(update={"train_steps": 5, "checkpoint_every": 0, "keep_dataset": True})
    result = sync("roomless-llm", version, small)
    written = sum(f.stat().st_size for f in Path(result["dataset"]["path"]).rglob("*") if f.is_file())
    assert result["dataset"]["tokens"] * (8 * 128 + 5) <= planned * 1e9 * 1.01
    assert written <= planned * 1e9 * 1.05
    # the sync followed its plan (the whole batch in one micro-batch on this CPU) and recorded it on the drafter's run
    plan = result["plan"]
    assert plan["fits"] and plan["settings"]["target_devices"] == ["cpu"]
    assert plan["settings"]["batch_tokens"] == small.batch_size * small.seq_len
    assert result["dataset"]["tokens"] * (8 * 128 + 5) <= stage_of(plan, "hidden_states")["disk_gib"] * 1024**3
    from mlflow import MlflowClient

    uri = context.registry().tracking_uri
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = client.get_run(client.get_model_version(result["drafter_name"], str(result["drafter_version"])).run_id)
    assert run.data.params["plan.batch_tokens"] == str(small.batch_size * small.seq_len)
    assert run.data.params["plan.target_placement"] == "cpu"
    assert "plan.training.hours_estimate" in run.data.params


def test_a_drafter_for_another_vocabulary_is_refused_and_never_promoted(workdir, built_targets, tmp_path):
    """A drafter trained for a target with another vocabulary fails validation loudly; no alias moves."""
    from draftsync.profiles import validation_profile
    from draftsync.tasks.validation import validate_drafter

    from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

    other_target = build_tiny_target(tmp_path / "other-target")
    other_drafter = build_tiny_drafter(other_target, tmp_path / "other-drafter", gamma=2)
    with pytest.raises(DraftsyncError) as error:
        validate_drafter.fn(
            str(built_targets[1]), str(other_drafter), {"code": 0.5, "math": 0.5}, validation_profile("test")
        )
    assert "vocabulary" in str(error.value)
    assert "draftsync sync" in error.value.fix


def test_promote_refuses_a_drafter_that_failed_validation(workdir, built_targets, tmp_path):
    from draftsync.tasks import context

    from tests.support.tiny_models import build_tiny_drafter

    registry = context.registry()
    version = _register("gate-llm", built_targets[1])
    drafter_dir = build_tiny_drafter(built_targets[1], tmp_path / "drafter", gamma=2)
    drafter_version = registry.register_drafter(
        "gate-llm", version, drafter_dir, "eagle3", 2, {"acceptance_rate": 0.1}, validation_passed=False
    )
    with pytest.raises(DraftsyncError, match="has not passed validation"):
        registry.promote("gate-llm", drafter_version)
    assert registry.alias_version("gate-llm-drafter", "production") is None
    assert registry.aliases_of("gate-llm-drafter", drafter_version) == ["candidate"]


def test_an_error_keeps_its_fix_through_pickling():
    """Prefect pickles a failed run's exception; the copy must still name the thing and the fix."""
    import pickle

    from draftsync.errors import DraftsyncError

    copy = pickle.loads(pickle.dumps(DraftsyncError("store x is unavailable", "start the database")))
    assert (type(copy), copy.what, copy.fix) == (DraftsyncError, "store x is unavailable", "start the database")
    assert str(copy).endswith("fix: start the database")


def stage_of(plan: dict, name: str) -> dict:
    return next(stage for stage in plan["stages"] if stage["stage"] == name)


def test_the_speculators_trainer_on_a_worker_without_it_is_refused_naming_the_install_before_any_work(
    workdir, built_targets, monkeypatch
):
    """This worker has neither speculators nor vLLM on PATH: the plan, the sync's first step, refuses."""
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.speculative.train.speculators import INSTALL_FIX
    from draftsync.tasks import context

    version = _register("speculators-llm", built_targets[1])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no venv's bin: no vllm or speculators executables
    asked = profile("test").model_copy(update={"trainer": "speculators"})
    with pytest.raises(DraftsyncError) as refused:
        sync("speculators-llm", version, asked)
    assert "vllm, speculators not found on PATH" in refused.value.what and refused.value.fix == INSTALL_FIX
    sync_dir = workdir / "syncs" / "speculators-llm"
    assert not sync_dir.exists() or not any(sync_dir.rglob("*")), "nothing was written"
    assert context.registry().drafter_for_target_version("speculators-llm", version, validated_only=False) is None
