"""The knee clears the serving monitor's stale line as well as the gate: the checklist run end to end on a scripted
backend whose fastest gamma accepts under the stale line (the arithmetic of the knee: test_checklist.py)."""

from __future__ import annotations

import pytest
from draftsync.profiles import ValidationProfile
from draftsync.serving.evaluation import EvalRequest, RequestResult
from draftsync.validation.runner import run_checklist

# gamma -> (acceptance per draft token, decode seconds per request): gamma 3 is the fastest but accepts 0.65.
SCRIPT = {0: (0.0, 2.0), 2: (0.80, 1.2), 3: (0.65, 1.0)}
OUTPUT_TOKENS = 40


class ScriptedBackend:
    """Returns the same figures for every request at a gamma, and the target's greedy tokens (all zeros) at any."""

    name = "scripted"
    max_gamma = 3
    cheap_gamma_switch = True

    def generate(self, requests: list[EvalRequest], gamma: int, temperature: float, seed: int) -> list[RequestResult]:
        rate, seconds = SCRIPT[gamma]
        drafts = OUTPUT_TOKENS // (1 + gamma) if gamma else 0
        accepted = round(rate * drafts * gamma)
        return [
            RequestResult(
                index=i,
                task=r.task,
                prompt_tokens=5,
                output_tokens=r.max_tokens,
                drafts=drafts,
                draft_tokens=drafts * gamma,
                accepted=accepted,
                accepted_per_position=[],
                seconds=seconds,
                ttft_s=0.0,
                token_ids=[0] * r.max_tokens,
            )
            for i, r in enumerate(requests)
        ]

    def endpoint(self, gamma: int, schedule: list | None = None) -> str:
        raise AssertionError("stress is off in these runs")

    def prepare_endpoints(self, gammas) -> None:
        raise AssertionError("stress is off in these runs")

    def close(self) -> None:
        pass


PROFILE = ValidationProfile(
    name="scripted",
    backend="reference",
    requests=8,
    max_tokens=OUTPUT_TOKENS,
    gamma_range=(2, 3),
    sweep_requests=8,
    min_acceptance=0.55,
    min_p50=0.55,
    min_p5=0.30,
    min_speedup=0.0,
    stress_requests=0,
    long_requests=1,
    long_max_tokens=OUTPUT_TOKENS,
    min_long_acceptance=0.0,
    max_memory_overhead=10.0,
)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    """A tiny target and drafter on disk: the checklist reads the target's context length and both weight sizes."""
    from tests.serving.tiny_models import build_tiny_drafter, build_tiny_target

    root = tmp_path_factory.mktemp("knee")
    target_dir = build_tiny_target(root / "target")
    return str(target_dir), str(build_tiny_drafter(target_dir, root / "drafter", gamma=3))


def checklist(pair, stale_threshold):
    return run_checklist(ScriptedBackend(), *pair, {"code": 1.0}, PROFILE, stale_threshold=stale_threshold)


def test_the_knee_is_the_fastest_gamma_that_clears_the_gate_without_a_stale_line(pair):
    result = checklist(pair, None)
    assert (result.gamma_fastest, result.gamma_knee) == (3, 3)


def test_a_stale_line_above_the_gate_moves_the_knee_to_a_gamma_that_clears_it(pair):
    result = checklist(pair, 0.70)
    assert (result.gamma_fastest, result.gamma_knee) == (3, 2)
    # The gates are still the profile's: the mean is judged against 0.55, not the stale line.
    gate = next(g for g in result.gates if g.name == "validation_acceptance_mean")
    assert gate.threshold == 0.55 and gate.passed
