"""vLLM and the reference engine agree on the same drafters: the proof that our checkpoint formats are read right.

For each drafter family a sync can train, one drafter (trained briefly on the built-in test target) is served
by real vLLM at two gammas and run by the reference engine on the same prompts at T=0. Acceptance rates must
agree within 0.05 and, in float32, vLLM's speculative output must equal its plain output token for token.
The measured table is written to `agreement.json` in the test's temp folder and printed (`-s` shows it).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.e2e.vllm.conftest import FAMILIES, MAX_GAMMA
from tests.support.servers import vllm_process

pytestmark = pytest.mark.vllm

GAMMAS = (2, MAX_GAMMA)
PROMPTS = 6
MAX_TOKENS = 32
TOLERANCE = 0.05


def _prompt_ids(target_dir: Path) -> list[list[int]]:
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.targets import load_target

    _, tokenizer = load_target(target_dir)
    texts = prompts("code", PROMPTS // 2, seed=21) + prompts("math", PROMPTS - PROMPTS // 2, seed=22)
    return [tokenizer(text)["input_ids"] for text in texts]


def _vllm_run(url: str, prompt_ids: list[list[int]], max_tokens: int = MAX_TOKENS) -> tuple[list[list[int]], int, int]:
    """Greedy completions of token-id prompts (EOS ignored, like the reference engine): outputs and counts."""
    outputs, draft_tokens, accepted = [], 0, 0
    with httpx.Client(base_url=url, timeout=300) as client:
        for ids in prompt_ids:
            response = client.post(
                "/v1/completions",
                json={
                    "model": "agree",
                    "prompt": ids,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "return_token_ids": True,
                },
            )
            assert response.status_code == 200, response.text
            body = response.json()
            outputs.append(body["choices"][0]["token_ids"])
            stats = (body.get("metrics") or {}).get("speculative_decoding") or {}
            draft_tokens += stats.get("num_draft_tokens", 0)
            accepted += stats.get("num_accepted_draft_tokens", 0)
    return outputs, draft_tokens, accepted


def _reference_run(
    target_dir: Path, drafter_dir: Path, gamma: int, prompt_ids: list[list[int]], max_tokens: int = MAX_TOKENS
) -> dict:
    from draftsync.speculative.engine.decoding import SpeculativeEngine
    from draftsync.speculative.methods.registry import load_drafter
    from draftsync.speculative.targets import load_target

    model, _ = load_target(target_dir)
    engine = SpeculativeEngine(model, load_drafter(drafter_dir), gamma)
    draft_tokens = accepted = 0
    outputs = []
    for ids in prompt_ids:
        generation = engine.generate(ids, max_tokens, temperature=0.0)
        draft_tokens += generation.stats.draft_tokens
        accepted += generation.stats.accepted
        outputs.append(list(generation.token_ids))
    return {"outputs": outputs, "acceptance": accepted / draft_tokens}


# EAGLE-3, what a sync trains by default, and DFlash, the block drafter, are the smoke tier's (CI's) families; the
# rest run in `make test-vllm`.
SMOKE_FAMILIES = ("eagle3", "dflash")


@pytest.mark.parametrize(
    "families",
    [
        pytest.param(SMOKE_FAMILIES, marks=pytest.mark.smoke, id="eagle3-dflash"),
        pytest.param(tuple(f for f in FAMILIES if f not in SMOKE_FAMILIES), id="others"),
    ],
)
def test_vllm_and_the_reference_engine_agree_for_every_family(
    vllm_engine, built_targets, family_drafters, families, tmp_path
):
    target_dir = built_targets[1]
    prompt_ids = _prompt_ids(target_dir)
    rows, plain = [], None
    for family in families:
        drafter_dir = family_drafters[family]
        # A family's servers start side by side (start-up is mostly waiting); requests go one server at a time.
        servers = {
            gamma: vllm_process(vllm_engine, target_dir, drafter_dir, family, gamma, tmp_path) for gamma in GAMMAS
        }
        if plain is None:
            servers[0] = vllm_process(vllm_engine, target_dir, None, family, 0, tmp_path)
        try:
            for server in servers.values():
                server.wait_healthy(timeout=600)
            if plain is None:
                plain, _, _ = _vllm_run(servers[0].url, prompt_ids)
            measured = {gamma: _vllm_run(servers[gamma].url, prompt_ids) for gamma in GAMMAS}
        finally:
            for server in servers.values():
                server.stop()
        for gamma, (outputs, draft_tokens, accepted) in measured.items():
            reference = _reference_run(target_dir, drafter_dir, gamma, prompt_ids)
            rows.append(
                {
                    "family": family,
                    "gamma": gamma,
                    "vllm_acceptance": round(accepted / draft_tokens, 4),
                    "reference_acceptance": round(reference["acceptance"], 4),
                    "vllm_draft_tokens": draft_tokens,
                    "lossless": outputs == plain,
                    "reference_equals_vllm_plain": reference["outputs"] == plain,
                }
            )
    table = json.dumps(rows, indent=1)
    (tmp_path / "agreement.json").write_text(table)
    print(table)
    for row in rows:
        assert row["lossless"], row  # speculation changed vLLM's greedy output
        assert row["vllm_draft_tokens"] > 0, row
        assert abs(row["vllm_acceptance"] - row["reference_acceptance"]) <= TOLERANCE, row
    assert max(row["vllm_acceptance"] for row in rows) > 0.3, "drafters this poor prove nothing"
