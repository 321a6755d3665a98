"""`draftsync sync` of a version that cannot be synced is refused before anything is recorded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize("version", ["99", "-1", "0", "abc", str(2**63), str(10**30)])
def test_a_sync_of_a_missing_or_impossible_version_records_nothing(workdir, built_targets, version):
    from draftsync.cli.app import app
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registered = publish_target("cli-sync-llm", str(built_targets[1]), {"code": 1.0})
    result = CliRunner().invoke(app, ["sync", "cli-sync-llm", version, "--profile", "test"])
    assert result.exit_code != 0
    said = str(result.exception) if result.exception and not isinstance(result.exception, SystemExit) else ""
    said += result.output
    assert "Traceback" not in result.output
    if version == "99":
        assert "has no version 99" in said, said
    else:  # typer refuses it as a usage error (-1 reads as an option, 2**63 is past MLflow's 64-bit versions)
        assert "Invalid value" in said or "No such option: -1" in said, said
    assert context.sync_ledger().jobs("cli-sync-llm") == []  # status's last sync is untouched
    assert context.registry().drafter_for_target_version("cli-sync-llm", registered, validated_only=False) is None


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("no-such-llm", "holds no registered model named 'no-such-llm'"),
        ("acme/llm", "model name 'acme/llm' cannot be used"),
        ("m" * 300, "at most 200 characters, not 300"),
    ],
)
@pytest.mark.parametrize("command", ["watch", "sync"])
def test_a_watch_or_sync_of_a_target_the_registry_does_not_hold_is_refused(workdir, command, target, said):
    """A typo'd name watched nothing and exited 0; it is one error line naming the name and the fix."""
    from draftsync.cli.app import app
    from draftsync.tasks import context

    args = [command, target, "--profile", "test"] if command == "watch" else [command, target, "1", "--profile", "test"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    if command == "sync" and target == "no-such-llm":
        said = "no-such-llm"
    assert said in str(result.exception), result.exception
    assert context.sync_ledger().jobs() == []


def test_an_unknown_validation_backend_is_a_usage_error_before_any_work(workdir):
    """It was refused only after the drafter and target were downloaded."""
    from draftsync.cli.app import app

    result = CliRunner().invoke(app, ["validate", "no-such-llm", "1", "--backend", "vlm"], env={"COLUMNS": "240"})
    assert result.exit_code == 2
    assert "Invalid value for '--backend'" in result.output and "'auto', 'vllm', 'reference'" in result.output
    assert "no-such-llm" not in result.output  # refused before the registry was asked about the target


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["no-such-llm", "1"], "no-such-llm-drafter has no version 1"),
        (["no-such-llm", str(2**63)], "Invalid value"),
    ],
)
def test_a_validate_of_a_drafter_the_registry_does_not_hold_is_refused_before_the_flow(workdir, argv, said):
    from draftsync.cli.app import app

    result = CliRunner().invoke(app, ["validate", *argv, "--profile", "test"], env={"COLUMNS": "240"})
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert said in str(result.exception) + result.output
    assert "Beginning flow run" not in result.output


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--method", "dflash", "--block-size", "20"], "block_size: Input should be less than or equal to 16"),
        (["--method", "dflash", "--block-size", "1"], "block_size: Input should be greater than or equal to 2"),
        (["--method", "dflash", "--block-size", "2", "--profile", "production"], "gamma 4 is more than a dflash"),
    ],
)
def test_a_dflash_block_vllm_cannot_serve_is_refused_before_anything_is_recorded(workdir, options, said):
    from draftsync.cli.app import app
    from draftsync.tasks import context

    args = ["sync", "no-such-llm", "1", *options]
    if "--profile" not in options:
        args += ["--profile", "test"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert said in str(result.exception), result.exception
    assert "no-such-llm" not in str(result.exception)  # refused before the registry was asked about the target
    assert context.sync_ledger().jobs() == []
