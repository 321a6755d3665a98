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

from draftsync.files import publish_directory
from draftsync.registry.outages import is_outage, outage
from draftsync.registry.target_layouts import is_materialized, materialize


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
                artifact_uri=source, dst_path=str(staging), tracking_uri=tracking_uri
            )
        except Exception as error:
            if not is_outage(error):
                raise
            raise outage(tracking_uri, f"the download of {name} v{version}", error) from error
        materialize(Path(local), f"{name} version {int(version)} (source {source})")
        return Path(local)

    publish_directory(destination, download)
    return destination
