"""A sync of each non-default method through the real flow: dataset shards, data checks, training, registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.parametrize("method", ["medusa", "eagle"])
def test_a_sync_trains_registers_and_logs_curves_for_the_method(workdir, built_targets, method):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile, validation_profile
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    checklist = validation_profile("test").model_copy(
        update={
            "requests": 2,
            "max_tokens": 12,
            "gamma_range": (2, 3),
            "sweep_requests": 1,
            "stress_requests": 0,
            "long_max_tokens": 16,
        }
    )
    small = profile("test").model_copy(
        update={
            "method": method,
            "train_steps": 20,
            "training_texts": 40,
            "generated_samples": 8,
            "checkpoint_every": 10,
            "validation": checklist,
            "draft_vocab_size": 256,
            "medusa_heads": 3,
        }
    )
    version = publish_target("methods-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    result = sync("methods-llm", version, small)

    registry = context.registry()
    tags = registry.version_tags("methods-llm-drafter", result["drafter_version"])
    assert tags["draftsync.method"] == method and result["method"] == method
    assert tags["draftsync.target.version"] == str(version)
    assert result["data_checks"]["passed"] and result["dataset"]["sequences"] > 0
    assert result["training"]["steps"] == 20 and 0 < result["training"]["parameters_pct_of_target"] < 100
    run_id = registry.version_info("methods-llm-drafter", result["drafter_version"]).run_id
    loss = registry._client.get_metric_history(run_id, "train.loss")
    assert sorted(m.step for m in loss) == list(range(1, 21))
    assert registry._client.get_metric_history(run_id, "train.accuracy_pos0")

    work = Path(workdir) / "syncs" / "methods-llm" / f"v{version}-{method}"
    assert not list(work.glob("dataset-*")), "the shards are removed once the drafter is registered"
    saved = json.loads(
        (
            Path(workdir) / "drafters" / "methods-llm" / f"target-v{version}-{method}" / "draftsync_training.json"
        ).read_text()
    )
    assert saved["method"] == method
