"""register_drafter refuses a drafter built for another target's width before anything is registered."""

from __future__ import annotations

import pytest
from draftsync.errors import DraftsyncError


def test_a_dflash_drafter_of_another_hidden_size_is_refused_and_nothing_is_registered(workdir, tmp_path):
    import json

    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target, register_drafter

    from tests.support.tiny_models import build_tiny_dflash, build_tiny_target

    target_dir = build_tiny_target(tmp_path / "target")
    version = publish_target("reg-llm", str(target_dir), {"code": 1.0})
    hidden = json.loads((target_dir / "config.json").read_text())["hidden_size"]
    wider = build_tiny_dflash(target_dir, tmp_path / "wider", hidden_size=hidden * 2)
    with pytest.raises(DraftsyncError) as error:
        register_drafter.fn(
            "reg-llm", version, str(wider), target_dir=str(target_dir), method="dflash", gamma=3, training=None
        )  # refused before the training summary is read
    assert f"hidden size of {hidden * 2}, target {target_dir} has {hidden}" in error.value.what
    assert "draftsync sync" in error.value.fix
    assert context.registry().drafter_for_target_version("reg-llm", version, validated_only=False) is None
