"""The sync's result keeps the keys users read (the flow's return value, `draftsync sync --json`, demo.json).

Inside a sync the results are typed; each turns into the dict the flow returned before it was (same keys, same
order, same value types), which these tests pin."""

from __future__ import annotations

import json

from draftsync.flows.sync import HeadVerdict, SkippedSync, SyncResult
from draftsync.planning.recommendation import recommend
from draftsync.planning.stages import StagePlan
from draftsync.planning.sync_plan import SyncPlan
from draftsync.planning.worker import Worker
from draftsync.planning.workload import Workload
from draftsync.tasks.dataset import DatasetBuild
from draftsync.tasks.drafting import SpeculatorsTrainingSummary, TrainingSummary
from draftsync.tasks.heads import HeadRefresh
from draftsync.tasks.planning import Advice
from draftsync.validation.data_checks import DataCheckReport, ExpectationOutcome

from tests.unit.validation.test_validation_result import sample_validation

SYNC_KEYS = [
    "target_name",
    "target_version",
    "drafter_name",
    "drafter_version",
    "method",
    "gamma",
    "recommendation",
    "passed",
    "validation",
    "training",
    "dataset",
    "data_checks",
    "stages_s",
    "generation",
    "plan",
    "mtp_head",
]
SKIPPED_KEYS = ["target_name", "target_version", "method", "skipped", "drafter_version", "run_id"]

TRAINING = TrainingSummary(
    method="eagle3",
    steps=20,
    resumed_from_step=0,
    seconds=12.3,
    tokens_per_s=4567,
    final_loss=1.2346,
    top1_agreement=0.5123,
    position_accuracy=(0.5123, 0.3001),
    warm_start=False,
    train_processes=1,
    draft_vocab_size=512,
    parameters=123456,
    parameters_pct_of_target=7.89,
    aux_layer_ids=(1, 2, 3),
)
# what the train-drafter task returned as a dict, key for key
TRAINING_DICT = {
    "method": "eagle3",
    "steps": 20,
    "resumed_from_step": 0,
    "seconds": 12.3,
    "tokens_per_s": 4567,
    "final_loss": 1.2346,
    "top1_agreement": 0.5123,
    "position_accuracy": [0.5123, 0.3001],
    "warm_start": False,
    "train_processes": 1,
    "draft_vocab_size": 512,
    "parameters": 123456,
    "parameters_pct_of_target": 7.89,
    "aux_layer_ids": [1, 2, 3],
}
CHECKS = DataCheckReport(
    sequences=8, outcomes=[ExpectationOutcome("expect_column_values_to_not_be_null(x)", "no NaN", 0, "0", True)]
)
DATASET = DatasetBuild(
    path="/w/dataset",
    sequences=8,
    tokens=800,
    loss_tokens=600,
    texts=6,
    generated=2,
    captured=0,
    response_writer="transformers",
    states_engine="vllm",
    tasks={"code": {"sequences": 8, "tokens": 800, "loss_tokens": 600}},
    checks=CHECKS,
)
DATASET_DICT = {
    "path": "/w/dataset",
    "sequences": 8,
    "tokens": 800,
    "loss_tokens": 600,
    "texts": 6,
    "generated": 2,
    "captured": 0,
    "response_writer": "transformers",
    "states_engine": "vllm",
    "tasks": {"code": {"sequences": 8, "tokens": 800, "loss_tokens": 600}},
}
RECOMMENDATION = recommend(
    Workload(params_b=70, gpus=4, gpu_memory_gb=80, tpot_ms=50, task="chat", output_tokens=1024, batch=1)
)
ADVICE = Advice(RECOMMENDATION, applied=False, assumptions=("no deployment serves llm: 1 x 80 GB GPU assumed",))
PLAN = SyncPlan(
    target="llm",
    parameters=1000,
    worker=Worker(gpus=0, gpu_memory_gib=0.0, host_memory_gib=64.0, disk_gib=100.0),
    stages=(StagePlan("training", 0.0, 1.5, 0.1, 0.01, {"device": "cpu"}),),
    settings={"target_placement": "cpu", "servers": None},
    reasons={"target": "no GPU"},
)


def sample_result(**changes) -> SyncResult:
    fields = dict(
        target_name="llm",
        target_version=2,
        drafter_name="llm-drafter",
        drafter_version=3,
        method="eagle3",
        gamma=4,
        recommendation=ADVICE,
        passed=True,
        validation=sample_validation(),
        training=TRAINING,
        dataset=DATASET,
        stages_s={"dataset": 1.0},
        generation=1,
        plan=PLAN,
    )
    return SyncResult(**{**fields, **changes})


def test_a_sync_result_has_exactly_the_keys_users_read():
    result = sample_result()
    out = result.as_dict()
    assert list(out) == SYNC_KEYS
    assert out["validation"] == result.validation.as_dict()  # typed inside, JSON keys outside
    assert out["plan"] == PLAN.to_dict()
    assert out["stages_s"] == {"dataset": 1.0} and out["generation"] == 1
    assert sample_result(plan=None).as_dict()["plan"] is None
    json.dumps(out)  # JSON all the way down


def test_the_training_summary_is_the_dict_the_training_task_returned():
    out = TRAINING.as_dict()
    assert list(out) == list(TRAINING_DICT) and out == TRAINING_DICT
    assert [type(v) for v in out.values()] == [type(v) for v in TRAINING_DICT.values()]
    assert sample_result().as_dict()["training"] == TRAINING_DICT
    # a drafter that reads no aux states has no aux_layer_ids key
    medusa = TrainingSummary(**{**TRAINING.__dict__, "method": "medusa", "aux_layer_ids": None})
    assert list(medusa.as_dict()) == [key for key in TRAINING_DICT if key != "aux_layer_ids"]


def test_a_speculators_training_summary_keeps_its_own_keys():
    summary = SpeculatorsTrainingSummary(
        method="eagle3",
        epochs=2,
        checkpoint="/w/speculators/checkpoints/2",
        seconds=30.5,
        warm_start=True,
        train_processes=2,
        draft_vocab_size=512,
        parameters=1000,
        aux_layer_ids=(1, 2, 3),
    )
    assert summary.as_dict() == {
        "method": "eagle3",
        "trainer": "speculators",
        "epochs": 2,
        "checkpoint": "/w/speculators/checkpoints/2",
        "seconds": 30.5,
        "warm_start": True,
        "train_processes": 2,
        "draft_vocab_size": 512,
        "parameters": 1000,
        "aux_layer_ids": [1, 2, 3],
    }
    assert list(summary.as_dict())[:2] == ["method", "trainer"]


def test_the_dataset_and_its_checks_are_the_dicts_the_dataset_task_returned():
    out = sample_result().as_dict()
    assert list(out["dataset"]) == list(DATASET_DICT) and out["dataset"] == DATASET_DICT
    assert out["data_checks"] == {
        "sequences": 8,
        "passed": True,
        "outcomes": [
            {
                "name": "expect_column_values_to_not_be_null(x)",
                "check": "no NaN",
                "observed": 0,
                "expected": "0",
                "passed": True,
            }
        ],
    }


def test_the_recommendation_is_the_frameworks_dict_with_applied_and_assumptions():
    out = sample_result().as_dict()["recommendation"]
    assert out == {
        **RECOMMENDATION.to_dict(),
        "applied": False,
        "assumptions": ["no deployment serves llm: 1 x 80 GB GPU assumed"],
    }
    assert list(out) == [
        "method",
        "gamma_range",
        "gamma_start",
        "expected_speedup",
        "drafter_memory_gb",
        "fits",
        "memory",
        "reasons",
        "applied",
        "assumptions",
    ]
    assert isinstance(out["gamma_range"], list) and isinstance(out["assumptions"], list)


def test_a_skipped_sync_has_exactly_the_keys_users_read():
    assert list(SkippedSync("llm", 2, "eagle3", "done", 3, "run-1").as_dict()) == SKIPPED_KEYS


def test_a_target_heads_sync_keeps_every_key_with_no_dataset_and_its_verdict():
    refresh = HeadRefresh(samples=160, captured=0, steps=300, lr=0.002, first_loss=4.1, final_loss=2.9, seconds=61.2)
    verdict = HeadVerdict(3, 0.41, True, 0.62, 4, 0.66, True, "refreshed", "refreshed, as the shipped head was stale")
    out = sample_result(method="mtp", training=refresh, dataset=None, mtp_head=verdict).as_dict()
    assert list(out) == SYNC_KEYS  # the same keys as a trained drafter's: none missing for a head
    assert out["dataset"] is None and out["data_checks"] is None
    assert out["training"] == {
        "samples": 160, "captured": 0, "steps": 300, "lr": 0.002, "first_loss": 4.1, "final_loss": 2.9,
        "seconds": 61.2,
    }  # fmt: skip
    assert out["mtp_head"]["promoted"] == "refreshed" and out["mtp_head"]["shipped_acceptance"] == 0.41
    assert sample_result(method="mtp", training=None, dataset=None, mtp_head=verdict).as_dict()["training"] is None
    assert sample_result().as_dict()["mtp_head"] is None
    json.dumps(out)
