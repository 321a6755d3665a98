"""The local cache of registered checkpoints: each version downloaded once, atomically, then reused.

A sync, a validation and a rollout all need a version's files on disk; fetching them once per work dir saves
minutes on real checkpoints. The copy is assembled in a temp folder and renamed into place, so an interrupted
download never looks complete, and two processes racing for the same version both end with the whole copy.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from draftsync.files import publish_directory
from draftsync.registry.outages import is_outage, outage


def download_once(source: str, name: str, version: int, tracking_uri: str, artifacts_dir: Path | None) -> Path:
    """`<artifacts_dir>/downloads/<name>/<version>` (or under the temp dir), downloaded from `source` if missing."""
    import mlflow.artifacts

    cache_root = (
        artifacts_dir / "downloads"
        if artifacts_dir is not None
        else Path(tempfile.gettempdir()) / ("draftsync-downloads")
    )
    destination = cache_root / name / str(int(version))
    if destination.is_dir():
        return destination

    def download(staging: Path) -> Path:
        try:
            local = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(staging), tracking_uri=tracking_uri
            )
        except Exception as error:
            if not is_outage(error):
                raise
            raise outage(tracking_uri, f"the download of {name} v{version}", error) from error
        return Path(local)

    publish_directory(destination, download)
    return destination
