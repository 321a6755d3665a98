"""A sync request asks the GPU pool for the GPUs its plan uses on one of the pool's nodes: its event's
`draftsync.gpus` label, which picks the drafter-sync trigger whose job variables give the run that many GPUs
(tests/integration/flows/test_production_files.py renders each trigger's job). Real MLflow (SQLite) and a real
Prefect API: the versions carry only tags, as a config-only description of Llama-3.1-8B and -70B."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from draftsync.tasks import context, events

from tests.support.prefect_events import target_events

LLAMA_31 = dict(vocab_size=128256, num_key_value_heads=8, dtype="bfloat16")
SHAPES = {
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "llama-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
}


def register_tags_only(name: str, tags: dict[str, str]) -> int:
    """A target version MLflow holds with these tags (its files are never read: sizing needs only the tags)."""
    from mlflow import MlflowClient

    registry = context.registry()
    client = MlflowClient(tracking_uri=registry.tracking_uri, registry_uri=registry.tracking_uri)
    client.create_registered_model(name)
    return int(client.create_model_version(name, source="file:///nowhere", tags=tags).version)


def size_tags(shape: dict) -> dict[str, str]:
    from draftsync.planning.target_shape import TargetShape
    from draftsync.registry.tags import KIND_TAG, TARGET_KIND, target_tags
    from draftsync.speculative.families import config_features
    from transformers import LlamaConfig

    config = LlamaConfig(**LLAMA_31, **shape).to_dict()
    counted = TargetShape(
        name="counted",
        parameters=0,
        hidden=shape["hidden_size"],
        layers=shape["num_hidden_layers"],
        vocab=LLAMA_31["vocab_size"],
        heads=shape["num_attention_heads"],
        kv_heads=LLAMA_31["num_key_value_heads"],
        head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        intermediate=shape["intermediate_size"],
        checkpoint_dtype="bfloat16",
        context=0,
        config=config,
    ).parameters_from_config()
    return {
        KIND_TAG: TARGET_KIND,
        **target_tags(
            architecture="LlamaForCausalLM",
            hidden_size=shape["hidden_size"],
            num_layers=shape["num_hidden_layers"],
            vocab_size=LLAMA_31["vocab_size"],
            parameter_count=counted,
            task_mix={"code": 0.5, "math": 0.5},
            family="llama",
            features=config_features(config),
        ),
    }


@pytest.fixture()
def pool_of_eight(workdir, monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_GPU_POOL_GPUS", "8")
    monkeypatch.setenv("DRAFTSYNC_SYNC_PROFILE", "production")
    context.reset()
    return workdir


def test_a_sync_event_asks_for_the_gpus_the_plan_uses_on_a_pool_node(pool_of_eight):
    from draftsync.profiles import profile
    from draftsync.tasks.planning import requested_gpus
    from draftsync.tasks.sync_requests import request_sync

    started = datetime.now(UTC)
    eight = register_tags_only("llama-8b", size_tags(SHAPES["llama-8b"]))
    seventy = register_tags_only("llama-70b", size_tags(SHAPES["llama-70b"]))
    asked = request_sync("llama-8b", eight, source="test", reason="a new version")
    assert asked.requested
    (event,) = target_events(events.SYNC_REQUESTED, started, "llama-8b", eight, wanted=1)
    assert event.resource[events.GPUS_LABEL] == "8"  # the production profile trains a DDP rank on each GPU

    production = profile("production")
    small_batch = production.model_copy(update={"batch_size": 3})
    assert requested_gpus("llama-8b", eight, small_batch) == 4  # three ranks: the next count a trigger offers
    one_window = production.model_copy(update={"batch_size": 1})
    assert requested_gpus("llama-8b", eight, one_window) == 1
    assert requested_gpus("llama-70b", seventy, one_window) == 2  # the target spreads over two GPUs


def test_a_version_the_plan_cannot_size_asks_for_a_whole_node_and_is_still_requested(workdir, monkeypatch):
    from draftsync.profiles import profile
    from draftsync.tasks.planning import requested_gpus
    from draftsync.tasks.sync_requests import request_sync

    monkeypatch.setenv("DRAFTSYNC_GPU_POOL_GPUS", "2")
    context.reset()
    started = datetime.now(UTC)
    # registered by hand: the kind tag and a task mix, no size tags (the sync sets them from the checkpoint)
    bare = register_tags_only(
        "bare-llm", {"draftsync.kind": "target", "draftsync.task_mix": json.dumps({"prose": 1.0})}
    )
    assert requested_gpus("bare-llm", bare, profile("production")) == 2
    # 70B on a node of one 80 GB GPU: the plan refuses, so the request asks for the node and the sync's own plan
    # refuses on the worker with the numbers
    monkeypatch.setenv("DRAFTSYNC_GPU_POOL_GPUS", "1")
    context.reset()
    seventy = register_tags_only("llama-70b", size_tags(SHAPES["llama-70b"]))
    assert requested_gpus("llama-70b", seventy, profile("production")) == 1
    # a version MLflow does not hold: the request is still recorded and announced, sized as a whole node
    assert request_sync("ghost-llm", 4, source="test", reason="by hand").requested
    (event,) = target_events(events.SYNC_REQUESTED, started, "ghost-llm", 4, wanted=1)
    assert event.resource[events.GPUS_LABEL] == "1"
