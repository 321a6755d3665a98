"""Registry tags: every key draftsync writes on a model version, and the typed readers and writers of them.

MLflow keeps a version's state in string tags. Each key is a constant here and no other module spells one;
flows, tasks and the CLI read a version through `TargetVersion.from_tags` / `DrafterVersion.from_tags` and
write through the helpers below, so a key renamed here is renamed everywhere. (Prefect event names, such as
`draftsync.target.version.created`, are not tags: they live in tasks/events.py.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.registry.target_layouts import TargetLayout
from draftsync.speculative.methods import drafter_family

KIND_TAG = "draftsync.kind"
TARGET_KIND = "target"
DRAFTER_KIND = "drafter"

# -- a target version: the checkpoint's facts and the task mix it serves ----------------------------------
TASK_MIX_TAG = "draftsync.task_mix"
ARCHITECTURE_TAG = "draftsync.architecture"
HIDDEN_SIZE_TAG = "draftsync.hidden_size"
NUM_HIDDEN_LAYERS_TAG = "draftsync.num_hidden_layers"
VOCAB_SIZE_TAG = "draftsync.vocab_size"
NUM_PARAMETERS_TAG = "draftsync.num_parameters"
# the decoder family (speculative/families.py) and, as JSON, what its config says about it (kv heads, rope, ...):
# written by every registration, filled in by a sync where a version registered by hand lacks them
FAMILY_TAG = "draftsync.family"
FEATURES_TAG = "draftsync.features"
TARGET_TAGS = (
    TASK_MIX_TAG,
    ARCHITECTURE_TAG,
    HIDDEN_SIZE_TAG,
    NUM_HIDDEN_LAYERS_TAG,
    VOCAB_SIZE_TAG,
    NUM_PARAMETERS_TAG,
)
# how the version stores its checkpoint (target_layouts.py), and what an MLmodel of the transformers flavor records
CHECKPOINT_LAYOUT_TAG = "draftsync.checkpoint.layout"
TORCH_DTYPE_TAG = "draftsync.transformers.torch_dtype"
HF_TASK_TAG = "draftsync.transformers.task"
TRANSFORMERS_VERSION_TAG = "draftsync.transformers.version"
SOURCE_MODEL_TAG = "draftsync.source_model.name"  # by reference: the hub repository and its commit
SOURCE_REVISION_TAG = "draftsync.source_model.revision"
# what a target checkpoint tells of itself (`checkpoint_tags`): every target tag but the task mix
CHECKPOINT_TAGS = (
    ARCHITECTURE_TAG,
    HIDDEN_SIZE_TAG,
    NUM_HIDDEN_LAYERS_TAG,
    VOCAB_SIZE_TAG,
    NUM_PARAMETERS_TAG,
    FAMILY_TAG,
    FEATURES_TAG,
)

# -- a drafter version: lineage, what it serves with, how it was trained ----------------------------------
TARGET_NAME_TAG = "draftsync.target.name"
TARGET_VERSION_TAG = "draftsync.target.version"  # the target version it was trained for
TARGET_MODEL_ID_TAG = "draftsync.target.model_id"  # ... its MLflow logged model, when it has one
TARGET_REVISION_TAG = "draftsync.target.revision"  # ... its hub commit, when logged by reference
METHOD_TAG = "draftsync.method"
GAMMA_TAG = "draftsync.gamma"  # the served gamma: validation's knee once validated
GAMMA_SCHEDULE_TAG = "draftsync.gamma_schedule"  # JSON [[first batch size, last, gamma], ...]
# vLLM's draft_sample_method validation found better at the deployment's temperature above 0 (greedy or
# probabilistic); absent where validation ran at T=0, where drafts are the argmax either way
DRAFT_SAMPLING_TAG = "draftsync.draft_sampling"
SYNC_KEY_TAG = "draftsync.sync_key"
SYNC_GENERATION_TAG = "draftsync.sync.generation"
TRAINING_PREFIX = "draftsync.training."
DATA_CHECK_FAILURES_TAG = "draftsync.data_checks.failed"
TRAINED_TASK_MIX_TAG = "draftsync.trained.task_mix"  # JSON shares its data and validation were built for
TRAINED_TASK_MIX_SOURCE_TAG = "draftsync.trained.task_mix_source"  # why those: declared, or the profile's default
# A target's own MTP head: "shipped" (as it came with the target version) or "refreshed" (fine-tuned by a sync on
# that version's own answers); a refreshed head names the shipped head's drafter version it started from, and a
# head the sync measured but did not serve says why.
MTP_HEAD_TAG = "draftsync.mtp_head"
MTP_HEAD_FROM_TAG = "draftsync.mtp_head.refreshed_from"
MTP_HEAD_VERDICT_TAG = "draftsync.mtp_head.verdict"
SHIPPED_HEAD, REFRESHED_HEAD = "shipped", "refreshed"

# -- its validation -------------------------------------------------------------------------------------
VALIDATION_PREFIX = "draftsync.validation."  # + each validation metric
VALIDATION_PASSED_TAG = "draftsync.validation.passed"
VALIDATION_STATUS_TAG = "draftsync.validation.status"  # pending | passed | failed
FAILED_GATES_TAG = "draftsync.validation.failed_gates"
GAMMA_KNEE_TAG = f"{VALIDATION_PREFIX}gamma_knee"  # the metric record_validation writes as a tag
GAMMA_REASON_TAG = f"{VALIDATION_PREFIX}gamma_reason"  # why the served gamma and not the fastest
VALIDATION_PROFILE_TAG = f"{VALIDATION_PREFIX}profile"
VALIDATION_BACKEND_TAG = f"{VALIDATION_PREFIX}backend"
VALIDATION_TEMPERATURE_TAG = f"{VALIDATION_PREFIX}temperature"
# What validation expects serving to measure: each figure as "point [low, high]", the served window it is for, and
# what it rests on. The monitor holds a pair's first window of serving to the acceptance mean's interval.
PREDICTION_PREFIX = "draftsync.prediction."
PREDICTION_FIGURES = ("mean", "p50", "p5")
PREDICTION_WINDOW_TAG = f"{PREDICTION_PREFIX}window_draft_tokens"
PREDICTION_BASIS_TAG = f"{PREDICTION_PREFIX}basis"
GATE_PREFIX = "draftsync.gate."  # + each checklist gate: pass | fail
BASELINE_ACCEPTANCE_TAG = "draftsync.baseline.acceptance_rate"
BASELINE_THRESHOLD_TAG = "draftsync.baseline.threshold"
CROSSCHECK_PREFIX = "draftsync.crosscheck.target_v"  # + the other target version it was checked against
PENDING, PASSED, FAILED = "pending", "passed", "failed"

# -- what the decision framework recommended for it ------------------------------------------------------
RECOMMENDED_PREFIX = "draftsync.recommended."
RECOMMENDED_METHOD_TAG = f"{RECOMMENDED_PREFIX}method"
RECOMMENDED_GAMMA_RANGE_TAG = f"{RECOMMENDED_PREFIX}gamma_range"
RECOMMENDED_GAMMA_START_TAG = f"{RECOMMENDED_PREFIX}gamma_start"
RECOMMENDED_APPLIED_TAG = f"{RECOMMENDED_PREFIX}applied"
RECOMMENDED_REASONS_TAG = f"{RECOMMENDED_PREFIX}reasons"
REASONS_MAX_CHARS = 4000


# -- writers ------------------------------------------------------------------------------------------------
def flag(value: bool | None) -> str:
    return "true" if value else "false"


def validation_status(passed: bool | None) -> str:
    return PENDING if passed is None else PASSED if passed else FAILED


def metric_value(value: Any) -> str:
    """A metric as a tag value: booleans as true/false, floats to six significant digits."""
    if isinstance(value, bool):
        return flag(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def validation_metric_tags(metrics: Mapping[str, Any]) -> dict[str, str]:
    return {f"{VALIDATION_PREFIX}{key}": metric_value(value) for key, value in metrics.items() if value is not None}


def target_tags(
    *,
    architecture: str,
    hidden_size: int,
    num_layers: int,
    vocab_size: int,
    parameter_count: int,
    task_mix: Mapping[str, float],
    family: str | None = None,
    features: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The tags `register_target` requires, as strings, with the family's when known;
    `target_tags(**describe_target(dir))` fits."""
    facts = checkpoint_tags(
        architecture=architecture,
        hidden_size=hidden_size,
        num_layers=num_layers,
        vocab_size=vocab_size,
        parameter_count=parameter_count,
        family=family,
        features=features,
    )
    return {TASK_MIX_TAG: json.dumps(dict(task_mix), sort_keys=True), **facts}


def checkpoint_tags(
    *,
    architecture: str,
    hidden_size: int,
    num_layers: int,
    vocab_size: int,
    parameter_count: int,
    family: str | None = None,
    features: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The target tags a checkpoint's config and weights tell (all but the task mix, which only its owner knows)."""
    tags = {
        ARCHITECTURE_TAG: str(architecture),
        HIDDEN_SIZE_TAG: str(int(hidden_size)),
        NUM_HIDDEN_LAYERS_TAG: str(int(num_layers)),
        VOCAB_SIZE_TAG: str(int(vocab_size)),
        NUM_PARAMETERS_TAG: str(int(parameter_count)),
    }
    if family is not None:
        tags[FAMILY_TAG] = str(family)
    if features is not None:
        tags[FEATURES_TAG] = json.dumps(dict(features), sort_keys=True)
    return tags


def layout_tags(layout: TargetLayout) -> dict[str, str]:
    """What a target version's layout tells: the layout, and the flavor's dtype, task, version and source model."""
    values = {
        CHECKPOINT_LAYOUT_TAG: layout.layout,
        TORCH_DTYPE_TAG: layout.torch_dtype,
        HF_TASK_TAG: layout.task,
        TRANSFORMERS_VERSION_TAG: layout.transformers_version,
        SOURCE_MODEL_TAG: layout.source_model,
        SOURCE_REVISION_TAG: layout.source_revision,
    }
    return {key: value for key, value in values.items() if value}


def target_link_tags(layout: TargetLayout) -> dict[str, str]:
    """A drafter's link to the exact target it was trained on, beyond the registered version: the target's MLflow
    logged model, and its hub commit when it was logged by reference."""
    values = {TARGET_MODEL_ID_TAG: layout.model_id, TARGET_REVISION_TAG: layout.source_revision}
    return {key: value for key, value in values.items() if value}


def check_target_tags(name: str, tags: Mapping[str, Any]) -> None:
    """Refuse a target registration whose tags are missing or whose task mix is not JSON."""
    missing = [key for key in TARGET_TAGS if not str(tags.get(key, "")).strip()]
    if missing:
        raise DraftsyncError(
            f"target {name}: required tags missing: {', '.join(missing)}",
            "pass them all; draftsync.registry.tags.target_tags(...) builds them from the checkpoint's facts",
        )
    try:
        json.loads(tags[TASK_MIX_TAG])
    except ValueError as error:
        raise DraftsyncError(
            f"target {name}: tag {TASK_MIX_TAG} is not JSON ({tags[TASK_MIX_TAG]!r})",
            'pass the task mix as a JSON object, e.g. {"code": 0.5, "math": 0.5}',
        ) from error


def drafter_tags(
    target_name: str,
    target_version: int,
    method: str,
    gamma: int,
    *,
    validation_passed: bool | None,
    metrics: Mapping[str, Any],
) -> dict[str, str]:
    """A new drafter version's lineage, served gamma and (pending, passed or failed) validation."""
    return {
        KIND_TAG: DRAFTER_KIND,
        TARGET_NAME_TAG: target_name,
        TARGET_VERSION_TAG: str(int(target_version)),
        METHOD_TAG: method,
        GAMMA_TAG: str(int(gamma)),
        VALIDATION_PASSED_TAG: flag(validation_passed),
        VALIDATION_STATUS_TAG: validation_status(validation_passed),
        **validation_metric_tags(metrics),
    }


def training_tags(
    training: Mapping[str, Any],
    generation: int,
    data_check_failures: int | None,
    task_mix: Mapping[str, float] | None = None,
    task_mix_source: str = "",
) -> dict[str, str]:
    """How a sync trained the drafter: its training summary, the retrain generation, failed data checks, the task
    mix it was built for and why that mix."""
    tags = {f"{TRAINING_PREFIX}{key}": str(value) for key, value in training.items()}
    tags[SYNC_GENERATION_TAG] = str(int(generation))
    if task_mix:
        tags[TRAINED_TASK_MIX_TAG] = json.dumps(dict(task_mix), sort_keys=True)
        tags[TRAINED_TASK_MIX_SOURCE_TAG] = task_mix_source
    if data_check_failures is not None:
        tags[DATA_CHECK_FAILURES_TAG] = str(int(data_check_failures))
    return tags


def checklist_tags(
    gates: Iterable[tuple[str, bool]],
    *,
    profile: str,
    backend: str,
    temperature: float,
    acceptance_rate: float,
    threshold: float,
    schedule: Any = None,
    gamma_reason: str = "",
    prediction: Mapping[str, Any] | None = None,
    draft_sampling: str | None = None,
) -> dict[str, str]:
    """A validation's gates, where it ran, the next iteration's baseline, the per-batch-size schedule, why the
    served gamma was chosen and the draft sampling it was measured best with (None: not chosen, at T=0)."""
    tags = {f"{GATE_PREFIX}{name}": "pass" if passed else "fail" for name, passed in gates}
    tags.update(
        {
            VALIDATION_PROFILE_TAG: profile,
            VALIDATION_BACKEND_TAG: backend,
            VALIDATION_TEMPERATURE_TAG: str(temperature),
            BASELINE_ACCEPTANCE_TAG: str(acceptance_rate),
            BASELINE_THRESHOLD_TAG: str(threshold),
        }
    )
    if schedule:
        tags[GAMMA_SCHEDULE_TAG] = json.dumps(schedule)
    if gamma_reason:
        tags[GAMMA_REASON_TAG] = gamma_reason
    if draft_sampling:
        tags[DRAFT_SAMPLING_TAG] = draft_sampling
    if prediction:
        tags.update(prediction_tags(prediction))
    return tags


def prediction_tags(prediction: Mapping[str, Any]) -> dict[str, str]:
    """A validation's prediction (`validation.result.Prediction.as_dict()`) as tags a person reads in the MLflow UI."""
    tags = {
        f"{PREDICTION_PREFIX}acceptance_{name}": "{:.3f} [{:.3f}, {:.3f}]".format(*prediction[name])
        for name in PREDICTION_FIGURES
    }
    tags[PREDICTION_WINDOW_TAG] = str(int(prediction["window_draft_tokens"]))
    tags[PREDICTION_BASIS_TAG] = (
        f"{prediction['traffic']} ({prediction['requests']} requests), gamma {prediction['gamma']}, "
        f"T={prediction['temperature']:g}, {prediction['level']:.0%} of served windows"
    )
    return tags


@dataclass(frozen=True)
class PredictedAcceptance:
    """The acceptance mean validation predicted for a served window of `window_draft_tokens` drafted tokens."""

    point: float
    low: float
    high: float
    window_draft_tokens: int

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> PredictedAcceptance | None:
        """None when the version carries no prediction (registered by hand, or validated before predictions)."""
        text, window = tags.get(f"{PREDICTION_PREFIX}acceptance_mean"), as_int(tags.get(PREDICTION_WINDOW_TAG))
        match = re.fullmatch(r"\s*([0-9.]+)\s*\[\s*([0-9.]+)\s*,\s*([0-9.]+)\s*\]\s*", text or "")
        if match is None or window is None:
            return None
        point, low, high = (float(x) for x in match.groups())
        return cls(point, low, high, window)


def crosscheck_tag(target_version: int) -> str:
    """The key of a validation against a target version other than the one the drafter was trained for."""
    return f"{CROSSCHECK_PREFIX}{int(target_version)}"


def recommended_tags(
    method: str, gamma_range: Iterable[int], gamma_start: int, applied: bool, reasons: str
) -> dict[str, str]:
    return {
        RECOMMENDED_METHOD_TAG: method,
        RECOMMENDED_GAMMA_RANGE_TAG: json.dumps(list(gamma_range)),
        RECOMMENDED_GAMMA_START_TAG: str(gamma_start),
        RECOMMENDED_APPLIED_TAG: flag(applied),
        RECOMMENDED_REASONS_TAG: reasons[:REASONS_MAX_CHARS],
    }


def drafter_description(tags: Mapping[str, str]) -> str:
    """The drafter version's description in the MLflow UI (markdown): what it drafts for, down to the target's exact
    model, with a link to that target version, the gamma it serves and its validation verdict."""
    target, version = tags.get(TARGET_NAME_TAG), tags.get(TARGET_VERSION_TAG)
    text = f"{tags.get(METHOD_TAG)} drafter for [{target} version {version}](#/models/{target}/versions/{version})"
    if tags.get(TARGET_MODEL_ID_TAG):
        text += f" (MLflow model {tags[TARGET_MODEL_ID_TAG]})"
    if tags.get(TARGET_REVISION_TAG):
        text += f", hub revision {tags[TARGET_REVISION_TAG]}"
    if tags.get(GAMMA_TAG):
        text += f"; serves gamma {tags[GAMMA_TAG]}"
    mix = tags.get(TRAINED_TASK_MIX_TAG)
    if mix:
        shares = ", ".join(f"{task} {share:.2f}" for task, share in sorted(json.loads(mix).items()))
        text += f". Trained for the task mix {shares}: {tags.get(TRAINED_TASK_MIX_SOURCE_TAG) or 'declared'}"
    status = tags.get(VALIDATION_STATUS_TAG) or "pending"
    failed = tags.get(FAILED_GATES_TAG)
    text += f". Validation: {status}"
    if failed and failed != "none":
        text += f" (failed gates: {failed.replace(',', ', ')})"
    return text + "."


# -- readers ------------------------------------------------------------------------------------------------
def as_int(text: str | None) -> int | None:
    """A version, gamma or count tag as an int; metric tags may read "3" or "3.0"; anything else None."""
    if text is None or not str(text).strip():
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_gamma_range(text: str | None) -> list[int] | None:
    """`[2, 4]` (JSON), `2-4`, `2,4` or `2..4` as [lo, hi]; one number as [n, n]; anything else None."""
    if text is None or not str(text).strip():
        return None
    try:
        value = json.loads(text)
    except ValueError:
        value = [int(n) for n in re.findall(r"\d+", text)]
    if isinstance(value, (int, float)):
        value = [value, value]
    if not isinstance(value, list) or not 1 <= len(value) <= 2:
        return None
    try:
        numbers = [int(v) for v in value]
    except (TypeError, ValueError):
        return None
    return [min(numbers), max(numbers)]


def measured_gamma(tags: Mapping[str, str]) -> int | None:
    """The knee validation measured; the version's gamma tag once validated (a pending one is only configured)."""
    knee = as_int(tags.get(GAMMA_KNEE_TAG))
    if knee is not None:
        return knee
    if tags.get(VALIDATION_STATUS_TAG) in (PASSED, FAILED):
        return as_int(tags.get(GAMMA_TAG))
    return None


def recommended_gamma(tags: Mapping[str, str]) -> dict[str, Any] | None:
    """What the decision framework recommended for this drafter, or None when the sync recorded nothing."""
    start = as_int(tags.get(RECOMMENDED_GAMMA_START_TAG))
    gamma_range = parse_gamma_range(tags.get(RECOMMENDED_GAMMA_RANGE_TAG))
    if start is None and gamma_range is None:
        return None
    return {"start": start, "range": gamma_range, "method": tags.get(RECOMMENDED_METHOD_TAG)}


def is_target(tags: Mapping[str, str] | None) -> bool:
    return (tags or {}).get(KIND_TAG) == TARGET_KIND


def trained_for_version(model_name: str, version: int, tags: Mapping[str, str]) -> int:
    """The target version a drafter version was trained for (its lineage tag); a missing or bad tag is named."""
    raw = tags.get(TARGET_VERSION_TAG)
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        found = f"no {TARGET_VERSION_TAG} tag" if raw is None else f"{TARGET_VERSION_TAG}={raw!r}"
        raise DraftsyncError(
            f"drafter {model_name} version {version} has {found}: the target version it was trained for is unknown",
            f"set {TARGET_VERSION_TAG} on the version to that target version, or register drafters with "
            "`draftsync sync` (it writes the lineage tags)",
        ) from error


@dataclass(frozen=True)
class TargetVersion:
    """A target version as its tags describe it. `task_mix()` and `parameter_count()` name a bad tag."""

    name: str
    version: int | None
    tags: Mapping[str, str]

    @classmethod
    def from_tags(cls, name: str, version: int | None, tags: Mapping[str, str] | None) -> TargetVersion:
        return cls(name, None if version is None else int(version), dict(tags or {}))

    @property
    def architecture(self) -> str | None:
        return self.tags.get(ARCHITECTURE_TAG)

    @property
    def hidden_size(self) -> int | None:
        return as_int(self.tags.get(HIDDEN_SIZE_TAG))

    @property
    def num_hidden_layers(self) -> int | None:
        return as_int(self.tags.get(NUM_HIDDEN_LAYERS_TAG))

    @property
    def vocab_size(self) -> int | None:
        return as_int(self.tags.get(VOCAB_SIZE_TAG))

    @property
    def family(self) -> str | None:
        """The decoder family (llama, qwen3, ...); None on a version no registration or sync has tagged yet."""
        return self.tags.get(FAMILY_TAG)

    def mtp_head(self) -> str | None:
        """The family of the MTP head the version ships (its drafter is that head); None: none, or untagged."""
        return (self.features() or {}).get("mtp_head")

    def features(self) -> dict[str, Any] | None:
        """What the config says about the family's variant (kv heads, head_dim, rope, ...); None when untagged."""
        raw = self.tags.get(FEATURES_TAG)
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise DraftsyncError(
                f"target {self.name}: registry tag {FEATURES_TAG}={raw!r} is not a JSON object",
                "delete the tag; the next sync of the version sets it again from the checkpoint",
            )
        return value

    def task_mix(self) -> dict[str, float] | None:
        """The declared task mix as shares; None when the version declares none."""
        raw = self.tags.get(TASK_MIX_TAG)
        if not raw:
            return None
        try:
            return {str(task): float(share) for task, share in json.loads(raw).items()}
        except (ValueError, TypeError, AttributeError) as error:
            raise DraftsyncError(
                f"target {self.name}: registry tag {TASK_MIX_TAG}={raw!r} is not a JSON object of shares",
                'set it on the version to e.g. {"code": 0.5, "math": 0.5}',
            ) from error

    def parameter_count(self) -> int:
        """The parameter count; missing or not a count, the error says how to set it."""
        raw = self.tags.get(NUM_PARAMETERS_TAG)
        try:
            return int(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError) as error:
            raise DraftsyncError(
                f"target {self.name}: registry tag {NUM_PARAMETERS_TAG} is {'missing' if raw is None else repr(raw)}",
                "register versions with draftsync (it tags them from the checkpoint), or set the draftsync.* target "
                "tags on the version (draftsync.registry.tags.target_tags lists them)",
            ) from error


@dataclass(frozen=True)
class DrafterVersion:
    """A drafter version as its tags describe it: lineage, method, gamma, validation, recommendation.

    Fields are None where nothing was recorded; `trained_for_version()`, `served_gamma()` and
    `gamma_schedule()` are the strict readers a rollout needs, and name the tag when it is missing or bad."""

    name: str
    version: int
    target_name: str | None
    trained_for: int | None
    method: str | None
    gamma: int | None
    gamma_measured: int | None
    validation: str  # pending | passed | failed | unknown (no status tag)
    validation_passed: bool
    recommended_method: str | None
    recommended_gamma_range: list[int] | None
    recommended_gamma_start: int | None
    data_check_failures: int | None
    tags: Mapping[str, str]
    draft_sampling: str | None = None  # validation's measured choice at T>0 (DRAFT_SAMPLING_TAG)
    mtp_head: str | None = None  # a target's own head: shipped | refreshed (MTP_HEAD_TAG); None for a trained drafter

    @classmethod
    def from_tags(cls, name: str, version: int, tags: Mapping[str, str]) -> DrafterVersion:
        return cls(
            name=name,
            version=int(version),
            target_name=tags.get(TARGET_NAME_TAG),
            trained_for=as_int(tags.get(TARGET_VERSION_TAG)),
            method=tags.get(METHOD_TAG),
            gamma=as_int(tags.get(GAMMA_TAG)),
            gamma_measured=measured_gamma(tags),
            validation=tags.get(VALIDATION_STATUS_TAG, "unknown"),
            validation_passed=tags.get(VALIDATION_PASSED_TAG) == "true",
            recommended_method=tags.get(RECOMMENDED_METHOD_TAG),
            recommended_gamma_range=parse_gamma_range(tags.get(RECOMMENDED_GAMMA_RANGE_TAG)),
            recommended_gamma_start=as_int(tags.get(RECOMMENDED_GAMMA_START_TAG)),
            data_check_failures=as_int(tags.get(DATA_CHECK_FAILURES_TAG)),
            tags=dict(tags),
            draft_sampling=tags.get(DRAFT_SAMPLING_TAG),
            mtp_head=tags.get(MTP_HEAD_TAG),
        )

    @property
    def family(self) -> str | None:
        return drafter_family(self.method) if self.method else None

    @property
    def gamma_recommended(self) -> dict[str, Any] | None:
        return recommended_gamma(self.tags)

    def trained_for_version(self) -> int:
        return trained_for_version(self.name, self.version, self.tags)

    def served_gamma(self) -> int:
        if self.gamma is None:
            raise DraftsyncError(
                f"drafter {self.name} version {self.version} has no {GAMMA_TAG} tag",
                "register drafters with `draftsync sync`, which writes the gamma it serves with",
            )
        return self.gamma

    def trained_task_mix(self) -> dict[str, float] | None:
        """The task mix its data was built for (TRAINED_TASK_MIX_TAG); None where not recorded or not JSON."""
        try:
            mix = json.loads(self.tags.get(TRAINED_TASK_MIX_TAG) or "null")
        except ValueError:
            return None
        return {str(task): float(share) for task, share in mix.items()} if isinstance(mix, dict) else None

    def gamma_schedule(self) -> list | None:
        raw = self.tags.get(GAMMA_SCHEDULE_TAG)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as error:
            raise DraftsyncError(
                f"drafter {self.name} version {self.version} has {GAMMA_SCHEDULE_TAG}={raw!r}, which is not JSON",
                "validate the version again (it rewrites the schedule), or delete the tag",
            ) from error
