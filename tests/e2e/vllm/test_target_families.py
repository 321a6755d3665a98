"""Every built-in target family (Llama 3, Qwen 3, Qwen 2.5, Mistral) served with each drafter method by real vLLM.

Per family: its tiny test-size target (transformers' own class with that family's settings, trained briefly and
cached by recipe), one briefly trained drafter of each method, each served by vLLM at gamma 3 next to a plain
server of the same target. At T=0 on the same prompts, vLLM's acceptance must be within 0.05 of the reference
engine's, and in float32 vLLM's speculative output must equal its plain output token for token. The outputs cross
the Mistral target's 64-token window. The table is written to `families.json` in the test's temp folder and
printed (`-s` shows it).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.e2e.vllm.conftest import FAMILIES as METHODS
from tests.e2e.vllm.conftest import FamilyDrafters
from tests.e2e.vllm.test_engine_agreement import TOLERANCE, _prompt_ids, _reference_run, _vllm_run
from tests.support.servers import vllm_process

pytestmark = pytest.mark.vllm

TARGET_FAMILIES = ("llama3", "qwen3", "qwen2", "mistral")
GAMMA = 3
MAX_TOKENS = 72  # prompts of 20-60 tokens: every output crosses the Mistral target's 64-token window


def family_target(family: str, tmp_path: Path) -> Path:
    """The family's v1 test-size target, built once per recipe into the test cache (as `built_targets` is)."""
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe

    cache = Path(
        os.environ.get("DRAFTSYNC_TEST_CACHE", Path(__file__).resolve().parents[3] / ".draftsync" / "test-cache")
    )
    cached = build_target(builtin_recipe(1, "test", family), cache)
    return Path(shutil.copytree(cached, tmp_path / f"{family}-{cached.name}"))


def _family_rows(family: str, engine, tmp_path: Path, methods: tuple[str, ...] = METHODS) -> list[dict]:
    target_dir = family_target(family, tmp_path)
    drafters = dict(FamilyDrafters(target_dir, tmp_path / f"{family}-drafters", methods))
    prompt_ids = _prompt_ids(target_dir)
    plain_server = vllm_process(engine, target_dir, None, "eagle3", 0, tmp_path)
    try:
        plain_server.wait_healthy(timeout=600)
        plain, _, _ = _vllm_run(plain_server.url, prompt_ids, MAX_TOKENS)
    finally:
        plain_server.stop()
    rows = []
    # Two methods' servers start side by side (start-up is mostly waiting); requests go one server at a time.
    for pair in (methods[:2], methods[2:]):
        servers = {
            method: vllm_process(engine, target_dir, drafters[method], method, GAMMA, tmp_path) for method in pair
        }
        try:
            measured = {}
            for method, server in servers.items():
                server.wait_healthy(timeout=600)
                measured[method] = _vllm_run(server.url, prompt_ids, MAX_TOKENS)
        finally:
            for server in servers.values():
                server.stop()
        for method, (outputs, draft_tokens, accepted) in measured.items():
            reference = _reference_run(target_dir, drafters[method], GAMMA, prompt_ids, MAX_TOKENS)
            rows.append(
                {
                    "family": family,
                    "method": method,
                    "gamma": GAMMA,
                    "vllm_acceptance": round(accepted / max(draft_tokens, 1), 4),
                    "reference_acceptance": round(reference["acceptance"], 4),
                    "vllm_draft_tokens": draft_tokens,
                    "lossless": outputs == plain,
                    "reference_equals_vllm_plain": reference["outputs"] == plain,
                }
            )
    return rows


@pytest.mark.timeout(2400)  # 13 min on 2 busy cores (four targets to build on a fresh machine, 20 vLLM starts)
def test_every_target_family_serves_every_method_on_vllm_as_the_reference_engine_does(vllm_engine, tmp_path):
    rows = [row for family in TARGET_FAMILIES for row in _family_rows(family, vllm_engine, tmp_path)]
    table = json.dumps(rows, indent=1)
    (tmp_path / "families.json").write_text(table)
    print(table)
    for row in rows:
        assert row["lossless"], row  # speculation changed vLLM's greedy output
        assert row["vllm_draft_tokens"] > 0, row
        assert abs(row["vllm_acceptance"] - row["reference_acceptance"]) <= TOLERANCE, row
    for family in TARGET_FAMILIES:
        best = max(row["vllm_acceptance"] for row in rows if row["family"] == family)
        # 120 steps on a 250-step target: the best method reached 0.25 (llama3) to 0.46 (qwen3) in one run; an
        # untrained drafter, or one whose rope or window vLLM reads otherwise, is accepted far less.
        assert best > 0.2, f"{family}: drafters this poor prove nothing"
