"""`draftsync rollout --dry-run` renders without starting anything; `draftsync rollback` serves `previous` again."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow


def _setup(workdir, built_targets, tmp_path):
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    from tests.support.tiny_models import build_tiny_drafter

    registry = context.registry()
    version = publish_target("cli-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    drafters = []
    for gamma in (2, 3):
        path = build_tiny_drafter(built_targets[1], tmp_path / f"drafter-{gamma}", gamma=gamma)
        drafters.append(
            registry.register_drafter("cli-llm", version, path, "eagle3", gamma, {}, validation_passed=True)
        )
    (workdir / "deployments.yaml").write_text(
        "deployments:\n  - name: cli\n    target_name: cli-llm\n    launch: reference\n"
    )
    return registry, version, drafters


def test_dry_run_prints_the_vllm_launch_and_starts_nothing(workdir, built_targets, tmp_path):
    from draftsync.cli.app import app
    from draftsync.tasks.serving import serving_record

    registry, version, (first, _) = _setup(workdir, built_targets, tmp_path)
    registry.promote("cli-llm", first)
    out = tmp_path / "launch.json"
    result = CliRunner().invoke(app, ["--workdir", str(workdir), "rollout", "cli", "--dry-run", "--json", str(out)])
    assert result.exit_code == 0, result.output
    launch = json.loads(out.read_text())
    assert launch["dry_run"] and launch["drafter_version"] == first and launch["target_version"] == version
    assert isinstance(launch["argv"], list) and launch["argv"][:2] == ["vllm", "serve"]
    config = json.loads(launch["argv"][launch["argv"].index("--speculative-config") + 1])
    assert config == launch["speculative_config"]
    assert config["method"] == "eagle3" and config["num_speculative_tokens"] == 2
    assert serving_record("cli") is None  # nothing was started
    # what is printed is the launch as a shell command, on a real port, once
    import shlex

    assert result.output.count("--speculative-config") == 1 and launch["port"] > 0
    assert shlex.split(result.output.strip().splitlines()[-1]) == launch["argv"]
    assert launch["argv"][launch["argv"].index("--port") + 1] == str(launch["port"])

    unknown = CliRunner().invoke(app, ["--workdir", str(workdir), "rollout", "nope", "--dry-run"])
    assert unknown.exit_code != 0 and "cli" in str(unknown.exception)


def test_rollback_points_production_at_previous_and_serves_that_pair(workdir, built_targets, tmp_path):
    from draftsync.cli.app import app
    from draftsync.tasks import context

    registry, _, (first, second) = _setup(workdir, built_targets, tmp_path)
    registry.promote("cli-llm", first)
    registry.promote("cli-llm", second)
    runner = CliRunner()
    served = runner.invoke(app, ["--workdir", str(workdir), "rollout", "cli"])
    assert served.exit_code == 0, served.output
    assert context.store().pairs.get("cli").drafter_version == second

    out = tmp_path / "rollback.json"
    result = runner.invoke(app, ["--workdir", str(workdir), "rollback", "cli", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["aliases_before"]["production"] == second and data["aliases_after"]["production"] == first
    assert data["aliases_after"]["previous"] == second
    pair = context.store().pairs.get("cli")
    assert (pair.drafter_version, pair.gamma, pair.state) == (first, 2, "serving")


def test_dry_run_renders_a_dflash_drafters_launch_and_refuses_one_of_another_width(workdir, built_targets, tmp_path):
    from draftsync.cli.app import app
    from draftsync.registry.tags import DrafterVersion
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    version = publish_target("cli-llm", str(built_targets[1]), {"code": 1.0})
    (workdir / "deployments.yaml").write_text(
        "deployments:\n  - name: cli\n    target_name: cli-llm\n    launch: reference\n"
    )
    from tests.support.tiny_models import build_tiny_dflash

    path = build_tiny_dflash(built_targets[1], tmp_path / "dflash")
    drafter = registry.register_drafter("cli-llm", version, path, "dflash", 3, {}, validation_passed=True)
    registry.promote("cli-llm", drafter)
    tags = DrafterVersion.from_tags("cli-llm-drafter", drafter, registry.version_tags("cli-llm-drafter", drafter))
    assert (tags.method, tags.trained_for_version(), tags.served_gamma()) == ("dflash", version, 3)

    out = tmp_path / "launch.json"
    result = CliRunner().invoke(app, ["--workdir", str(workdir), "rollout", "cli", "--dry-run", "--json", str(out)])
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())["speculative_config"]
    assert config["method"] == "dflash" and config["num_speculative_tokens"] == 3
    assert "num_speculative_tokens_per_batch_size" not in config  # one gamma at every batch size

    hidden = json.loads((built_targets[1] / "config.json").read_text())["hidden_size"]
    wider = build_tiny_dflash(built_targets[1], tmp_path / "wider", hidden_size=hidden * 2)
    other = registry.register_drafter("cli-llm", version, wider, "dflash", 3, {}, validation_passed=True)
    refused = CliRunner().invoke(
        app, ["--workdir", str(workdir), "rollout", "cli", "--dry-run", "--drafter-version", str(other)]
    )
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert f"hidden size of {hidden * 2}, target" in str(refused.exception)
    assert "draftsync sync" in refused.exception.fix


def test_dry_run_serves_the_draft_sampling_validation_chose_unless_the_deployment_sets_one(
    workdir, built_targets, tmp_path
):
    from draftsync.cli.app import app
    from draftsync.registry.model_registry import drafter_model_name
    from draftsync.registry.tags import DRAFT_SAMPLING_TAG

    registry, _, (first, _) = _setup(workdir, built_targets, tmp_path)
    registry.promote("cli-llm", first)
    registry.tag_version(drafter_model_name("cli-llm"), first, DRAFT_SAMPLING_TAG, "probabilistic")

    def dry_run() -> dict:
        out = tmp_path / "launch.json"
        result = CliRunner().invoke(app, ["--workdir", str(workdir), "rollout", "cli", "--dry-run", "--json", str(out)])
        assert result.exit_code == 0, result.output
        return json.loads(out.read_text())

    launch = dry_run()
    assert launch["speculative_config"]["draft_sample_method"] == "probabilistic"
    assert "validation measured it better" in launch["draft_sampling"]
    (workdir / "deployments.yaml").write_text(
        "deployments:\n  - name: cli\n    target_name: cli-llm\n    launch: reference\n    draft_sampling: greedy\n"
    )
    launch = dry_run()
    assert launch["speculative_config"]["draft_sample_method"] == "greedy"
    assert launch["draft_sampling"] == "greedy: the deployment sets it; validation measured probabilistic better"
