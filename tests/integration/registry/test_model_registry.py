"""The registry against a real MLflow on sqlite in a temp dir (one store per module: migrations are slow)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import numpy as np
import pytest
from draftsync.errors import DraftsyncError
from draftsync.registry.model_registry import CANDIDATE, PREVIOUS, PRODUCTION, Registry, drafter_model_name
from draftsync.registry.tags import target_tags
from safetensors.numpy import save_file


def make_checkpoint(directory: Path, hidden: int = 8, layers: int = 2, vocab: int = 32, seed: int = 0) -> Path:
    directory.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
    }
    (directory / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    save_file(
        {
            "embed.weight": rng.standard_normal((vocab, hidden)).astype(np.float32),
            "norm.weight": np.ones(hidden, np.float32),
        },
        str(directory / "model.safetensors"),
    )
    return directory


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Registry:
    root = tmp_path_factory.mktemp("mlflow")
    return Registry(f"sqlite:///{root / 'mlflow.db'}", root / "artifacts")


@pytest.fixture()
def target_dir(tmp_path) -> Path:
    return make_checkpoint(tmp_path / "target")


def tags_for(task_mix: dict[str, float]) -> dict[str, str]:
    return target_tags(
        architecture="LlamaForCausalLM",
        hidden_size=8,
        num_layers=2,
        vocab_size=32,
        parameter_count=264,
        task_mix=task_mix,
    )


def register_two_targets(registry: Registry, name: str, target_dir: Path) -> tuple[int, int]:
    tags = tags_for({"code": 0.5, "math": 0.5})
    return registry.register_target(name, target_dir, tags), registry.register_target(name, target_dir, tags)


def test_target_tags_are_strings_with_the_task_mix_as_json():
    tags = target_tags(
        architecture="LlamaForCausalLM",
        hidden_size=8,
        num_layers=2,
        vocab_size=32,
        parameter_count=264,
        task_mix={"math": 0.3, "code": 0.7},
    )
    assert tags == {
        "draftsync.task_mix": '{"code": 0.7, "math": 0.3}',
        "draftsync.architecture": "LlamaForCausalLM",
        "draftsync.hidden_size": "8",
        "draftsync.num_hidden_layers": "2",
        "draftsync.vocab_size": "32",
        "draftsync.num_parameters": "264",
    }


def test_register_target_stores_artifacts_under_artifacts_dir_and_tags_the_version(registry, target_dir):
    version = registry.register_target("tgt-a", target_dir, tags_for({"code": 1.0}))
    info = registry.version_info("tgt-a", version)
    assert info.tags["draftsync.kind"] == "target"
    assert info.tags["draftsync.vocab_size"] == "32"
    assert info.source.startswith(registry.artifacts_dir.as_uri())
    local = registry.download("tgt-a", version)
    assert local.is_relative_to(registry.artifacts_dir / "downloads")
    assert (local / "model.safetensors").read_bytes() == (target_dir / "model.safetensors").read_bytes()
    assert registry.download("tgt-a", version) == local  # cached


def test_register_target_names_missing_tags_and_registers_nothing(registry, target_dir):
    tags = tags_for({"code": 1.0})
    del tags["draftsync.vocab_size"], tags["draftsync.num_parameters"]
    with pytest.raises(DraftsyncError, match="draftsync.vocab_size, draftsync.num_parameters"):
        registry.register_target("tgt-missing", target_dir, tags)
    assert registry.target_versions_after("tgt-missing", 0) == []


def test_register_target_rejects_a_directory_without_a_checkpoint(registry, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftsyncError, match="no config.json"):
        registry.register_target("tgt-empty", tmp_path / "empty", {})


def test_target_versions_after_watermark_are_ascending_with_aliases(registry, target_dir):
    first, second = register_two_targets(registry, "tgt-b", target_dir)
    third = registry.register_target("tgt-b", target_dir, tags_for({"code": 1.0}))
    registry.set_target_alias("tgt-b", "production", second)
    newer = registry.target_versions_after("tgt-b", first)
    assert [info.version for info in newer] == [second, third]
    assert newer[0].aliases == ["production"]
    assert newer[1].aliases == []
    assert registry.target_versions_after("tgt-b", third) == []


def test_drafter_lineage_tags_metrics_and_candidate_alias(registry, target_dir, tmp_path):
    _, target_version = register_two_targets(registry, "tgt-c", target_dir)
    drafter_dir = make_checkpoint(tmp_path / "drafter", seed=1)
    version = registry.register_drafter(
        "tgt-c",
        target_version,
        drafter_dir,
        "eagle3",
        3,
        {"acceptance_rate": 0.8125},
        {"draftsync.best_gamma": "3"},
        validation_passed=True,
    )
    name = drafter_model_name("tgt-c")
    assert name == "tgt-c-drafter"
    tags = registry.version_tags(name, version)
    assert tags["draftsync.target.name"] == "tgt-c"
    assert tags["draftsync.target.version"] == str(target_version)
    assert tags["draftsync.method"] == "eagle3"
    assert tags["draftsync.gamma"] == "3"
    assert tags["draftsync.validation.passed"] == "true"
    assert tags["draftsync.validation.acceptance_rate"] == "0.8125"
    assert tags["draftsync.best_gamma"] == "3"
    assert registry.aliases_of(name, version) == [CANDIDATE]
    run = registry._client.get_run(registry.version_info(name, version).run_id)
    assert run.data.metrics == {"acceptance_rate": 0.8125}
    assert registry.drafter_for_target_version("tgt-c", target_version) == version
    assert registry.drafter_for_target_version("tgt-c", target_version - 1) is None


def test_register_drafter_with_the_same_sync_key_returns_the_existing_version(registry, target_dir, tmp_path):
    target_version = registry.register_target("tgt-d", target_dir, tags_for({"code": 1.0}))
    drafter_dir = make_checkpoint(tmp_path / "drafter")
    register = lambda key, method="eagle3": registry.register_drafter(  # noqa: E731
        "tgt-d", target_version, drafter_dir, method, 2, {}, validation_passed=True, sync_key=key
    )
    first = register("sync-1")
    assert register("sync-1") == first
    assert register("sync-2") != first
    assert register("sync-1", method="eagle") != first


def test_promote_flips_production_and_previous_and_clears_candidate(registry, target_dir, tmp_path):
    target_version = registry.register_target("tgt-e", target_dir, tags_for({"code": 1.0}))
    drafter_dir = make_checkpoint(tmp_path / "drafter")
    name = drafter_model_name("tgt-e")
    first = registry.register_drafter("tgt-e", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=True)
    registry.promote("tgt-e", first)
    assert registry.alias_version(name, PRODUCTION) == first
    assert registry.alias_version(name, PREVIOUS) is None
    assert registry.alias_version(name, CANDIDATE) is None

    second = registry.register_drafter("tgt-e", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=True)
    assert registry.alias_version(name, CANDIDATE) == second
    registry.promote("tgt-e", second)
    assert registry.aliases_of(name, second) == [PRODUCTION]
    assert registry.aliases_of(name, first) == [PREVIOUS]

    assert registry.rollback("tgt-e") == first
    assert registry.alias_version(name, PRODUCTION) == first
    assert registry.alias_version(name, PREVIOUS) == second


def test_promote_refuses_an_unvalidated_drafter_and_moves_no_alias(registry, target_dir, tmp_path):
    target_version = registry.register_target("tgt-f", target_dir, tags_for({"code": 1.0}))
    drafter_dir = make_checkpoint(tmp_path / "drafter")
    name = drafter_model_name("tgt-f")
    good = registry.register_drafter("tgt-f", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=True)
    registry.promote("tgt-f", good)
    bad = registry.register_drafter("tgt-f", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=False)
    with pytest.raises(DraftsyncError, match="has not passed validation"):
        registry.promote("tgt-f", bad)
    assert registry.alias_version(name, PRODUCTION) == good
    assert registry.alias_version(name, CANDIDATE) == bad
    assert registry.drafter_for_target_version("tgt-f", target_version) == good
    assert registry.drafter_for_target_version("tgt-f", target_version, validated_only=False) == bad


def test_unknown_versions_and_aliases(registry):
    assert registry.alias_version("never-registered", PRODUCTION) is None
    with pytest.raises(DraftsyncError, match="has no version 7"):
        registry.version_tags("never-registered", 7)


def test_names_that_would_break_registry_filters_are_refused(registry):
    with pytest.raises(DraftsyncError, match="letters, digits"):
        registry.target_versions_after("x' or name='y", 0)


def test_ping_succeeds_on_sqlite(registry):
    registry.ping()


def test_ping_fails_fast_with_the_fix_when_mlflow_is_unreachable():
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DraftsyncError) as raised:
        Registry(f"http://127.0.0.1:{port}").ping()
    assert f"MLflow at http://127.0.0.1:{port} is not reachable" in str(raised.value)
    assert "mlflow server" in raised.value.fix


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_each_kind_of_unusable_store_is_named_with_its_own_fix_and_no_retry_storm(tmp_path, caplog):
    """A database MLflow cannot open is tried once (MLflow's engine retries it for about 100 s, logging each try);
    the fix fits the store's kind; a folder that cannot be made is named with its cause, not a traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    stores = {
        f"sqlite:///{tmp_path}": "SQLite file you can write",  # a folder where the database belongs
        f"postgresql+psycopg://draftsync:secret-pw@127.0.0.1:{_free_port()}/mlflow": "database is up",
        f"file://{tmp_path / 'mlruns'}": "no longer writes file stores",
        "bogus://x": "not bogus://",
    }
    for uri, fix in stores.items():
        with pytest.raises(DraftsyncError) as raised:
            Registry(uri).ping()
        assert "is not reachable" in raised.value.what and fix in raised.value.fix, uri
        assert "secret-pw" not in str(raised.value)
    assert "could not be created" not in caplog.text  # MLflow's retry loop never ran
    with pytest.raises(DraftsyncError) as raised:
        Registry(f"sqlite:///{a_file}/mlflow.db")
    assert raised.value.what == f"the folder of MLflow's SQLite store, {a_file} cannot be made ({a_file}: is a file)"


def test_register_drafter_refuses_bad_input_before_writing_anything(registry, target_dir, tmp_path):
    target_version = registry.register_target("tgt-g", target_dir, tags_for({"code": 1.0}))
    drafter_dir = make_checkpoint(tmp_path / "drafter")
    with pytest.raises(DraftsyncError, match="method 'lookahead'"):
        registry.register_drafter("tgt-g", target_version, drafter_dir, "lookahead", 2, {}, validation_passed=True)
    with pytest.raises(DraftsyncError, match="gamma 0"):
        registry.register_drafter("tgt-g", target_version, drafter_dir, "eagle3", 0, {}, validation_passed=True)
    with pytest.raises(DraftsyncError, match="no config.json"):
        registry.register_drafter("tgt-g", target_version, tmp_path, "eagle3", 2, {}, validation_passed=True)
    assert registry.drafter_for_target_version("tgt-g", target_version, validated_only=False) is None
    assert registry.alias_version(drafter_model_name("tgt-g"), CANDIDATE) is None


def test_training_curves_are_logged_as_step_series_on_the_drafter_run(registry, target_dir, tmp_path):
    target_version = registry.register_target("tgt-curves", target_dir, tags_for({"code": 1.0}))
    history = {"train_loss": [(1, 2.5), (2, 2.0), (3, float("nan")), (4, 1.5)], "holdout_accuracy_pos0": [(4, 0.6)]}
    version = registry.register_drafter(
        "tgt-curves",
        target_version,
        make_checkpoint(tmp_path / "drafter"),
        "medusa",
        2,
        {"acceptance_rate": 0.5},
        validation_passed=False,
        metric_history=history,
    )
    run_id = registry.version_info(drafter_model_name("tgt-curves"), version).run_id
    loss = registry._client.get_metric_history(run_id, "train_loss")
    assert [(m.step, m.value) for m in sorted(loss, key=lambda m: m.step)] == [(1, 2.5), (2, 2.0), (4, 1.5)]
    assert [m.value for m in registry._client.get_metric_history(run_id, "holdout_accuracy_pos0")] == [0.6]


def test_a_rollback_is_a_state_to_write_so_writing_it_twice_lands_the_same(registry, target_dir, tmp_path):
    from draftsync.registry.model_registry import rolled_back

    target_version = registry.register_target("tgt-r", target_dir, tags_for({"code": 1.0}))
    drafter_dir = make_checkpoint(tmp_path / "drafter")
    name = drafter_model_name("tgt-r")
    first = registry.register_drafter("tgt-r", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=True)
    registry.promote("tgt-r", first)
    second = registry.register_drafter("tgt-r", target_version, drafter_dir, "eagle3", 2, {}, validation_passed=True)
    registry.promote("tgt-r", second)
    before = registry.alias_snapshot("tgt-r")

    wanted = rolled_back("tgt-r", before)
    registry.restore_aliases("tgt-r", wanted)
    registry.restore_aliases("tgt-r", wanted)  # a retry after the first write went through

    assert (registry.alias_version(name, PRODUCTION), registry.alias_version(name, PREVIOUS)) == (first, second)
    with pytest.raises(DraftsyncError, match="no `previous` alias"):
        rolled_back("tgt-r", {**before, PREVIOUS: None})


def test_the_drafter_run_and_its_version_never_disagree_on_a_tag(registry, target_dir, tmp_path):
    """The MLflow UI shows the run's tags on one page and the version's on another: they must tell one story."""
    target_version = registry.register_target("tgt-agree", target_dir, tags_for({"code": 1.0}))
    name = drafter_model_name("tgt-agree")
    version = registry.register_drafter(
        "tgt-agree", target_version, make_checkpoint(tmp_path / "drafter"), "eagle3", 3, {}, validation_passed=None
    )
    run_id = registry.version_info(name, version).run_id
    assert registry._client.get_run(run_id).data.tags["draftsync.validation.status"] == "pending"
    registry.record_validation(
        "tgt-agree", version, passed=True, metrics={"acceptance_rate": 0.8}, tags={"draftsync.gate.x": "pass"}, gamma=2
    )
    registry.tag_version(name, version, "draftsync.recommended.method", "eagle3")
    version_tags = registry.version_tags(name, version)
    run_tags = registry._client.get_run(run_id).data.tags
    shared = set(version_tags) & set(run_tags)
    assert {"draftsync.validation.status", "draftsync.validation.passed", "draftsync.gamma"} <= shared
    assert "draftsync.recommended.method" in shared and "draftsync.gate.x" in shared
    assert {key: run_tags[key] for key in shared} == {key: version_tags[key] for key in shared}
    assert (version_tags["draftsync.validation.status"], version_tags["draftsync.gamma"]) == ("passed", "2")
    described = registry._client.get_model_version(name, str(version)).description
    assert f"[tgt-agree version {target_version}](#/models/tgt-agree/versions/{target_version})" in described
    assert "serves gamma 2" in described and "Validation: passed" in described


def test_the_experiment_opens_as_model_development_in_the_mlflow_ui(registry):
    experiment = registry._client.get_experiment(registry._experiment())
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # not the GenAI traces view
