"""A target's own MTP head on vLLM's CPU build (method mtp), lossless at T=0: the head target v1 shipped with, the
same head beside the fine-tuned v2 (stale: the fine-tune left it as it was), and that head refreshed on v2's own
answers (the trunk frozen). Each pair is served at gammas 1 to 3 and its acceptance and knee are measured; the
reference engine, running draftsync's own head on the same prompts, agrees with vLLM on the refreshed head.
The table is written to `mtp_heads.json` in the test's temp folder and printed (`-s` shows it)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.support.servers import vllm_process

pytestmark = pytest.mark.vllm

GAMMAS = (1, 2, 3)
PROMPTS = 4  # a task
MAX_TOKENS = 48
REFRESH_STEPS = 150
TOLERANCE = 0.05


def _served(url: str, prompt_ids: list[list[int]]) -> dict:
    """Greedy completions one request at a time: outputs, acceptance, and a request's mean time a token."""
    outputs, drafted, accepted, per_token = [], 0, 0, []
    with httpx.Client(base_url=url, timeout=300) as client:
        for ids in prompt_ids:
            started = time.perf_counter()
            response = client.post(
                "/v1/completions",
                json={"model": "mtp", "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
                      "return_token_ids": True},
            )  # fmt: skip
            per_token.append((time.perf_counter() - started) * 1000 / MAX_TOKENS)
            assert response.status_code == 200, response.text
            body = response.json()
            outputs.append(body["choices"][0]["token_ids"])
            stats = (body.get("metrics") or {}).get("speculative_decoding") or {}
            drafted += stats.get("num_draft_tokens", 0)
            accepted += stats.get("num_accepted_draft_tokens", 0)
    return {"outputs": outputs, "drafted": drafted, "accepted": accepted, "tpot_ms": sum(per_token) / len(per_token)}


def _load(target_dir: Path):
    from draftsync.speculative.targets import load_target

    return load_target(target_dir)


def _reference_acceptance(target_dir: Path, head, gamma: int, prompt_ids: list[list[int]]) -> float:
    from draftsync.speculative.engine.decoding import SpeculativeEngine

    model, _ = _load(target_dir)
    engine = SpeculativeEngine(model, head, gamma)
    drafted = accepted = 0
    for ids in prompt_ids:
        stats = engine.generate(ids, MAX_TOKENS, temperature=0.0).stats
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted
    return accepted / drafted


def test_a_shipped_head_goes_stale_with_its_fine_tuned_target_and_a_refresh_brings_it_back(
    vllm_engine, built_mimo_targets, tmp_path
):
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.data.responses import generate_responses
    from draftsync.speculative.methods.checkpoint_files import SavedFor
    from draftsync.speculative.methods.mtp.checkpoint import read_shipped_mtp, save_mtp
    from draftsync.speculative.train.mtp_refresh import refresh_head
    from draftsync.validation.checklist import gamma_knee

    v1, v2 = built_mimo_targets[1], built_mimo_targets[2]
    model, tokenizer = _load(v2)
    tasks = ("code", "math", "prose")
    held_out = [tokenizer(text)["input_ids"] for i, task in enumerate(tasks) for text in prompts(task, PROMPTS, 21 + i)]
    answered = [text for i, task in enumerate(tasks) for text in prompts(task, 32, 31 + i, "train")]
    samples = list(zip(*generate_responses(model, tokenizer, answered, 64), strict=True))
    refreshed = read_shipped_mtp(v2)
    losses = refresh_head(model, refreshed, samples, steps=REFRESH_STEPS)
    saved_for = SavedFor(str(v2), ("MiMoForCausalLM",), max(GAMMAS))
    refreshed_dir = save_mtp(refreshed, tmp_path / "refreshed-head", saved_for)

    # method mtp with the target itself as the head's directory: vLLM reads the head the checkpoint ships
    pairs = {"v1 shipped head": (v1, v1), "v2 stale head": (v2, v2), "v2 refreshed head": (v2, refreshed_dir)}
    plain = {}
    for target_dir in (v1, v2):
        server = vllm_process(vllm_engine, target_dir, None, "mtp", 0, tmp_path, name="mtp")
        try:
            server.wait_healthy(timeout=600)
            plain[target_dir] = _served(server.url, held_out)["outputs"]
        finally:
            server.stop()
    rows = []
    for pair, (target_dir, head_dir) in pairs.items():
        servers = {g: vllm_process(vllm_engine, target_dir, head_dir, "mtp", g, tmp_path, name="mtp") for g in GAMMAS}
        try:
            for server in servers.values():
                server.wait_healthy(timeout=600)
            measured = {gamma: _served(server.url, held_out) for gamma, server in servers.items()}
        finally:
            for server in servers.values():
                server.stop()
        sweep = [
            {"gamma": g, "acceptance_rate": m["accepted"] / m["drafted"], "tpot_ms": m["tpot_ms"]}
            for g, m in measured.items()
        ]
        rows.append(
            {
                "pair": pair,
                "acceptance": {g: round(m["accepted"] / m["drafted"], 4) for g, m in measured.items()},
                "tpot_ms": {g: round(m["tpot_ms"], 2) for g, m in measured.items()},
                "knee": gamma_knee(sweep),
                "lossless": all(m["outputs"] == plain[target_dir] for m in measured.values()),
                "drafted": {g: m["drafted"] for g, m in measured.items()},
            }
        )
    reference = _reference_acceptance(v2, refreshed, 3, held_out)
    first, last = losses[:20], losses[-20:]  # a batch's loss swings with its tasks' entropy: means of 20 steps
    table = {
        "pairs": rows,
        "refresh_loss_first_last_20": [sum(first) / len(first), sum(last) / len(last)],
        "reference_refreshed_gamma3": reference,
    }
    (tmp_path / "mtp_heads.json").write_text(json.dumps(table, indent=1))
    print(json.dumps(table, indent=1))

    by_pair = {row["pair"]: row for row in rows}
    for row in rows:
        assert row["lossless"], row  # the head changed vLLM's greedy output
        assert all(count > 0 for count in row["drafted"].values()), row
    shipped, stale, fresh = (by_pair[p]["acceptance"][3] for p in pairs)
    assert stale < shipped - 0.05, "the fine-tune left the head as good as it was: nothing went stale"
    assert fresh > stale + 0.1, "the refresh did not bring the stale head back"
    assert abs(by_pair["v2 refreshed head"]["acceptance"][3] - reference) <= TOLERANCE  # our head is vLLM's
