"""Writing files and directories atomically: to a temporary one next to the destination, then renamed over it.

A reader never sees a half-written file (it opens the old one or the whole new one), a crash leaves the old
file intact, and two processes writing the same file at once never tear each other: each writes its own
temporary file and the last replace wins whole. Directories (a built checkpoint, a downloaded one) are published
the same way, except that the first one in place wins: a directory cannot be replaced whole.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

_TEMP_NAME = re.compile(r"\..+\.[0-9]+\.[0-9a-f]{8}\.tmp")  # .<name>.<pid>.<random>.tmp, as _temp_path names it


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` writes the content to `tmp`, which then replaces `path`; `path`'s folder must exist.

    When `write` raises, the temporary file is removed, `path` is left as it was and the error propagates."""
    atomic_write_all([(path, write)])


def atomic_write_all(writes: Sequence[tuple[Path, Callable[[Path], object]]]) -> None:
    """Every `write(tmp)` first, then the replaces in the order given: a file that must be seen last (the one
    that says the others are complete) goes last, and when any write raises, no destination is touched."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, write in writes:
            staged.append((_temp_path(path), path))
            write(staged[-1][0])
        for temporary, path in staged:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        raise


def publish_directory(destination: Path, build: Callable[[Path], Path | None]) -> Path:
    """`build(staging)` fills the empty folder `staging` next to `destination` (or returns a folder inside it to
    publish instead), which is then renamed to `destination`; returns `destination`.

    When another process published `destination` first, its copy stays and this one is dropped; when `build`
    raises, nothing is published. Either way the staging folder is removed. A process killed mid-build leaves a
    hidden `.<name>.*.tmp` folder beside `destination`, which no reader takes for the directory."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".tmp", dir=destination.parent))
    try:
        staging = holder / destination.name  # made with the default mode, not mkdtemp's 0700
        staging.mkdir()
        built = build(staging) or staging
        try:
            Path(built).rename(destination)
        except OSError:  # another process published it first
            if not destination.is_dir():
                raise
    finally:
        shutil.rmtree(holder, ignore_errors=True)
    return destination


def is_temp_file(path: Path) -> bool:
    """Whether `path` is a temporary file of `atomic_write`: one left behind by a process killed mid-write."""
    return _TEMP_NAME.fullmatch(path.name) is not None


def _temp_path(path: Path) -> Path:
    """A name unique to this process and call, in `path`'s folder so that `os.replace` is a rename.

    The file is not created here (as `tempfile.mkstemp` would, with mode 0600): `write` creates it, so the
    result gets the same mode as a file written in place."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
