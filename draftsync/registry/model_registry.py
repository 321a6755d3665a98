"""Target and drafter versions in the MLflow model registry: artifacts, lineage tags, aliases.

Stages are deprecated in MLflow, so state lives in version tags and aliases: a drafter version
carries the target version it was trained for, and the aliases `candidate` (registered, not
serving), `production` (serving) and `previous` (what `production` pointed at before the last flip).
Checkpoints are logged as plain files (safetensors + config), never as pickled models. The tag keys and
their readers are in tags.py, the outage errors in outages.py, the checks before an upload in checkpoint_checks.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_text, masked_url
from draftsync.registry.checkpoint_checks import check_checkpoint_dir, check_name
from draftsync.registry.downloads import download_once
from draftsync.registry.outages import NamedOutages, first_line, is_outage, quick_http
from draftsync.registry.tags import (
    FAILED_GATES_TAG,
    GAMMA_TAG,
    KIND_TAG,
    METHOD_TAG,
    PENDING,
    SYNC_KEY_TAG,
    TARGET_KIND,
    TARGET_VERSION_TAG,
    VALIDATION_PASSED_TAG,
    VALIDATION_STATUS_TAG,
    check_target_tags,
    drafter_description,
    drafter_tags,
    flag,
    validation_metric_tags,
    validation_status,
)
from draftsync.registry.target_layouts import FLAVOR, PLAIN, TargetLayout, check_flavor, read_layout
from draftsync.speculative.methods import REGISTERED_METHODS
from draftsync.user_files import make_folder

if TYPE_CHECKING:
    from mlflow import MlflowClient

EXPERIMENT_NAME = "draftsync"
MAX_VERSION = 2**63 - 1  # a model version is a 64-bit integer in every MLflow store
# The MLflow UI opens an experiment in its model-training view (runs, metrics, models), not its GenAI (traces) one.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_DEVELOPMENT = "custom_model_development"
CHECKPOINT_ARTIFACT_PATH = "checkpoint"
REPORTS_ARTIFACT_PATH = "reports"

CANDIDATE = "candidate"
PRODUCTION = "production"
PREVIOUS = "previous"


@dataclass(frozen=True)
class ModelVersionInfo:
    """One registered version as plain data, so callers never handle MLflow entities."""

    name: str
    version: int
    source: str
    run_id: str | None
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)
    created_ms: int = 0
    model_id: str | None = None  # MLflow 3: the logged model the version was made from (its source `models:/m-...`)


def drafter_model_name(target_name: str) -> str:
    """Each target gets one drafter registered model; its versions say which target version they fit."""
    return f"{target_name}-drafter"


class Registry:
    """The draftsync view of an MLflow tracking server and model registry.

    `artifacts_dir` is where runs store their files when the tracking store is local (sqlite or a
    file path): without it MLflow would write ./mlruns in the current directory. Downloads are
    cached under `artifacts_dir/downloads` (or a temp folder when no artifacts_dir is given).
    """

    def __init__(self, tracking_uri: str, artifacts_dir: Path | None = None):
        self.tracking_uri = tracking_uri
        self.artifacts_dir = Path(artifacts_dir).resolve() if artifacts_dir is not None else None
        self._client_instance: MlflowClient | None = None
        self._experiment_id: str | None = None
        if tracking_uri.startswith("sqlite:///"):
            make_folder(
                Path(tracking_uri.removeprefix("sqlite:///")).parent,
                "the folder of MLflow's SQLite store,",
                "set MLFLOW_TRACKING_URI to a SQLite file in a folder you can write to (or unset it: the work dir's)",
            )

    # -- connection ---------------------------------------------------------------------------

    @property
    def _client(self) -> MlflowClient:
        if self._client_instance is None:
            from mlflow import MlflowClient

            client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
            self._client_instance = cast("MlflowClient", NamedOutages(client, self.tracking_uri))  # a proxy of it
        return self._client_instance

    def ping(self) -> None:
        """Fail fast, with the fix for the kind of store, when MLflow's store cannot be used: a database is tried once
        first (MLflow retries a database it cannot open for about 100 s), a server without MLflow's HTTP retries."""
        with quick_http():
            try:
                _connect_once(self.tracking_uri)
                self._client.search_experiments(max_results=1)
            except Exception as error:  # any transport or store failure means "not usable"
                cause = error.__cause__ if isinstance(error, DraftsyncError) and error.__cause__ else error
                raise DraftsyncError(
                    f"MLflow at {masked_url(self.tracking_uri)} is not reachable "
                    f"({masked_text(first_line(cause), self.tracking_uri)})",
                    _store_fix(self.tracking_uri),
                ) from error

    def _experiment(self) -> str:
        """The draftsync experiment, created with its artifact root under the work dir if needed."""
        if self._experiment_id is not None:
            return self._experiment_id
        from mlflow.exceptions import MlflowException

        existing = self._client.get_experiment_by_name(EXPERIMENT_NAME)
        if existing is not None:
            self._experiment_id = existing.experiment_id
            if existing.tags.get(EXPERIMENT_KIND_TAG) != MODEL_DEVELOPMENT:  # made before the kind was set
                self._client.set_experiment_tag(existing.experiment_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
            return self._experiment_id
        location = None
        if self.artifacts_dir is not None and not self.tracking_uri.startswith(("http://", "https://")):
            self.artifacts_dir.mkdir(parents=True, exist_ok=True)
            location = self.artifacts_dir.as_uri()
        try:
            self._experiment_id = self._client.create_experiment(
                EXPERIMENT_NAME, artifact_location=location, tags={EXPERIMENT_KIND_TAG: MODEL_DEVELOPMENT}
            )
        except MlflowException:  # created concurrently by another process
            experiment = self._client.get_experiment_by_name(EXPERIMENT_NAME)
            assert experiment is not None, "creating it failed because it exists"
            self._experiment_id = experiment.experiment_id
        return self._experiment_id

    # -- targets ------------------------------------------------------------------------------

    def register_target(
        self, name: str, checkpoint_dir: Path, tags: Mapping[str, str], *, flavor: str = PLAIN, confine: bool = True
    ) -> int:
        """Log a target checkpoint and register it as a new version of `name`.

        `flavor` PLAIN logs the checkpoint's files as run artifacts; FLAVOR logs it with the transformers flavor
        (`mlflow.transformers.log_model`), an MLflow 3 logged model MLflow's own tools load too. `confine=False`
        takes a checkpoint outside the model roots (a path the operator typed). The version is created only after
        every file is stored, so a failure leaves no version.
        """
        check_name(name)
        check_flavor(flavor)
        checkpoint_dir = check_checkpoint_dir(checkpoint_dir, "target", confine=confine)
        check_target_tags(name, tags)
        version_tags = {**{k: str(v) for k, v in tags.items()}, KIND_TAG: TARGET_KIND}
        if flavor == FLAVOR:
            return self._log_transformers_target(name, checkpoint_dir, version_tags)
        run_id = self._log_run(f"target {name}", checkpoint_dir, version_tags, metrics={}, reports_dir=None)
        return self._create_version(name, run_id, version_tags)

    def _log_transformers_target(self, name: str, checkpoint_dir: Path, tags: Mapping[str, str]) -> int:
        """The checkpoint as a transformers-flavor logged model, then a version made from it. The model is loaded
        in the checkpoint's own dtype and saved by MLflow (its log from a checkpoint path fails with transformers
        5's pipeline registry). Requirements are given, not inferred: inference loads the model once more."""
        import mlflow
        import mlflow.transformers
        import torch
        import transformers
        from packaging.version import Version

        model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype="auto")
        tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint_dir)
        torch_version = Version(torch.__version__).base_version
        requirements = [f"transformers=={transformers.__version__}", f"torch=={torch_version}"]
        mlflow.set_tracking_uri(self.tracking_uri)
        with mlflow.start_run(experiment_id=self._experiment(), run_name=f"target {name}", tags=dict(tags)) as run:
            logged = mlflow.transformers.log_model(
                {"model": model, "tokenizer": tokenizer},
                name="model",
                task="text-generation",
                torch_dtype=model.dtype,
                pip_requirements=requirements,
            )
        self._ensure_registered_model(name)
        version = self._client.create_model_version(
            name, logged.model_uri, run_id=run.info.run_id, tags=dict(tags), model_id=logged.model_id
        )
        return int(version.version)

    def target_versions_after(self, name: str, version: int) -> list[ModelVersionInfo]:
        """Versions of `name` newer than the watermark `version`, oldest first."""
        check_name(name)
        found = self._client.search_model_versions(f"name='{name}' and version_number > {int(version)}")
        return sorted((self._info(mv) for mv in found), key=lambda info: info.version)

    def has_model(self, name: str) -> bool:
        """Whether MLflow holds a registered model of this name (an outage raises)."""
        from mlflow.exceptions import MlflowException

        check_name(name)
        try:
            self._client.get_registered_model(name)
        except MlflowException as error:
            if error.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise
        return True

    def target_names(self) -> list[str]:
        """Registered models with versions tagged `draftsync.kind=target`, sorted."""
        found = self._client.search_model_versions(f"tags.`{KIND_TAG}` = '{TARGET_KIND}'")
        return sorted({mv.name for mv in found})

    def delete_version(self, name: str, version: int) -> None:
        """Take back a version whose registration could not finish (its run and artifacts stay for inspection)."""
        self._client.delete_model_version(name, str(version))

    def set_target_alias(self, name: str, alias: str, version: int) -> None:
        self._client.set_registered_model_alias(name, alias, str(version))

    # -- drafters -----------------------------------------------------------------------------

    def register_drafter(
        self,
        target_name: str,
        target_version: int,
        drafter_dir: Path,
        method: str,
        gamma: int,
        metrics: Mapping[str, float],
        extra_tags: Mapping[str, str] | None = None,
        *,
        validation_passed: bool | None,
        sync_key: str | None = None,
        reports_dir: Path | None = None,
        metric_history: Mapping[str, Sequence[tuple[int, float]]] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> int:
        """Register a drafter trained for `target_name` version `target_version`; alias it `candidate`.

        Metrics go to the run and, as `draftsync.validation.<name>` tags, onto the version, so the
        registry alone tells whether a version passed. `metric_history` (name -> [(step, value)], e.g. the
        training loss and per-position accuracy) is logged as step series, the curves of the run. With
        `sync_key`, a retried sync that already registered this drafter gets the same version back instead of
        a duplicate.
        """
        check_name(target_name)
        if method not in REGISTERED_METHODS:
            raise DraftsyncError(
                f"drafter method {method!r} is not one of {', '.join(REGISTERED_METHODS)}",
                "pass one of the supported methods",
            )
        if int(gamma) < 1:
            raise DraftsyncError(f"drafter gamma {gamma} is below 1", "pass the number of speculative tokens (>= 1)")
        drafter_dir = check_checkpoint_dir(drafter_dir, "drafter")
        model_name = drafter_model_name(target_name)
        if sync_key is not None:
            existing = self._drafter_with_sync_key(model_name, target_version, method, sync_key)
            if existing is not None:
                self._restore_candidate(model_name, existing)
                return existing
        tags = {
            **drafter_tags(
                target_name, target_version, method, gamma, validation_passed=validation_passed, metrics=metrics
            ),
            **{k: str(v) for k, v in (extra_tags or {}).items()},
        }
        if sync_key is not None:
            tags[SYNC_KEY_TAG] = sync_key
            self._close_abandoned_runs(sync_key)
        run_id = self._log_run(
            f"drafter {model_name} for {target_name} v{target_version}",
            drafter_dir,
            tags,
            metrics,
            reports_dir,
            metric_history,
            params,
        )
        version = self._create_version(model_name, run_id, tags, description=drafter_description(tags))
        self._client.set_registered_model_alias(model_name, CANDIDATE, str(version))
        return version

    def record_validation(
        self,
        target_name: str,
        drafter_version: int,
        *,
        passed: bool,
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        failed_gates: Sequence[str] = (),
        gamma: int | None = None,
        reports_dir: Path | None = None,
        metric_history: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    ) -> None:
        """Put a validation's results on an existing drafter version: metrics, curves and reports on its run,
        tags on the version and its run alike. The verdict is written last, so a crash half-way leaves the version
        unvalidated."""
        import math

        model_name = drafter_model_name(target_name)
        run_id = self.version_info(model_name, drafter_version).run_id
        assert run_id is not None, "register_drafter logs every drafter version from a run"
        if reports_dir is not None:
            self._client.log_artifacts(run_id, str(reports_dir), REPORTS_ARTIFACT_PATH)
        for key, value in metrics.items():
            if value is not None and math.isfinite(float(value)):
                self._client.log_metric(run_id, key, float(value))
        self._log_history(run_id, metric_history or {})
        updates: dict[str, str] = {**{k: str(v) for k, v in tags.items()}, **validation_metric_tags(metrics)}
        if gamma is not None:
            updates[GAMMA_TAG] = str(int(gamma))
        updates[FAILED_GATES_TAG] = ",".join(failed_gates) or "none"
        self._set_tags(model_name, drafter_version, updates, run_id)
        verdict = {VALIDATION_STATUS_TAG: validation_status(passed), VALIDATION_PASSED_TAG: flag(passed)}
        self._set_tags(model_name, drafter_version, verdict, run_id)
        description = drafter_description(self.version_tags(model_name, drafter_version))
        self._client.update_model_version(model_name, str(int(drafter_version)), description=description)

    def tag_version(self, model_name: str, version: int, key: str, value: str) -> None:
        self._set_tags(model_name, version, {key: value}, self.version_info(model_name, version).run_id)

    def _set_tags(self, model_name: str, version: int, tags: Mapping[str, str], run_id: str | None) -> None:
        """Tags on a version and on the run it was logged from, so the MLflow UI's two pages never disagree."""
        from mlflow.entities import RunTag

        for key, value in tags.items():
            self._client.set_model_version_tag(model_name, str(int(version)), key, value)
        if run_id and tags:  # a version logged as a model without a run has none
            self._client.log_batch(run_id, tags=[RunTag(key, value) for key, value in tags.items()])

    def _close_abandoned_runs(self, sync_key: str) -> None:
        """Runs of this sync left RUNNING by a worker killed while logging: marked KILLED, so the UI shows no live run.

        Only a run that never became a version is abandoned; the ledger lets one sync of a key run at a time."""
        from mlflow.entities import ViewType

        runs = self._client.search_runs(
            [self._experiment()],
            filter_string=f"tags.`{SYNC_KEY_TAG}` = '{sync_key}' and attributes.status = 'RUNNING'",
            run_view_type=ViewType.ACTIVE_ONLY,
        )
        for run in runs:
            self._client.set_terminated(run.info.run_id, "KILLED")

    def _restore_candidate(self, model_name: str, version: int) -> None:
        """A run killed between creating the version and aliasing it left a pending version without `candidate`."""
        tags = self.version_tags(model_name, version)
        if (
            tags.get(VALIDATION_STATUS_TAG) == PENDING
            and self.alias_version(model_name, CANDIDATE) != version
            and self.alias_version(model_name, PRODUCTION) != version
        ):
            self._client.set_registered_model_alias(model_name, CANDIDATE, str(version))

    def _drafter_with_sync_key(self, model_name: str, target_version: int, method: str, sync_key: str) -> int | None:
        for info in self._versions(model_name):
            tags = info.tags
            if (
                tags.get(SYNC_KEY_TAG) == sync_key
                and tags.get(TARGET_VERSION_TAG) == str(int(target_version))
                and tags.get(METHOD_TAG) == method
            ):
                return info.version
        return None

    def drafter_for_target_version(
        self, target_name: str, target_version: int, validated_only: bool = True
    ) -> int | None:
        """The newest drafter version trained for this target version (validated ones only by default)."""
        matches = [
            info.version
            for info in self._versions(drafter_model_name(target_name))
            if info.tags.get(TARGET_VERSION_TAG) == str(int(target_version))
            and (not validated_only or info.tags.get(VALIDATION_PASSED_TAG) == "true")
        ]
        return max(matches, default=None)

    def promote(self, target_name: str, drafter_version: int) -> None:
        """Make a validated drafter version `production`; the old one becomes `previous`.

        Order matters for a crash half-way: `previous` is written first (harmless on its own), then
        `production` flips in one call, then `candidate` is cleared.
        """
        model_name = drafter_model_name(target_name)
        tags = self.version_tags(model_name, drafter_version)
        if tags.get(VALIDATION_PASSED_TAG) != "true":
            raise DraftsyncError(
                f"drafter {model_name} version {drafter_version} has not passed validation "
                f"({VALIDATION_PASSED_TAG}={tags.get(VALIDATION_PASSED_TAG, 'absent')})",
                "validate it first (draftsync sync), or promote a version that passed",
            )
        current = self.alias_version(model_name, PRODUCTION)
        if current is not None and current != int(drafter_version):
            self._client.set_registered_model_alias(model_name, PREVIOUS, str(current))
        self._client.set_registered_model_alias(model_name, PRODUCTION, str(drafter_version))
        if self.alias_version(model_name, CANDIDATE) == int(drafter_version):
            self._client.delete_registered_model_alias(model_name, CANDIDATE)

    def alias_snapshot(self, target_name: str) -> dict[str, int | None]:
        """Where the drafter aliases point now, to put them back exactly with `restore_aliases`."""
        model_name = drafter_model_name(target_name)
        return {alias: self.alias_version(model_name, alias) for alias in (CANDIDATE, PRODUCTION, PREVIOUS)}

    def restore_aliases(self, target_name: str, snapshot: Mapping[str, int | None]) -> None:
        """Point each alias back where the snapshot says (removing those it did not have); `production` last."""
        model_name = drafter_model_name(target_name)
        for alias in sorted(snapshot, key=lambda a: a == PRODUCTION):
            version = snapshot[alias]
            if version is not None:
                self._client.set_registered_model_alias(model_name, alias, str(int(version)))
            elif self.alias_version(model_name, alias) is not None:
                self._client.delete_registered_model_alias(model_name, alias)

    def rollback(self, target_name: str) -> int:
        """Point `production` back at `previous` (and `previous` at the version rolled back from)."""
        wanted = rolled_back(target_name, self.alias_snapshot(target_name))
        self.restore_aliases(target_name, wanted)
        return int(wanted[PRODUCTION])  # type: ignore[arg-type]  # rolled_back never leaves production unset

    # -- any registered model -----------------------------------------------------------------

    def alias_version(self, model_name: str, alias: str) -> int | None:
        from mlflow.exceptions import MlflowException

        try:
            return int(self._client.get_model_version_by_alias(model_name, alias).version)
        except MlflowException as error:
            if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise

    def aliases_of(self, model_name: str, version: int) -> list[str]:
        return sorted(self._get_version(model_name, version).aliases)

    def version_tags(self, model_name: str, version: int) -> dict[str, str]:
        return dict(self._get_version(model_name, version).tags)

    def version_info(self, model_name: str, version: int) -> ModelVersionInfo:
        return self._info(self._get_version(model_name, version))

    def download(self, name: str, version: int) -> Path:
        """The plain checkpoint directory of a local copy of the version, downloaded once and then reused
        (`downloads.py`), whatever layout the version was logged in (`target_layouts.py`)."""
        return self.checkpoint_layout(name, version).path

    def checkpoint_layout(self, name: str, version: int) -> TargetLayout:
        """The version's layout, its plain checkpoint directory, and its MLflow logged model when it has one."""
        info = self._info(self._get_version(name, version), with_aliases=False)
        layout = read_layout(download_once(info.source, name, version, self.tracking_uri, self.artifacts_dir))
        return replace(layout, model_id=info.model_id or layout.model_id)

    # -- internals ----------------------------------------------------------------------------

    def _log_run(
        self,
        run_name: str,
        checkpoint_dir: Path,
        tags: Mapping[str, str],
        metrics: Mapping[str, float],
        reports_dir: Path | None,
        metric_history: Mapping[str, Sequence[tuple[int, float]]] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> str:
        """One run per registration: its artifacts are the checkpoint, `params` its parameters; marked FAILED if
        logging breaks."""
        run = self._client.create_run(self._experiment(), run_name=run_name, tags=dict(tags))
        run_id = run.info.run_id
        try:
            self._client.log_artifacts(run_id, str(checkpoint_dir), CHECKPOINT_ARTIFACT_PATH)
            if reports_dir is not None:
                self._client.log_artifacts(run_id, str(reports_dir), REPORTS_ARTIFACT_PATH)
            for key, value in metrics.items():
                self._client.log_metric(run_id, key, float(value))
            self._log_history(run_id, metric_history or {})
            if params:
                from mlflow.entities import Param

                self._client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        except BaseException:
            self._client.set_terminated(run_id, "FAILED")
            raise
        self._client.set_terminated(run_id, "FINISHED")
        return run_id

    def _log_history(self, run_id: str, history: Mapping[str, Sequence[tuple[int, float]]]) -> None:
        """Step series in batches of 1000 (MLflow's per-call limit)."""
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [
            Metric(key, float(value), now, int(step))
            for key, series in history.items()
            for step, value in series
            if math.isfinite(float(value))
        ]
        for start in range(0, len(points), 1000):
            self._client.log_batch(run_id, metrics=points[start : start + 1000])

    def _create_version(
        self, model_name: str, run_id: str, tags: Mapping[str, str], description: str | None = None
    ) -> int:
        self._ensure_registered_model(model_name)
        source = f"{self._client.get_run(run_id).info.artifact_uri}/{CHECKPOINT_ARTIFACT_PATH}"
        version = self._client.create_model_version(
            model_name, source, run_id=run_id, tags=dict(tags), description=description
        )
        return int(version.version)

    def _ensure_registered_model(self, model_name: str) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self._client.create_registered_model(model_name)
        except MlflowException as error:
            if error.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def _versions(self, model_name: str) -> list[ModelVersionInfo]:
        check_name(model_name)
        found = self._client.search_model_versions(f"name='{model_name}'")
        return sorted((self._info(mv, with_aliases=False) for mv in found), key=lambda info: info.version)

    def registered_tags(self, model_name: str, version: int) -> dict[str, str] | None:
        """The version's tags as MLflow holds them, or None when MLflow holds no such version (an outage raises)."""
        try:
            return dict(self._get_version(model_name, version).tags or {})
        except DraftsyncError as error:
            if is_outage(error):
                raise
            return None  # a name or version draftsync could not hold, or one MLflow does not

    def _get_version(self, model_name: str, version: int) -> Any:
        from mlflow.exceptions import MlflowException

        check_name(model_name)
        missing = DraftsyncError(
            f"registered model {model_name} has no version {version} in {masked_url(self.tracking_uri)}",
            "list the versions in the MLflow UI or check the name and MLFLOW_TRACKING_URI",
        )
        if not 1 <= int(version) <= MAX_VERSION:  # the store would fail converting it, not answer "no such version"
            raise missing
        try:
            return self._client.get_model_version(model_name, str(int(version)))
        except MlflowException as error:
            if error.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise missing from error
            raise

    def _info(self, model_version: Any, with_aliases: bool = True) -> ModelVersionInfo:
        """Plain data; aliases are looked up one by one because SQL stores' searches leave them empty."""
        aliases = list(model_version.aliases or [])
        if with_aliases and not aliases:
            aliases = list(self._get_version(model_version.name, model_version.version).aliases)
        return ModelVersionInfo(
            name=model_version.name,
            version=int(model_version.version),
            source=model_version.source,
            run_id=model_version.run_id,
            tags=dict(model_version.tags),
            aliases=sorted(aliases),
            created_ms=int(model_version.creation_timestamp or 0),
            model_id=getattr(model_version, "model_id", None) or logged_model_id(model_version.source),
        )


_SERVER_SCHEMES = ("http", "https", "databricks", "file", "")
_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # MLflow's SQL stores


def _connect_once(tracking_uri: str) -> None:
    """One connection to a database store, refused in seconds (MLflow itself would retry it for minutes)."""
    scheme = _store_kind(tracking_uri)
    if scheme in _SERVER_SCHEMES:
        return
    import sqlalchemy

    timeout = {} if scheme == "sqlite" else {"connect_timeout": 5}
    engine = sqlalchemy.create_engine(tracking_uri, connect_args=timeout)
    try:
        with engine.connect():
            pass
    finally:
        engine.dispose()


def _store_kind(tracking_uri: str) -> str:
    """The URI's scheme without its driver: postgresql for postgresql+psycopg://."""
    from urllib.parse import urlsplit

    return urlsplit(tracking_uri).scheme.split("+")[0]


def _store_fix(tracking_uri: str) -> str:
    scheme = _store_kind(tracking_uri)
    if scheme in ("http", "https"):
        return (
            "start `mlflow server` there or set MLFLOW_TRACKING_URI to a reachable server "
            "(or unset it to use the embedded sqlite store under the work dir)"
        )
    if scheme in ("file", ""):
        return "MLflow no longer writes file stores: use sqlite:///<path to a .db file> or a server's http:// URL"
    if scheme == "sqlite":
        return "point MLFLOW_TRACKING_URI at a SQLite file you can write (or unset it: the work dir's)"
    if scheme not in _DATABASE_SCHEMES:
        return (
            f"MLFLOW_TRACKING_URI takes http(s)://, sqlite:///, {', '.join(f'{s}://' for s in _DATABASE_SCHEMES[1:])} "
            f"URIs, not {scheme}://"
        )
    return "check that the database is up and the URI's host, port, database and login, or unset MLFLOW_TRACKING_URI"


def check_alias(alias: str) -> None:
    """Refuse an alias MLflow would refuse (its own rules: characters, length, `latest` and `vN` reserved), before
    anything is registered."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_alias_name, _validate_model_alias_name_reserved

    try:
        _validate_model_alias_name(alias)
        _validate_model_alias_name_reserved(alias)
    except MlflowException as error:
        raise DraftsyncError(
            f"alias {alias!r} cannot be set in MLflow: {error.message}",
            "use another alias, e.g. production or staging",
        ) from None


def logged_model_id(source: str) -> str | None:
    """The logged model id in an MLflow 3 source `models:/m-<id>` (not `models:/<name>/<version>`)."""
    match = re.fullmatch(r"models:/(m-[0-9a-f]+)/?", source or "")
    return match.group(1) if match else None


def rolled_back(target_name: str, snapshot: Mapping[str, int | None]) -> dict[str, int | None]:
    """The aliases after a rollback of `snapshot`: `production` and `previous` swapped, the rest as they were.

    A state to write, not a swap to perform: writing it twice lands the same, so the write can be retried."""
    if snapshot.get(PREVIOUS) is None:
        raise DraftsyncError(
            f"drafter {drafter_model_name(target_name)} has no `previous` alias to roll back to",
            "promote a specific validated version instead",
        )
    return {**snapshot, PRODUCTION: snapshot[PREVIOUS], PREVIOUS: snapshot.get(PRODUCTION)}
