"""A retrain learns from the traffic that went stale: its dataset answers the prompts its deployment captured (for
the profile's share of the responses), and with too little captured traffic, or capture off, it says so and trains
on the declared task mix."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

PROSE = [f"Write a short paragraph about the harbour town number {i} and its lighthouse." for i in range(40)]


def _declare(workdir, capture: bool) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    section = "    capture: {rate: 1.0}\n" if capture else ""
    (workdir / "deployments.yaml").write_text(
        f"deployments:\n  - name: chat\n    target_name: traffic-llm\n    launch: external\n"
        f"    endpoint: http://127.0.0.1:9\n{section}"
    )


def _capture(prompts: list[str]) -> None:
    from draftsync.serving.traffic_capture import TrafficCapture
    from draftsync.tasks import context
    from draftsync.tasks.serving import capture_config, configured_deployments

    capture = TrafficCapture(capture_config(configured_deployments()["chat"]), seed=0)
    for prompt in prompts:
        body = f'{{"model": "m", "prompt": {prompt!r}}}'.replace("'", '"').encode()
        capture.offer("/v1/completions", {"X-Draftsync-Domain": "prose"}, body, 200, b"{}")
    capture.flush()
    assert capture.stats()["captured"] == len(prompts), capture.stats()
    del context


def _retrain(version: int, small) -> dict:
    from draftsync.flows.sync import sync
    from draftsync.tasks import context

    context.sync_ledger().request("traffic-llm", version, small.method, source="cli", reason="stale", retrain=True)
    return sync("traffic-llm", version, small)


@pytest.mark.parametrize(("capture", "captured", "expected"), [(True, 40, 40), (True, 5, 0), (False, 0, 0)])
def test_a_retrain_answers_captured_traffic_only_when_there_is_enough(
    workdir, built_targets, capture, captured, expected
):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.speculative.shard_reader import ShardDataset
    from draftsync.tasks.registration import publish_target

    version = publish_target("traffic-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    _declare(workdir, capture)
    if captured:
        _capture(PROSE[:captured])
    small = profile("test").model_copy(
        update={"train_steps": 5, "generated_samples": 80, "training_texts": 80, "keep_dataset": True}
    )
    first = sync("traffic-llm", version, small)
    assert first["dataset"]["captured"] == 0  # a first sync learns the declared mix: there is no stale traffic yet
    retrain = _retrain(version, small)
    assert retrain["dataset"]["captured"] == expected
    tasks = ShardDataset(retrain["dataset"]["path"]).manifest["tasks"]
    if expected:
        assert tasks["captured"]["sequences"] == expected  # each captured prompt answered once, by the target
        # the declared tasks each gave up the same share of their prompts, so the data checks (which raise) held
    else:
        assert "captured" not in tasks
