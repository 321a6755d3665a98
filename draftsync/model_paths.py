"""Model paths confined to the configured roots: a checkpoint directory is used only if it really lies inside one.

A target or drafter directory that enters draftsync from outside the registry (a registration, the reference
server's arguments, a vLLM launch) is resolved the way the operating system will open it: symlinks and `..`
followed (`os.path.realpath`). The resolved path must lie inside the work dir or a directory named in
DRAFTSYNC_MODEL_ROOTS, so a symlink or a `../` cannot make draftsync read, upload or serve files elsewhere.
Registry downloads land under the work dir and pass.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from draftsync.errors import DraftsyncError


def model_roots() -> list[Path]:
    """The directories model checkpoints may lie in, resolved: the work dir first, then DRAFTSYNC_MODEL_ROOTS."""
    from draftsync.settings import Settings

    return Settings().model_root_paths


def confined_model_path(path: Path | str, what: str, roots: Sequence[Path | str] | None = None) -> Path:
    """`path` resolved (symlinks and `..` followed), or a DraftsyncError when that lies outside every root.

    `what` names the path in the error ("target checkpoint", "drafter checkpoint"); `roots` default to
    `model_roots()`. Callers should use the returned path, so what is read is what was checked.
    """
    given = os.fspath(path)
    resolved = Path(os.path.realpath(given))
    real_roots = [Path(os.path.realpath(os.fspath(root))) for root in (model_roots() if roots is None else roots)]
    if any(resolved.is_relative_to(root) for root in real_roots):
        return resolved
    shown = ", ".join(str(root) for root in real_roots) or "none"
    via = "" if str(resolved) == given else f" resolves to {resolved}, which"
    missing = [str(root) for root in real_roots if not root.is_dir()]
    unusable = (
        f"; of those, {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not a folder here" if missing else ""
    )
    raise DraftsyncError(
        f"{what} {given}{via} is outside every model root ({shown}){unusable}",
        f"keep checkpoints under one of those roots, or add the directory that holds it ({resolved.parent}) to "
        "DRAFTSYNC_MODEL_ROOTS (comma-separated directories; the work dir is always a root)"
        + (": check each entry's spelling" if missing else ""),
    )
