"""A retrain learns from the traffic that went stale: its dataset answers the prompts its deployment captured (for
the profile's share of the responses), it is validated on a held-out slice of them as well as on the declared mix,
and with too little captured traffic, or capture off, it says so and trains on the declared task mix."""

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
    for index, prompt in enumerate(prompts):
        body = f'{{"model": "m", "prompt": {prompt!r}, "max_tokens": {10 + index % 3}}}'.replace("'", '"').encode()
        capture.offer("/v1/completions", {"X-Draftsync-Domain": "prose"}, body, 200, b"{}")
    capture.flush()
    assert capture.stats()["captured"] == len(prompts), capture.stats()
    del context


def _retrain(version: int, small) -> dict:
    from draftsync.flows.sync import sync
    from draftsync.tasks import context

    context.sync_ledger().request("traffic-llm", version, small.method, source="cli", reason="stale", retrain=True)
    return sync("traffic-llm", version, small)


def test_a_retrain_answers_the_captured_prompts(workdir, built_targets):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.tasks.registration import publish_target

    version = publish_target("traffic-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    _declare(workdir, capture=True)
    _capture(PROSE)
    small = profile("test").model_copy(
        update={"train_steps": 5, "generated_samples": 80, "training_texts": 80, "keep_dataset": True}
    )
    first = sync("traffic-llm", version, small)
    assert first["dataset"]["captured"] == 0  # a first sync learns the declared mix: there is no stale traffic yet
    assert "captured_acceptance" not in first["validation"]  # nor is it validated on any
    retrain = _retrain(version, small)
    held_out = round(small.captured_holdout * 40)  # 8 of the 40 distinct prompts are kept for validation
    assert retrain["dataset"]["captured"] == 40 - held_out  # each prompt left to train on, answered once
    dataset = ShardDataset(retrain["dataset"]["path"])
    tasks = dataset.manifest["tasks"]
    assert tasks["captured"]["sequences"] == 40 - held_out
    # captured_share (0.5) of the sequences answer captured prompts: the declared texts and responses shrink to as
    # many, each task by the same share, so the data checks (which raise) held
    declared = tasks["code"]["sequences"] + tasks["math"]["sequences"]
    assert abs(declared - (40 - held_out)) <= 2, tasks  # each task's count is rounded
    validation = retrain["validation"]
    from draftsync.tasks import context

    settings = context.settings()  # a retrain must clear the monitor's lines on its traffic, as the knee does
    gate = next(g for g in validation["gates"] if g["name"] == "captured_traffic_acceptance")
    assert gate["value"] == validation["captured_acceptance"]["mean"] and gate["threshold"] == max(
        small.validation.min_acceptance, settings.stale_threshold, settings.mismatch_threshold
    )
    assert f"{held_out} held-out prompts" in gate["detail"]
    rows = list(__import__("csv").DictReader(open(f"{validation['reports_dir']}/requests.csv")))
    validated = [r for r in rows if r["phase"] == "captured"]
    assert len(validated) == held_out
    # each held-out request replayed at the length its client asked for (10-12), not the profile's max_tokens
    assert all(1 <= int(r["output_tokens"]) <= 12 for r in validated) and small.validation.max_tokens > 12
    prediction = validation["prediction"]
    assert (prediction["traffic"], prediction["requests"]) == ("held-out captured traffic", held_out)
    assert prediction["mean"][1] <= validation["captured_acceptance"]["mean"] <= prediction["mean"][2]
    from draftsync.registry.tags import PredictedAcceptance

    tags = context.registry().version_tags("traffic-llm-drafter", retrain["drafter_version"])
    predicted = PredictedAcceptance.from_tags(tags)
    assert predicted is not None and predicted.window_draft_tokens == small.validation.prediction_window_draft_tokens
    # nothing validated on was trained on: the held-out prompts are in no training sequence
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(built_targets[1]))
    trained = [tokenizer.decode(ids) for ids, _ in dataset.token_rows()]
    held = [p for p in PROSE if not any(p in text for text in trained)]
    assert len(held) == held_out


@pytest.mark.parametrize(("capture", "captured", "said"), [(True, 5, "chat: 5 captured prompts"), (False, 0, "off")])
def test_too_little_captured_traffic_or_capture_off_trains_on_the_declared_mix(workdir, capture, captured, said):
    """What the retrain reads and says before it decides (a sync of these trains on the declared mix: the flow
    takes captured prompts only from min_captured_prompts, 20 in every profile)."""
    from draftsync.profiles import profile
    from draftsync.tasks.dataset import with_captured_traffic
    from draftsync.tasks.serving import captured_prompts

    _declare(workdir, capture)
    if captured:
        _capture(PROSE[:captured])
    prompts, where = captured_prompts("traffic-llm")
    assert len(prompts) == captured < profile("test").min_captured_prompts
    assert said in where
    declared = [("code", "def f():"), ("math", "1 + 1 =")]
    texts = [("code", "x = 1"), ("math", "2 + 2 = 4")]
    assert with_captured_traffic(texts, declared, [], profile("test")) == (texts, declared, 0)


@pytest.mark.parametrize(("captured", "expected"), [(300, 100), (30, 30)])
def test_captured_prompts_make_their_share_of_the_dataset_as_far_as_they_go(captured, expected):
    """captured_share 0.5 of 200 sequences is 100; with 30 distinct captured prompts the declared data shrinks to about
    30, so the share holds; each declared task keeps the same share of its texts and its prompts."""
    from draftsync.profiles import profile
    from draftsync.tasks.dataset import with_captured_traffic

    texts = [(task, f"{task} text {i}") for task in ("code", "math") for i in range(50)]
    prompts = [(task, f"{task} prompt {i}") for task in ("code", "math") for i in range(50)]
    traffic = [f"prose prompt {i}" for i in range(captured)] * 2  # each captured twice: drawn once
    kept_texts, kept_prompts, count = with_captured_traffic(texts, prompts, traffic, profile("test"))
    assert count == expected == sum(task == "captured" for task, _ in kept_prompts)
    assert len({p for task, p in kept_prompts if task == "captured"}) == expected
    declared = [pair for pair in kept_texts + kept_prompts if pair[0] != "captured"]
    assert abs(len(declared) - expected) <= 4  # each of the four groups is rounded
    for task in ("code", "math"):
        assert sum(t == task for t, _ in kept_texts) == sum(t == task for t, _ in kept_prompts if t != "captured")


def test_each_captured_prompt_lends_its_openings_and_the_declared_data_keeps_its_size():
    """With captured_openings 2, a prompt of twelve words is answered whole and cut at four and eight words; a
    prompt too short to cut (under four words an opening) lends none, and an opening is answered once. The declared
    data shrinks as for the distinct prompts alone."""
    from draftsync.profiles import profile
    from draftsync.tasks.dataset import captured_openings, with_captured_traffic

    twelve = "one two three four five six seven eight nine ten eleven twelve"
    assert captured_openings([twelve, "too short to cut", twelve], 2) == [
        "one two three four",
        "one two three four five six seven eight",
    ]
    texts = [(task, f"{task} text {i}") for task in ("code", "math") for i in range(50)]
    prompts = [(task, f"{task} prompt {i}") for task in ("code", "math") for i in range(50)]
    traffic = [f"{i} {twelve}" for i in range(30)]
    plain = with_captured_traffic(texts, prompts, traffic, profile("test"))
    kept_texts, kept_prompts, count = with_captured_traffic(
        texts, prompts, traffic, profile("test").model_copy(update={"captured_openings": 2})
    )
    assert count == 90 == sum(task == "captured" for task, _ in kept_prompts)
    assert kept_texts == plain[0] and [p for p in kept_prompts if p[0] != "captured"] == [
        p for p in plain[1] if p[0] != "captured"
    ]


def test_the_minimum_counts_distinct_prompts_not_requests(workdir, caplog):
    """Twenty copies of one prompt passed the 20-prompt minimum and the retrain learned one prompt's answer."""
    import logging

    from draftsync.flows.sync import _retrain_prompts
    from draftsync.profiles import profile

    _declare(workdir, capture=True)
    _capture([PROSE[0]] * 25 + PROSE[1:5])
    with caplog.at_level(logging.INFO, logger="draftsync"):
        assert _retrain_prompts("traffic-llm", profile("test")) == ([], [])
    assert "5 distinct captured prompts, fewer than the 20 it needs" in caplog.text
    _capture(PROSE[5:25])
    trained, held = _retrain_prompts("traffic-llm", profile("test"))
    held_texts = [p.text for p in held]
    assert len(set(trained)) == len(trained) and not set(trained) & set(held_texts)
    assert sorted(trained + held_texts) == sorted(PROSE[:25])
    assert {p.max_tokens for p in held} <= {10, 11, 12}  # each replayed at the length its client asked for
