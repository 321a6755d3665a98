"""Writing files atomically: to a temporary file next to the destination, then `os.replace` over it.

A reader never sees a half-written file (it opens the old one or the whole new one), a crash leaves the old
file intact, and two processes writing the same file at once never tear each other: each writes its own
temporary file and the last replace wins whole.
"""

from __future__ import annotations

import os
import re
import secrets
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


def is_temp_file(path: Path) -> bool:
    """Whether `path` is a temporary file of `atomic_write`: one left behind by a process killed mid-write."""
    return _TEMP_NAME.fullmatch(path.name) is not None


def _temp_path(path: Path) -> Path:
    """A name unique to this process and call, in `path`'s folder so that `os.replace` is a rename.

    The file is not created here (as `tempfile.mkstemp` would, with mode 0600): `write` creates it, so the
    result gets the same mode as a file written in place."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
