"""`draftsync targets register` against a real MLflow registry (SQLite) and the sync ledger: a checkpoint becomes the
next version of a target, tagged from its config and weights, with the sync a webhook would ask for; a checkpoint a
sync cannot use is refused with nothing registered; a version registered by hand gets its tags when it is synced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from typer.testing import CliRunner

pytestmark = pytest.mark.slow


def _register(workdir: Path, *args: str):
    from draftsync.cli.app import app

    return CliRunner().invoke(app, ["--workdir", str(workdir), "targets", "register", *args])


def _versions(name: str) -> list[int]:
    from draftsync.tasks import context

    return [info.version for info in context.registry().target_versions_after(name, 0)]


def _copy(target: Path, tmp_path: Path, name: str) -> Path:
    return Path(shutil.copytree(target, tmp_path / name))


def _edit_config(checkpoint: Path, **changes) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config.update(changes)
    (checkpoint / "config.json").write_text(json.dumps(config))


def test_register_tags_the_next_version_from_the_checkpoint_and_requests_its_sync(workdir, built_targets, tmp_path):
    from draftsync.registry.tags import TargetVersion
    from draftsync.registry.webhooks import RegistryChange
    from draftsync.tasks import context
    from draftsync.tasks.sync_requests import handle_registry_change, planned_method

    out = tmp_path / "registered.json"
    result = _register(
        workdir, str(built_targets[1]), "--name", "reg-llm", "--task-mix", "code=0.7,math=0.3", "--json", str(out)
    )
    assert result.exit_code == 0, result.output
    answer = json.loads(out.read_text())
    assert answer["version"] == 1 and answer["alias"] == "production"
    registry = context.registry()
    assert _versions("reg-llm") == [1] and registry.alias_version("reg-llm", "production") == 1

    target = TargetVersion.from_tags("reg-llm", 1, registry.version_tags("reg-llm", 1))
    assert target.family == "llama" and target.architecture == "LlamaForCausalLM"
    assert (target.hidden_size, target.num_hidden_layers, target.vocab_size) == (128, 4, 1024)
    assert target.task_mix() == pytest.approx({"code": 0.7, "math": 0.3})
    assert target.parameter_count() > 0
    features = target.features()
    assert features is not None and features["kv_heads"] == 4 and features["tied_embeddings"] is False
    assert answer["tags"] == dict(target.tags)
    assert "draftsync.family = llama" in result.output

    # the sync a webhook would ask for: the ledger holds it, and MLflow's delivery of the same version adds none
    method = planned_method()
    assert answer["sync"] == {
        "target_name": "reg-llm",
        "target_version": 1,
        "method": method,
        "requested": True,
        "event": "draftsync.target.version.created",
        "gpus": 1,  # a node of one GPU, the pool's default
    }
    job = context.sync_ledger().get("reg-llm", 1, method)
    assert job is not None and (job.status, job.source) == ("requested", "cli")
    delivered = RegistryChange(kind="version_created", model_name="reg-llm", version=1, tags=dict(target.tags))
    assert handle_registry_change(delivered, "delivery-1")["action"] == "sync already requested"
    assert len(context.sync_ledger().jobs("reg-llm")) == 1

    # the next checkpoint is the next version; --no-sync registers only
    again = _register(workdir, str(built_targets[2]), "--name", "reg-llm", "--task-mix", "prose=1", "--no-sync")
    assert again.exit_code == 0, again.output
    assert "sync not requested" in again.output
    assert _versions("reg-llm") == [1, 2] and registry.alias_version("reg-llm", "production") == 2
    assert context.sync_ledger().get("reg-llm", 2, method) is None


def test_register_with_the_transformers_flavor_logs_a_model_mlflow_loads_and_a_sync_reads(
    workdir, built_targets, tmp_path, monkeypatch
):
    """`--flavor transformers`: an MLflow 3 logged model of the checkpoint's own files, from a folder outside every
    model root (a path typed on the command line is the operator's intent)."""
    import mlflow.transformers
    from draftsync.tasks import context
    from draftsync.tasks.registration import fetch_target

    elsewhere = Path(shutil.copytree(built_targets[1], tmp_path / "elsewhere" / "ckpt"))
    monkeypatch.setenv("DRAFTSYNC_MODEL_ROOTS", str(tmp_path / "roots-elsewhere"))
    result = _register(
        workdir, str(elsewhere), "--name", "flavored-llm", "--task-mix", "code=1", "--flavor", "transformers"
    )
    assert result.exit_code == 0, result.output
    registry = context.registry()
    info = registry.version_info("flavored-llm", 1)
    assert info.model_id and info.source == f"models:/{info.model_id}"
    assert info.tags["draftsync.kind"] == "target" and info.tags["draftsync.family"] == "llama"

    parts = mlflow.transformers.load_model(info.source, return_type="components")
    assert type(parts["model"]).__name__ == "LlamaForCausalLM" and len(parts["tokenizer"]) == 1024
    fetched = fetch_target.fn("flavored-llm", 1)
    assert fetched.layout == "transformers" and fetched.lineage == {"draftsync.target.model_id": info.model_id}
    assert fetched.tags["draftsync.transformers.task"] == "text-generation"
    assert fetched.tags["draftsync.transformers.torch_dtype"] == "torch.float32"  # the checkpoint's own
    assert (Path(fetched.path) / "config.json").is_file() and (Path(fetched.path) / "tokenizer.json").is_file()

    refused = _register(workdir, str(elsewhere), "--name", "flavored-llm", "--task-mix", "code=1", "--flavor", "onnx")
    assert refused.exit_code != 0 and "--flavor 'onnx' is not known" in refused.exception.what
    assert _versions("flavored-llm") == [1]


def test_register_without_a_task_mix_says_how_to_give_it(workdir, built_targets):
    result = _register(workdir, str(built_targets[1]), "--name", "mixless-llm")
    assert result.exit_code != 0
    error = result.exception
    assert isinstance(error, DraftsyncError)
    assert "mixless-llm" in error.what and "no task mix" in error.what
    assert "--task-mix code=0.5,math=0.5" in error.fix and "normalised" in error.fix
    assert _versions("mixless-llm") == []


@pytest.mark.parametrize(
    ("mix", "problem"),
    [
        ("code=0.5,poetry=0.5", "unknown task 'poetry'"),
        ("code=0,math=1", "share of code ('0') is not a positive number"),
        ("code=-1", "not a positive number"),
        ("code=half", "not a positive number"),
        ("code=0.5,code=0.5", "given twice"),
    ],
)
def test_a_task_mix_that_is_not_usable_is_refused(mix, problem):
    from draftsync.cli.targets import parse_task_mix

    with pytest.raises(DraftsyncError) as error:
        parse_task_mix(mix, "some-llm")
    assert problem in error.value.what and "--task-mix" in error.value.fix


def test_shares_are_normalised():
    from draftsync.cli.targets import parse_task_mix

    assert parse_task_mix("math=1, code=3", "some-llm") == {"code": 0.75, "math": 0.25}


def _moe(checkpoint: Path) -> None:
    _edit_config(checkpoint, num_local_experts=8, num_experts_per_tok=2)


def _multimodal(checkpoint: Path) -> None:
    _edit_config(checkpoint, vision_config={"hidden_size": 64, "patch_size": 14})


def _more_layers_than_weights(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    _edit_config(checkpoint, num_hidden_layers=config["num_hidden_layers"] + 1)


def _wide_tokenizer(checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(vocab - len(tokenizer) + 8)])
    tokenizer.save_pretrained(checkpoint)


def _declared_fp8(checkpoint: Path) -> None:
    _edit_config(checkpoint, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})


def _missing(checkpoint: Path) -> None:
    shutil.rmtree(checkpoint)


@pytest.mark.parametrize(
    ("damage", "said", "fix"),
    [
        (_moe, "is a mixture-of-experts model (LlamaForCausalLM)", "dense model"),
        (_multimodal, "is a multimodal model (LlamaForCausalLM)", "text-only checkpoint"),
        (_more_layers_than_weights, "weights do not fit its config.json", "config.json that was saved"),
        (_wide_tokenizer, "but the model's vocabulary is 1024", "tokenizer the target was trained with"),
        (_missing, "does not exist", "Hugging Face checkpoint directory"),
        (
            _declared_fp8,
            "declares fp8 (8-bit) weights, but its safetensors hold only F32 tensors",
            "quantization_config",
        ),
    ],
    ids=["moe", "multimodal", "config-vs-weights", "tokenizer-vs-vocabulary", "missing", "quantization-vs-weights"],
)
def test_a_checkpoint_a_sync_cannot_use_is_refused_and_nothing_is_registered(
    workdir, built_targets, tmp_path, damage, said, fix
):
    from draftsync.tasks import context

    checkpoint = _copy(built_targets[1], tmp_path, "damaged")
    damage(checkpoint)
    result = _register(workdir, str(checkpoint), "--name", "bad-llm", "--task-mix", "code=1")
    error = result.exception
    assert isinstance(error, DraftsyncError), result.output
    assert str(checkpoint) in error.what and said in error.what
    assert "nothing was registered as bad-llm" in error.what
    assert fix in error.fix
    assert _versions("bad-llm") == []
    assert context.sync_ledger().jobs("bad-llm") == []


def _register_by_hand(workdir: Path, name: str, checkpoint: Path, tags: dict[str, str]) -> int:
    """What a model team does in MLflow without draftsync: a run with the checkpoint, a version of it, few tags."""
    from draftsync.tasks import context
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=context.registry().tracking_uri)
    experiment = client.create_experiment("by-hand", artifact_location=(workdir / "by-hand").as_uri())
    run = client.create_run(experiment)
    client.log_artifacts(run.info.run_id, str(checkpoint), "model")
    client.set_terminated(run.info.run_id)
    client.create_registered_model(name)
    version = client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id, tags=tags)
    return int(version.version)


def test_a_version_registered_by_hand_gets_its_checkpoint_tags_when_synced(workdir, built_targets):
    """The sync's fetch step tags what the checkpoint tells; a tag already there and the task mix are left alone."""
    from draftsync.profiles import profile
    from draftsync.registry.tags import HIDDEN_SIZE_TAG, TASK_MIX_TAG, TargetVersion
    from draftsync.tasks import context
    from draftsync.tasks.planning import plan_drafter
    from draftsync.tasks.registration import fetch_target

    version = _register_by_hand(
        workdir, "hand-llm", built_targets[1], {TASK_MIX_TAG: '{"code": 1.0}', HIDDEN_SIZE_TAG: "128"}
    )
    before = TargetVersion.from_tags("hand-llm", version, context.registry().version_tags("hand-llm", version))
    assert before.family is None and before.architecture is None
    with pytest.raises(DraftsyncError, match="draftsync.num_parameters is missing"):
        before.parameter_count()

    fetched = fetch_target.fn("hand-llm", version)
    stored = context.registry().version_tags("hand-llm", version)
    assert fetched.tags == stored
    after = TargetVersion.from_tags("hand-llm", version, stored)
    assert after.family == "llama" and after.architecture == "LlamaForCausalLM"
    assert (after.hidden_size, after.num_hidden_layers, after.vocab_size) == (128, 4, 1024)
    assert after.features() is not None and after.parameter_count() > 0
    assert after.task_mix() == {"code": 1.0}  # as given: never derived
    assert plan_drafter.fn("hand-llm", stored, profile("test")).advice.recommendation.method

    # a second fetch finds every tag there and writes nothing
    assert fetch_target.fn("hand-llm", version).tags == stored


def test_a_version_registered_by_hand_of_an_unsupported_family_stops_its_sync(workdir, built_targets, tmp_path):
    from draftsync.registry.tags import FAMILY_TAG
    from draftsync.tasks import context
    from draftsync.tasks.registration import fetch_target

    checkpoint = _copy(built_targets[1], tmp_path, "moe")
    _moe(checkpoint)
    version = _register_by_hand(workdir, "hand-moe", checkpoint, {})
    with pytest.raises(DraftsyncError, match="mixture-of-experts"):
        fetch_target.fn("hand-moe", version)
    assert FAMILY_TAG not in context.registry().version_tags("hand-moe", version)


def test_a_task_mix_whose_shares_overflow_is_refused_not_stored_as_zeros():
    from draftsync.cli.targets import parse_task_mix

    with pytest.raises(DraftsyncError, match="past a float's range"):
        parse_task_mix("code=1e308,math=1e308", "llm")
    assert parse_task_mix("code=3e300,math=1e300", "llm") == {"code": 0.75, "math": 0.25}


@pytest.mark.parametrize("alias", ["latest", "LATEST", "v3", "bad alias!"])
def test_an_alias_mlflow_would_refuse_is_refused_before_a_version_exists(workdir, built_targets, alias):
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    with pytest.raises(DraftsyncError, match=f"alias {alias!r} cannot be set in MLflow"):
        publish_target("alias-llm", str(built_targets[1]), {"code": 1.0}, alias=alias)
    assert context.registry().target_versions_after("alias-llm", 0) == []


def test_a_signed_delivery_for_a_version_mlflow_does_not_hold_is_ignored_and_records_nothing(workdir, built_targets):
    """The registry, not the payload, says what a version is: forged target tags start no sync."""
    from draftsync.registry.webhooks import RegistryChange
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.sync_requests import handle_registry_change

    publish_target("ghost-llm", str(built_targets[1]), {"code": 1.0})
    for version in (999_999_999, 10**30):
        forged = RegistryChange("version_created", "ghost-llm", version, tags={"draftsync.kind": "target"})
        answer = handle_registry_change(forged, f"delivery-{version}")
        assert answer["action"] == f"ignored: MLflow holds no version {version} of ghost-llm"
    moved = RegistryChange("alias_moved", "ghost-llm", 42, alias="production")
    assert handle_registry_change(moved, "delivery-alias")["action"].startswith("ignored: MLflow holds no version 42")
    assert context.sync_ledger().jobs("ghost-llm") == []  # status shows no sync that could never run


def test_a_task_mix_takes_the_recommend_commands_word_for_prose():
    from draftsync.cli.targets import parse_task_mix

    assert parse_task_mix("code=0.5,chat=0.5", "llm") == parse_task_mix("code=0.5,prose=0.5", "llm")


def test_a_version_whose_alias_cannot_be_set_is_taken_back(workdir, built_targets, monkeypatch):
    """All or nothing: when the alias fails after MLflow created the version (the server went away between the two
    calls, injected here), the version is deleted again and the error reaches the caller."""
    from draftsync.registry.model_registry import Registry
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    publish_target("half-llm", str(built_targets[1]), {"code": 1.0})

    def connection_lost(self, name, alias, version):
        raise ConnectionError("MLflow went away")

    monkeypatch.setattr(Registry, "set_target_alias", connection_lost)
    with pytest.raises(ConnectionError):
        publish_target("half-llm", str(built_targets[2]), {"code": 1.0})
    assert _versions("half-llm") == [1]
    assert context.registry().alias_version("half-llm", "production") == 1


@pytest.mark.parametrize("name", ["acme/llm", "llm:v2", "m" * 201, ".hidden"])
def test_a_name_draftsync_cannot_hold_is_refused_before_the_checkpoint_is_read(workdir, name, tmp_path):
    """The name is checked first: the checkpoint given does not even exist, and that is not what the error names."""
    result = _register(workdir, str(tmp_path / "absent"), "--name", name, "--task-mix", "code=1")
    assert result.exit_code != 0
    assert isinstance(result.exception, DraftsyncError) and "cannot be used" in result.exception.what
    assert "absent" not in str(result.exception)
