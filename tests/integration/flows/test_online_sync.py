"""A sync with online hidden states writes tokens only, trains with states its target computes per batch, and
registers its drafter like any other."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_a_sync_with_online_states_writes_no_state_and_registers_its_drafter(workdir, built_targets):
    from pathlib import Path

    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from safetensors import safe_open

    version = publish_target("online-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    online = profile("test").model_copy(update={"train_steps": 8, "hidden_states": "online", "keep_dataset": True})
    result = sync("online-llm", version, online)
    assert result["plan"]["settings"]["hidden_states"] == "online"
    assert result["plan"]["reasons"]["hidden_states"].startswith("online: the profile asks for it")
    dataset = ShardDataset(result["dataset"]["path"])
    assert not dataset.stores_states and dataset.num_sequences > 0
    for shard in Path(result["dataset"]["path"]).glob("shard-*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            assert set(handle.keys()) == {"input_ids", "loss_mask", "offsets", "task_index"}
    assert result["training"]["steps"] == 8
    assert (
        context.registry().drafter_for_target_version("online-llm", version, validated_only=False)
        == (result["drafter_version"])
    )
