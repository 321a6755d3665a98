"""Bad input at the registry, against a real MLflow (SQLite): corrupt weights are refused before anything is
stored; versions with missing or malformed draftsync tags (as a team registering by hand in the MLflow UI
leaves them) get the facts their checkpoint tells set by the sync, and stop each step that reads a tag no
checkpoint tells (the task mix) or a malformed one with the tag's name and the fix, moving no alias.

One registry for the module: target `tags-llm` v1 with a validated drafter that is `production`."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.tables import ServedPair

from tests.integration.reliability.workdirs import use_workdir

TARGET = "tags-llm"
DRAFTERS = f"{TARGET}-drafter"
MIX = {"code": 0.5, "math": 0.5}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_target, tiny_drafter):
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from mlflow import MlflowClient

    with pytest.MonkeyPatch.context() as patch:
        use_workdir(patch, tmp_path_factory.mktemp("registry"))
        registry = context.registry()
        version = publish_target.fn(TARGET, str(tiny_target), MIX)
        production = registry.register_drafter(TARGET, version, tiny_drafter, "eagle3", 2, {}, validation_passed=True)
        registry.promote(TARGET, production)
        client = MlflowClient(tracking_uri=registry.tracking_uri, registry_uri=registry.tracking_uri)
        yield SimpleNamespace(registry=registry, client=client, version=version, production=production)
    context.reset()


def stored_state(world) -> dict:
    """What must not change when bad input is refused: drafter versions, aliases, runs, production's tags."""
    registry = world.registry
    return {
        "drafters": [info.version for info in registry.target_versions_after(DRAFTERS, 0)],
        "targets": [info.version for info in registry.target_versions_after(TARGET, 0)],
        "aliases": registry.alias_snapshot(TARGET),
        "target_alias": registry.alias_version(TARGET, "production"),
        "runs": len(
            world.client.search_runs([world.client.get_experiment_by_name("draftsync").experiment_id], max_results=1000)
        ),
        "production_tags": registry.version_tags(DRAFTERS, world.production),
    }


def truncated_copy(checkpoint, tmp_path, name: str):
    copy = tmp_path / name
    shutil.copytree(checkpoint, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # a torn copy: the header promises 64 more bytes
    return copy, weights


def test_corrupt_drafter_weights_are_refused_before_anything_is_stored(world, tiny_drafter, tmp_path):
    before = stored_state(world)
    drafter, weights = truncated_copy(tiny_drafter, tmp_path, "torn-drafter")
    with pytest.raises(DraftsyncError) as error:
        world.registry.register_drafter(TARGET, world.version, drafter, "eagle3", 2, {}, validation_passed=True)
    assert f"drafter weights {weights} are corrupt" in error.value.what
    assert "nothing was registered" in error.value.fix
    assert stored_state(world) == before


def test_corrupt_target_weights_are_refused_by_the_registry_itself(world, tiny_target, tmp_path):
    """publish_target reads the headers first; a caller of Registry.register_target is protected too."""
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.targets import describe_target

    before = stored_state(world)
    tags = target_tags(**{**describe_target(tiny_target), "task_mix": MIX})
    target, weights = truncated_copy(tiny_target, tmp_path, "torn-target")
    with pytest.raises(DraftsyncError, match=f"target weights {weights} are corrupt"):
        world.registry.register_target(TARGET, target, tags)
    with pytest.raises(DraftsyncError, match="tag draftsync.task_mix is not JSON"):
        world.registry.register_target(TARGET, tiny_target, {**tags, "draftsync.task_mix": "code: 0.5"})
    assert stored_state(world) == before


@pytest.mark.parametrize("damage", ["removed", "not a number"])
def test_a_drafter_without_a_readable_target_version_tag_is_named_by_every_step_that_needs_it(world, damage):
    """Validation, the rollout's choice of pair and the weekly review each stop with the tag to set."""
    from draftsync.flows.rollout import choose_pair
    from draftsync.flows.validate import validate
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import review_deployment

    registry = world.registry
    drafter_dir = registry.download(DRAFTERS, world.production)
    version = registry.register_drafter(
        TARGET, world.version, drafter_dir, "eagle3", 2, {}, validation_passed=True, sync_key=f"hand-made-{damage}"
    )
    if damage == "removed":
        world.client.delete_model_version_tag(DRAFTERS, str(version), "draftsync.target.version")
        found = "no draftsync.target.version tag"
    else:
        world.client.set_model_version_tag(DRAFTERS, str(version), "draftsync.target.version", "v1")
        found = "draftsync.target.version='v1'"
    before = stored_state(world)
    expected = f"drafter {DRAFTERS} version {version} has {found}"

    with pytest.raises(DraftsyncError) as error:
        validate.fn(TARGET, version, "test", promote=True)
    assert expected in error.value.what and "set draftsync.target.version" in error.value.fix

    with pytest.raises(DraftsyncError) as error:
        choose_pair(ServingDeployment(name="chat", target_name=TARGET), version, True)
    assert expected in error.value.what

    context.store().pairs.record(
        "chat",
        ServedPair(
            target_name=TARGET, target_version=world.version, drafter_version=version, gamma=2, drafter_name=DRAFTERS
        ),
        endpoint="http://127.0.0.1:9",
        state="serving",
    )
    with pytest.raises(DraftsyncError) as error:
        review_deployment.fn("chat", datetime.now(UTC))
    assert expected in error.value.what
    assert stored_state(world) == before


@pytest.fixture
def hand_registered(world, tiny_target):
    """A new target version registered in MLflow directly, with draftsync.kind=target as its only draftsync tag."""
    from mlflow.exceptions import MlflowException

    try:
        world.client.create_registered_model("outside-llm")
    except MlflowException:  # made by an earlier test
        pass
    created = world.client.create_model_version(
        "outside-llm", source=str(tiny_target), tags={"draftsync.kind": "target"}
    )
    return int(created.version)


def plan_and_mix(version: int) -> tuple[DraftsyncError, DraftsyncError]:
    """The two sync steps that read a target version's tags: the plan, then the task mix of the dataset."""
    from draftsync.profiles import profile
    from draftsync.tasks.dataset import target_task_mix
    from draftsync.tasks.planning import plan_drafter
    from draftsync.tasks.registration import fetch_target

    target = fetch_target.fn("outside-llm", version)
    with pytest.raises(DraftsyncError) as plan_error:
        plan_drafter.fn("outside-llm", target.tags, profile("test"))
    with pytest.raises(DraftsyncError) as mix_error:
        target_task_mix(target.path, target.tags)
    return plan_error.value, mix_error.value


def test_a_target_version_without_draftsync_tags_gets_the_checkpoints_and_the_profiles_task_mix(world, hand_registered):
    """The sync's fetch tags what the checkpoint tells (sizes, parameters, family), so the plan runs; the task
    mix no checkpoint tells is the sync profile's default, and says so; without a default it names the tag to set."""
    from draftsync.profiles import profile
    from draftsync.tasks.dataset import target_task_mix
    from draftsync.tasks.planning import plan_drafter
    from draftsync.tasks.registration import fetch_target

    target = fetch_target.fn("outside-llm", hand_registered)
    stored = world.client.get_model_version("outside-llm", str(hand_registered)).tags
    assert stored["draftsync.family"] == "llama" and int(stored["draftsync.num_parameters"]) > 0
    assert "draftsync.task_mix" not in stored
    assert plan_drafter.fn("outside-llm", target.tags, profile("test")).advice.recommendation.method
    mix = target_task_mix(target.path, target.tags, profile("test").default_task_mix)
    assert mix.shares == pytest.approx({"code": 1 / 3, "math": 1 / 3, "prose": 1 / 3})
    assert "the sync profile's default: the target declares no draftsync.task_mix tag" in mix.text()
    with pytest.raises(DraftsyncError) as mix_error:
        target_task_mix(target.path, target.tags)
    assert "declares no task mix" in mix_error.value.what
    assert "draftsync.task_mix tag" in mix_error.value.fix


@pytest.mark.parametrize("task_mix", ["code=0.5,math=0.5", "[0.5, 0.5]", '{"code": null}', '{"code": "half"}'])
def test_a_task_mix_tag_that_is_not_a_json_object_of_shares_is_named(world, hand_registered, task_mix):
    version = str(hand_registered)
    world.client.set_model_version_tag("outside-llm", version, "draftsync.num_parameters", "25000")
    world.client.set_model_version_tag("outside-llm", version, "draftsync.task_mix", task_mix)
    plan_error, mix_error = plan_and_mix(hand_registered)
    for error in (plan_error, mix_error):
        assert f"registry tag draftsync.task_mix={task_mix!r} is not a JSON object of shares" in error.what
        assert '{"code": 0.5, "math": 0.5}' in error.fix


def test_a_parameter_count_tag_that_is_not_a_count_is_named(world, hand_registered):
    from draftsync.profiles import profile
    from draftsync.tasks.planning import plan_drafter

    tags = {"draftsync.kind": "target", "draftsync.task_mix": '{"code": 1.0}', "draftsync.num_parameters": "1.8B"}
    with pytest.raises(DraftsyncError, match="registry tag draftsync.num_parameters is '1.8B'"):
        plan_drafter.fn("outside-llm", tags, profile("test"))
