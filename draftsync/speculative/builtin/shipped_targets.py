"""The built-in targets that ship with draftsync: built once from their recipe, kept in the repository with it.

The demo shows drafters kept in sync with targets a team already has; training its targets is not part of that
story, so a fresh clone copies them from here instead of training them. Each folder holds a checkpoint, its
tokenizer and `shipped.json`: the recipe's key and the SHA-256 of every file. A copy is used only when its
recipe key is the recipe's and every file matches its hash; `draftsync demo --rebuild-targets` writes them anew
(targets.rebuild_shipped_targets). This module knows files, not recipes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from draftsync.errors import DraftsyncError

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
MANIFEST = "shipped.json"
REBUILD_FIX = "rebuild the shipped targets: draftsync demo --rebuild-targets"
# (size, family, version) of each shipped target: the demo's two, the test size's two every test tier uses, and the
# test size's MTP target.
SHIPPED: tuple[tuple[str, str, int], ...] = (
    ("demo", "llama", 1),
    ("demo", "llama", 2),
    ("test", "llama", 1),
    ("test", "llama", 2),
    ("test", "mimo", 1),  # a target that ships its own MTP head, and its fine-tune, whose head went stale
    ("test", "mimo", 2),
)


def shipped_name(size: str, family: str, version: int) -> str:
    return f"{size}-{family}-v{version}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict:
    """The manifest of a shipped folder; a missing or unreadable one is refused with the fix."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest.get("recipe_key"), str) or not isinstance(manifest.get("files"), dict):
            raise ValueError("recipe_key and files are required")
    except (OSError, ValueError) as exc:
        raise DraftsyncError(f"shipped target manifest {path} is unreadable ({exc})", REBUILD_FIX) from exc
    return manifest


def verify(folder: Path) -> dict:
    """The folder's manifest, after checking that its files are exactly those recorded, byte for byte."""
    manifest = read_manifest(folder)
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST}
    if present != set(manifest["files"]):
        raise DraftsyncError(
            f"shipped target {folder} holds {sorted(present)}, its manifest records {sorted(manifest['files'])}",
            REBUILD_FIX,
        )
    for name, recorded in manifest["files"].items():
        if _sha256(folder / name) != recorded:
            raise DraftsyncError(
                f"shipped target file {folder / name} does not match its recorded SHA-256; the demo does not run on "
                "weights other than its recipe's",
                REBUILD_FIX,
            )
    return manifest


def find_shipped(recipe_key: str, root: Path | None = None) -> Path | None:
    """The verified shipped folder built from the recipe with this key, or None when none ships."""
    root = root or SHIPPED_DIR
    if not root.is_dir():
        return None
    for folder in sorted(p for p in root.iterdir() if (p / MANIFEST).exists()):
        if read_manifest(folder)["recipe_key"] == recipe_key:
            verify(folder)
            return folder
    return None


def copy_shipped(folder: Path) -> Callable[[Path], None]:
    """A `publish_directory` builder that copies a shipped folder's checkpoint files (not its manifest)."""

    def copy(staging: Path) -> None:
        for name in read_manifest(folder)["files"]:
            shutil.copy2(folder / name, staging / name)

    return copy


def ship(built: Path, name: str, recipe_key: str, root: Path | None = None) -> Path:
    """Write the built checkpoint `built` as shipped folder `name`, replacing what was there."""
    root = root or SHIPPED_DIR
    files = sorted(p for p in built.iterdir() if p.is_file())
    destination = root / name
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        for path in files:
            shutil.copy2(path, staging / path.name)
        manifest = {"recipe_key": recipe_key, "files": {p.name: _sha256(staging / p.name) for p in files}}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if destination.exists():
            shutil.rmtree(destination)
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination
