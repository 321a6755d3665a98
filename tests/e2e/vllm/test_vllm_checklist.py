"""The checklist on real vLLM servers: every request counted by vLLM itself, the sweep grouped by engine, stress and
the per-batch-size schedule against served pairs with real continuous batching.

The drafter is one of the session's briefly trained ones (conftest.py), so the thresholds are at zero except where
vLLM must hold exactly: in float32, speculative output equals plain output token for token (the fallback gate).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from draftsync.errors import DraftsyncError
from draftsync.profiles import ValidationProfile
from transformers import AutoTokenizer

pytestmark = pytest.mark.vllm

PROFILE = ValidationProfile(
    name="vllm-test",
    backend="vllm",
    requests=4,
    max_tokens=24,
    gamma_range=(2, 3),
    sweep_requests=2,
    min_acceptance=0.0,
    min_p50=0.0,
    min_p5=0.0,
    min_speedup=0.0,
    stress_requests=4,
    stress_concurrency=2,
    schedule_batch_sizes=(1, 2),
    long_requests=1,
    long_max_tokens=64,
    min_long_acceptance=0.0,
    length_buckets=(0, 32),
    max_memory_overhead=10.0,
)
MIX = {"code": 0.5, "math": 0.5}


def test_per_request_counts_are_vllms_own_and_add_up_to_its_counters(vllm_engine, built_targets, family_drafters):
    """What each response reports is what the server counted: the per-request counts of a run sum to the delta of
    the server's own /metrics counters around it, position by position."""
    from draftsync.monitors.metrics import delta, scrape_counters
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.validation.runner import validation_requests

    requests = validation_requests(MIX, 4, 24, seed=5)
    backend = VllmBackend(built_targets[1], family_drafters["eagle3"], log_dir=built_targets[1].parent / "logs")
    try:
        backend.generate(requests[:1], 3, 0.0, 0)  # starts the server (and warms it up)
        url = backend.server(3).url
        before = scrape_counters(f"{url}/metrics")
        results = backend.generate(requests, 3, 0.0, 0)
        counted, _ = delta(before, scrape_counters(f"{url}/metrics"))
        # The checklist's requests end at the target's EOS, on the same server: the same tokens, cut there.
        ended = backend.generate([dataclasses.replace(r, ignore_eos=False) for r in requests], 3, 0.0, 0)
        if vllm_engine.sampled_speculation_fault():  # the CPU build: a sampled speculative request is refused
            with pytest.raises(DraftsyncError, match="temperature 1 on this vLLM") as refused:
                backend.generate(requests[:1], 3, 1.0, 0)
            assert "--backend reference" in refused.value.fix
    finally:
        backend.close()
    assert backend.starts == 1  # one server for gamma 3, reused
    assert counted.drafts == sum(r.drafts for r in results) > 0
    assert counted.draft_tokens == sum(r.draft_tokens for r in results)
    assert counted.accepted == sum(r.accepted for r in results)
    assert list(counted.accepted_per_position) == [sum(r.accepted_per_position[i] for r in results) for i in range(3)]
    for result in results:
        assert result.output_tokens == 24  # ignore_eos: the same load as the reference engine
        assert 0 < result.ttft_s < result.seconds and result.tpot_ms > 0  # vLLM's own timestamps
    eos = AutoTokenizer.from_pretrained(str(built_targets[1])).eos_token_id
    assert any(eos in r.token_ids for r in results), "the test needs a request the target ends early"
    for full, cut in zip(results, ended, strict=True):
        ids = full.token_ids
        assert cut.token_ids == (ids[: ids.index(eos) + 1] if eos in ids else ids)


@pytest.mark.smoke
def test_the_checklist_runs_on_vllm_with_one_start_per_gamma(vllm_engine, built_targets, family_drafters, tmp_path):
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.validation.runner import run_checklist

    target_dir, drafter_dir = str(built_targets[1]), str(family_drafters["eagle3"])
    backend = VllmBackend(target_dir, drafter_dir, log_dir=tmp_path)
    try:
        result = run_checklist(
            backend,
            target_dir,
            drafter_dir,
            MIX,
            PROFILE,
            data_check_failures=0,
            batch_sizes=PROFILE.schedule_batch_sizes,
        )
    finally:
        backend.close()
    assert result.backend == "vllm"
    # Gamma 3, then gamma 2 (the sweep runs downwards); the knee's requests and the speculative half of stress reuse
    # the last server unless the knee is 3; then one plain server (its requests and stress), one with the schedule.
    assert [row["gamma"] for row in result.gamma_sweep] == [2, 3]
    assert backend.starts == result.requests.engine_starts == 4 + (result.gamma_knee != 2)

    gates = {gate.name: gate for gate in result.gates}
    validation = [row for row in result.rows if row["phase"] == "validation"]
    assert len(validation) == PROFILE.requests and all(row["draft_tokens"] > 0 for row in validation)
    rates = np.array([row["acceptance_rate"] for row in validation], dtype=float)
    assert gates["acceptance_p50"].value == pytest.approx(float(np.percentile(rates, 50)))
    assert gates["acceptance_p5"].value == pytest.approx(float(np.percentile(rates, 5)))
    pooled = sum(row["accepted"] for row in validation) / sum(row["draft_tokens"] for row in validation)
    assert gates["acceptance_at_deployment_temperature"].value == pytest.approx(pooled)
    assert gates["fallback_equivalence"].value == 1.0  # float32: lossless, token for token
    assert math.isfinite(gates["tpot_speedup"].value)

    stress_result = result.stress
    assert stress_result is not None and stress_result["errors"] == 0
    assert sorted(stress_result["by_batch_size"]) == [1, 2]
    schedule = result.speculation_schedule
    assert schedule and schedule[0][0] == 1 and schedule[-1][1] == 2
    assert all(k in (0, result.gamma_knee) for _, _, k in schedule)
    check = stress_result["schedule_check"]  # relaunched with the schedule, loaded at each concurrency again
    assert sorted(check) == [1, 2] and all(level["scheduled_ms_per_token"] > 0 for level in check.values())


def test_an_engine_that_dies_mid_run_is_named_with_its_log(vllm_engine, built_targets, family_drafters, tmp_path):
    import os
    import signal

    from draftsync.errors import DraftsyncError
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.validation.runner import validation_requests

    requests = validation_requests(MIX, 2, 16, seed=5)
    backend = VllmBackend(built_targets[1], family_drafters["eagle3"], log_dir=tmp_path)
    try:
        backend.generate(requests, 2, 0.0, 0)
        server = backend.server(2)
        os.killpg(server.pid, signal.SIGKILL)
        server.stop()
        with pytest.raises(DraftsyncError, match="vLLM serving the pair at gamma 2 died mid-run") as caught:
            backend.generate(requests, 2, 0.0, 0)
    finally:
        backend.close()
    assert str(server.log_path) in caught.value.what
    assert "stays a candidate" in caught.value.fix and "resumes at validation" in caught.value.fix
