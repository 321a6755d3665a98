"""What a validation found, typed: the checklist's measurements, and the verdict on one drafter version.

The flows, the registry step and the CLI read attributes, so a misspelt field fails mypy rather than a run.
The JSON that users and scripts read (`draftsync validate --json`, a sync's `validation`, validation.json)
comes from `as_dict()` and `report_dict()` alone: their keys change only with a note to those users, and
tests/unit/validation/test_validation_result.py pins them. Figures are stored rounded as they are reported, so
the JSON, the MLflow metrics and the Prefect artifacts all show the same numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from draftsync.records import record_dict
from draftsync.validation.checklist import AcceptanceSummary, Gate


@dataclass(frozen=True)
class AcceptanceFigures:
    """Acceptance at the deployment's temperature: pooled mean and percentiles of per-request rates."""

    mean: float
    p5: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, summary: AcceptanceSummary) -> AcceptanceFigures:
        return cls(*(round(getattr(summary, name), 4) for name in ("mean", "p5", "p50", "p90", "p99")))


@dataclass(frozen=True)
class TpotMs:
    """Pooled time per output token at the knee, with speculation and without."""

    spec: float
    plain: float


@dataclass(frozen=True)
class MemoryFootprint:
    """Weight bytes of the drafter against the target's (the memory-overhead gate's figure)."""

    drafter_bytes: int
    target_bytes: int
    overhead: float


@dataclass(frozen=True)
class RequestCounts:
    """How many requests each measurement ran, the length the long-output check asked for, and how many engines
    the checklist's own requests started (vLLM: a server per gamma; the reference engine starts none)."""

    validation: int
    sweep: int
    long: int
    long_max_tokens: int
    stress: int
    engine_starts: int = 0


@dataclass(frozen=True)
class Prediction:
    """The acceptance validation expects serving to measure, at the served gamma and temperature, over a window of
    `window_draft_tokens` drafted tokens of the traffic it was measured on (`stats.predicted_acceptance`): each
    figure as [point, low, high]. The monitor holds the pair's first window of serving to it."""

    traffic: str  # which requests it rests on: the validation set, or held-out captured traffic
    requests: int
    gamma: int
    temperature: float
    window_draft_tokens: int
    level: float
    mean: tuple[float, float, float]
    p50: tuple[float, float, float]
    p5: tuple[float, float, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            **{name: [round(x, 4) for x in getattr(self, name)] for name in ("mean", "p50", "p5")},
        }


@dataclass(frozen=True)
class DraftSamplingFigures:
    """One draft sampling method's sweep at the deployment's temperature and its knee: what the choice compares."""

    gamma_knee: int
    gamma_fastest: int
    tpot_ms: float  # at its knee
    plain_tpot_ms: float  # plain decoding on the sweep's requests (NaN where none was measured)
    speedup: float  # plain / speculative TPOT at its knee
    acceptance_rate: float  # at its knee, with the sweep's lower bound
    acceptance_rate_lower: float
    mean_acceptance_length: float
    clears_floor: bool  # the knee's acceptance bound clears the floor the knee must clear
    gamma_sweep: list[dict[str, Any]]


@dataclass(frozen=True)
class DraftSamplingChoice:
    """How the served pair samples its drafts (vLLM's draft_sample_method), chosen by measurement. At T>0 both
    methods are swept and the better at its knee serves; at T=0 drafts are the argmax either way: nothing to choose
    (`chosen` None, `measured` empty)."""

    chosen: str | None
    reason: str
    measured: dict[str, DraftSamplingFigures] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "measured": {name: asdict(figures) for name, figures in self.measured.items()},
        }


@dataclass(frozen=True)
class ChecklistResult:
    """The checklist's measurements on one (target, drafter) pair and its gates (`runner.run_checklist`)."""

    profile: str
    backend: str
    temperature: float
    gates: tuple[Gate, ...]
    gamma_sweep: list[dict[str, Any]]  # per gamma: gamma, mean_acceptance_length, acceptance_rate(_lower), tpot_ms
    gamma_knee: int
    gamma_fastest: int  # the best TPOT whatever its acceptance (the knee must also clear the gate)
    # Why the served gamma (the knee) and not the fastest: a tie, the gate, a step-down. Keyword-only, so that it
    # stands here, next to the gammas, in as_dict() while it keeps its default.
    knee_reason: str = field(default="", kw_only=True)
    # Both draft sampling methods at T>0 and the one the knee and the rollout use; None where nothing recorded it.
    draft_sampling: DraftSamplingChoice | None = field(default=None, kw_only=True)
    # Gammas validated before the knee and stepped down from, each with the acceptance gates it failed: [{gamma,
    # failed_gates}]; empty when the sweep's knee cleared them.
    gammas_rejected: list[dict[str, Any]]
    sweep_plain_tpot_ms: float
    acceptance: AcceptanceFigures
    acceptance_greedy: float
    mean_acceptance_length: float
    acceptance_by_position: list[float]
    acceptance_by_length: list[dict[str, Any]]  # `checklist.acceptance_by_length`'s buckets
    tpot_ms: TpotMs
    speedup: float
    stress: dict[str, Any] | None  # `stress.stress_comparison` (and `schedule_check`); None when not run
    # vLLM's num_speculative_tokens_per_batch_size, when stress ran per batch size: [(start, end, gamma)]
    speculation_schedule: list[tuple[int, int, int]] | None
    speculation_schedule_note: str | None  # why the drafter's method takes no schedule
    memory: MemoryFootprint
    requests: RequestCounts
    # The per-request table (requests.csv, the suite's input): too long for the JSON, so not in as_dict().
    rows: list[dict[str, Any]] = field(repr=False)
    # At the knee, on held-out prompts of the traffic a retrain learnt from; None when no traffic was given.
    captured_acceptance: AcceptanceFigures | None = None
    prediction: Prediction | None = None  # None when nothing drafted at the knee

    @property
    def passed(self) -> bool:
        return all(gate.passed for gate in self.gates)

    @property
    def failed_gates(self) -> list[str]:
        return [gate.name for gate in self.gates if not gate.passed]

    def as_dict(self) -> dict[str, Any]:
        """The fields in their order, the verdict after the temperature, captured acceptance only where measured."""
        out = record_dict(
            self,
            omit={"rows", "captured_acceptance", "prediction"},
            draft_sampling=self.draft_sampling.as_dict() if self.draft_sampling else None,
            after={"temperature": {"passed": self.passed}},
            gates=[gate.to_dict() for gate in self.gates],
            acceptance=asdict(self.acceptance),
            tpot_ms=asdict(self.tpot_ms),
            memory=asdict(self.memory),
            requests=asdict(self.requests),
        )
        if self.captured_acceptance:
            out["captured_acceptance"] = asdict(self.captured_acceptance)
        if self.prediction:
            out["prediction"] = self.prediction.as_dict()
        return out


@dataclass(frozen=True)
class SuiteExpectation:
    """One expectation of the validation suite: its stable name, what it saw, its verdict, what it wanted and the GE
    expectation behind it."""

    name: str
    observed: Any
    passed: bool
    expected: str
    expectation: str


@dataclass(frozen=True)
class SuiteResult:
    """The Great Expectations suite over a validation's per-request results (`suite.run_validation_suite`)."""

    expectations: tuple[SuiteExpectation, ...]  # in a fixed order
    acceptance_quantiles: dict[str, float | None]  # P5, P50, P90, P99 of per-request acceptance (None: nothing drafted)

    @property
    def failed(self) -> list[str]:
        """The expectations that failed, by name, in the suite's order; the suite passed when there are none."""
        return [expectation.name for expectation in self.expectations if not expectation.passed]

    @property
    def passed(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        """suite.json, and a validation's `suite`."""
        return {
            "passed": self.passed,
            **record_dict(self, expectations=[asdict(expectation) for expectation in self.expectations]),
        }


@dataclass(frozen=True)
class ValidationResult:
    """One drafter version validated against one target version: the checklist, the Great Expectations suite
    over its per-request results (`suite.run_validation_suite`), and whether it was promoted."""

    checklist: ChecklistResult
    suite: SuiteResult
    target_name: str
    target_version: int
    drafter_name: str
    drafter_version: int
    trained_for_target_version: int  # differs from target_version in a cross-check
    promoted: bool
    reports_dir: str

    @property
    def passed(self) -> bool:
        """Every gate and every expectation of the suite."""
        return self.checklist.passed and self.suite.passed

    def report_dict(self) -> dict[str, Any]:
        """validation.json: written before the promotion it may lead to, into reports_dir, so neither is in it."""
        return {
            **self.checklist.as_dict(),
            "passed": self.passed,  # the checklist's key, now with the suite's verdict too
            **record_dict(self, omit={"checklist", "promoted", "reports_dir"}, suite=self.suite.as_dict()),
        }

    def as_dict(self) -> dict[str, Any]:
        """`draftsync validate --json` and a sync's `validation`."""
        return {**self.report_dict(), "promoted": self.promoted, "reports_dir": self.reports_dir}


def knee_reason(
    sweep: list[dict[str, Any]], knee: int, fastest: int, rejected: list[dict[str, Any]], tolerance: float, floor: float
) -> str:
    """Why `knee` serves: the fastest TPOT, a near-tie with the fastest (the smaller gamma wins), an acceptance
    under the gate's floor at the fastest, or a step-down from gammas that failed the acceptance gates."""
    rows = {int(row["gamma"]): row for row in sweep}
    if rejected:
        steps = "; ".join(f"gamma {r['gamma']} failed {', '.join(r['failed_gates'])}" for r in rejected)
        return f"validation stepped down to it from larger gammas that failed acceptance gates ({steps})"
    if knee == fastest:
        return "it has the best TPOT of the sweep"
    fast, served = rows.get(fastest, {}), rows.get(knee, {})
    fast_ms, served_ms = fast.get("tpot_ms"), served.get("tpot_ms")
    if fast_ms and served_ms and served_ms <= fast_ms * (1 + tolerance):
        return (
            f"gamma {fastest} is fastest ({fast_ms:.2f} ms) and gamma {knee} ({served_ms:.2f} ms) is within the "
            f"knee tolerance of {tolerance:.0%}: a tie goes to the smaller gamma"
        )
    rate = fast.get("acceptance_rate_lower", fast.get("acceptance_rate"))
    return (
        f"gamma {fastest} is fastest but its acceptance ({rate:.2f}, with the sweep's sampling error) does not "
        f"clear {floor:.2f}; gamma {knee} is the fastest that does"
        if rate is not None
        else f"the fastest, gamma {fastest}, was not measured well enough to be chosen"
    )
