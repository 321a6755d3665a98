"""At a temperature above 0 the checklist sweeps both of vLLM's draft sampling methods, and the knee, every later
measurement and the record use the better; at T=0 it measures once and says the choice does not apply. Run end to
end on scripted backends, request by request (the reference engine's way) and gamma by gamma (vLLM's)."""

from __future__ import annotations

import pytest

from tests.integration.validation.test_knee_floor import PROFILE, ScriptedBackend

# (draft sampling, gamma) -> (acceptance per draft token, decode seconds per request); plain decoding: 2.0 s.
# Sampled drafts accept more at T>0 and are faster at their knee (gamma 3); greedy drafts are fastest at gamma 2.
BY_SAMPLING = {
    "greedy": {0: (0.0, 2.0), 2: (0.60, 1.5), 3: (0.45, 1.6)},
    "probabilistic": {0: (0.0, 2.0), 2: (0.80, 1.2), 3: (0.70, 1.0)},
}


class SamplingBackend(ScriptedBackend):
    """The scripted figures of the draft sampling it is set to; every call is logged with that setting."""

    def __init__(self, cheap: bool = True, by_sampling=BY_SAMPLING):
        self.cheap_gamma_switch = cheap
        self.by_sampling = by_sampling
        self.draft_sampling: str | None = None
        self.calls: list[tuple[str | None, int, float]] = []

    @property
    def script(self):  # type: ignore[override]
        return self.by_sampling[self.draft_sampling or "greedy"]

    def generate(self, requests, gamma, temperature, seed):
        self.calls.append((self.draft_sampling, gamma, temperature))
        return super().generate(requests, gamma, temperature, seed)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[str, str]:
    from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

    root = tmp_path_factory.mktemp("sampling")
    target_dir = build_tiny_target(root / "target")
    return str(target_dir), str(build_tiny_drafter(target_dir, root / "drafter", gamma=3))


def run(pair, backend, temperature: float):
    from draftsync.validation.runner import run_checklist

    profile = PROFILE.model_copy(update={"temperature": temperature})
    return run_checklist(backend, *pair, {"code": 1.0}, profile)


@pytest.mark.parametrize("cheap", [True, False], ids=["request-by-request", "gamma-by-gamma"])
def test_at_t1_both_methods_are_swept_and_the_better_serves(pair, cheap):
    backend = SamplingBackend(cheap)
    result = run(pair, backend, 1.0)
    choice = result.draft_sampling
    assert choice is not None and choice.chosen == "probabilistic"
    assert set(choice.measured) == {"greedy", "probabilistic"}
    assert (choice.measured["greedy"].gamma_knee, choice.measured["probabilistic"].gamma_knee) == (2, 3)
    assert choice.measured["probabilistic"].speedup == pytest.approx(2.0)
    assert choice.measured["greedy"].speedup == pytest.approx(2.0 / 1.5, abs=1e-3)
    assert "fastest at its knee" in choice.reason
    # the knee and the served figures are the chosen method's
    assert result.gamma_knee == 3 and result.acceptance.mean == pytest.approx(0.70, abs=0.02)
    assert result.gamma_sweep == choice.measured["probabilistic"].gamma_sweep
    swept = {(s, g) for s, g, t in backend.calls if g and t > 0}
    assert {("greedy", 2), ("greedy", 3), ("probabilistic", 2), ("probabilistic", 3)} <= swept
    first_chosen = next(i for i, call in enumerate(backend.calls) if call[0] == "probabilistic")
    after_sweeps = backend.calls[first_chosen:]
    assert all(s == "probabilistic" for s, g, _ in after_sweeps if g)  # nothing after the sweeps runs greedy drafts
    as_json = result.as_dict()["draft_sampling"]
    assert as_json["chosen"] == "probabilistic" and set(as_json["measured"]["greedy"]) >= {"speedup", "gamma_knee"}


def test_a_method_whose_knee_does_not_clear_the_floor_loses_to_one_that_does(pair):
    slow_but_sound = {
        "greedy": {0: (0.0, 2.0), 2: (0.80, 1.3), 3: (0.70, 1.25)},
        "probabilistic": {0: (0.0, 2.0), 2: (0.50, 1.0), 3: (0.40, 0.9)},
    }
    choice = run(pair, SamplingBackend(True, slow_but_sound), 1.0).draft_sampling
    assert choice is not None and choice.chosen == "greedy"
    assert "clears the acceptance floor" in choice.reason


def test_a_tie_goes_to_vllms_default(pair):
    tied = {"greedy": BY_SAMPLING["probabilistic"], "probabilistic": BY_SAMPLING["probabilistic"]}
    choice = run(pair, SamplingBackend(True, tied), 1.0).draft_sampling
    assert choice is not None and choice.chosen == "greedy"


@pytest.mark.parametrize("cheap", [True, False], ids=["request-by-request", "gamma-by-gamma"])
def test_at_t0_it_is_measured_once_and_does_not_apply(pair, cheap):
    backend = SamplingBackend(cheap)
    result = run(pair, backend, 0.0)
    choice = result.draft_sampling
    assert choice is not None and choice.chosen is None and choice.measured == {}
    assert "does not apply at T=0" in choice.reason
    assert {s for s, _, _ in backend.calls} == {None}  # the backend's own setting, never switched
    assert result.as_dict()["draft_sampling"] == {"chosen": None, "reason": choice.reason, "measured": {}}
