"""A sync whose profile asks for two training processes trains its drafter under torchrun (two gloo ranks on this
CPU) and registers it like any other."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_a_sync_trains_on_two_torchrun_ranks_when_its_profile_asks(workdir, built_targets):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    version = publish_target("ranks-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    two = profile("test").model_copy(update={"train_steps": 6, "train_processes": 2, "keep_dataset": True})
    result = sync("ranks-llm", version, two)
    assert result["plan"]["settings"]["train_processes"] == 2
    assert result["training"]["train_processes"] == 2 and result["training"]["steps"] == 6
    drafter = context.registry().drafter_for_target_version("ranks-llm", version, validated_only=False)
    assert drafter == result["drafter_version"]
    spec = json.loads(next(workdir.rglob("rank-spec.json")).read_text())  # what every rank read
    assert spec["config"]["steps"] == 6 and spec["config"]["batch_size"] == two.batch_size
