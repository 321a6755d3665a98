"""`draftsync sync` of a version that cannot be synced is refused before anything is recorded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize("version", ["99", "-1", "0", "abc"])
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
    else:  # typer refuses it as a usage error (-1 reads as an option), before any command code runs
        assert "Invalid value" in said or "No such option: -1" in said, said
    assert context.sync_ledger().jobs("cli-sync-llm") == []  # status's last sync is untouched
    assert context.registry().drafter_for_target_version("cli-sync-llm", registered, validated_only=False) is None
