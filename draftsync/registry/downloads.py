"""The local cache of registered checkpoints: each version downloaded once, atomically, then reused.

A sync, a validation and a rollout all need a version's files on disk; fetching them once per work dir saves
minutes on real checkpoints. The copy is assembled in a temp folder, its layout read (target_layouts.py), and
renamed into place, so an interrupted download or an unreadable layout never looks complete, and two processes
racing for the same version both end with the whole copy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from draftsync.errors import DraftsyncError
from draftsync.files import publish_directory
from draftsync.registry.outages import is_outage, outage
from draftsync.registry.target_layouts import is_materialized, materialize

MAX_MODEL_LINKS = 10  # `models:/` sources followed before a version is called a loop


def download_once(source: str, name: str, version: int, tracking_uri: str, artifacts_dir: Path | None) -> Path:
    """`<artifacts_dir>/downloads/<name>/<version>` (or under the temp dir), downloaded from `source` if missing.

    `source` is any URI MLflow downloads: a run's artifact path, `runs:/...`, `models:/name/version` or an MLflow 3
    logged model `models:/m-...`."""
    import mlflow.artifacts

    cache_root = (
        artifacts_dir / "downloads"
        if artifacts_dir is not None
        else Path(tempfile.gettempdir()) / ("draftsync-downloads")
    )
    destination = cache_root / name / str(int(version))
    if destination.is_dir():
        if is_materialized(destination):
            return destination
        # downloaded before its layout was read: fetch it again
        stale = destination.with_name(f".{destination.name}.{os.getpid()}.stale.tmp")
        with contextlib.suppress(OSError):  # another process moved it first
            destination.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)

    def download(staging: Path) -> Path:
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=_resolved(source, tracking_uri), dst_path=str(staging), tracking_uri=tracking_uri
            )
        except Exception as error:
            if not is_outage(error):
                raise
            raise outage(tracking_uri, f"the download of {name} v{version}", error) from error
        materialize(Path(local), f"{name} version {int(version)} (source {source})")
        return Path(local)

    publish_directory(destination, download)
    return destination


def _resolved(source: str, tracking_uri: str) -> str:
    """`source` with its `models:/` links followed in draftsync's registry. MLflow resolves them in its process-wide
    registry URI whatever it is given (`ModelsArtifactRepository._get_model_uri_infos`), which another library in
    the worker may have pointed elsewhere."""
    from mlflow import MlflowClient
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository
    from mlflow.store.artifact.utils.models import get_model_name_and_version

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    for _ in range(MAX_MODEL_LINKS):
        if not source.startswith("models:/"):
            return source
        model, inside = ModelsArtifactRepository.split_models_uri(source)
        found = get_model_name_and_version(client, model)
        if len(found) == 1:  # an MLflow 3 logged model, `models:/m-...`
            root = client.get_logged_model(found[0]).artifact_location
        else:
            root = client.get_model_version_download_uri(*found)
        source = f"{root.rstrip('/')}/{inside}" if inside else root
    raise DraftsyncError(
        f"{source} still names another model version after {MAX_MODEL_LINKS} links",
        "register the version from its files (a run's artifacts or a path), not from a chain of models:/ links",
    )
