"""Files and folders a user names (profiles, the deployments file, checkpoints, `--json` outputs), checked with the
real cause when one cannot be used: missing, a dangling link, a link loop, a folder where a file belongs (or the
other way round), unreadable, not UTF-8, not YAML. A wrong cause ("does not exist" for a folder) sends the user to
fix the wrong thing."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, Literal

from draftsync.errors import DraftsyncError

Kind = Literal["file", "directory"]


def path_problem(path: Path, kind: Kind) -> str | None:
    """Why `path` is not a usable `kind`, in words, or None."""
    try:
        os.stat(path)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a loop of symbolic links"
        if error.errno == errno.ENOENT and path.is_symlink():
            return f"is a symbolic link to {os.readlink(path)}, which does not exist"
        if error.errno == errno.ENOENT:
            return "does not exist"
        if error.errno == errno.ENOTDIR:
            return "lies under a file, not a folder"
        return f"cannot be reached ({error.strerror})"
    if kind == "file" and path.is_dir():
        return "is a folder, not a file"
    if kind == "directory" and not path.is_dir():
        return "is a file, not a folder"
    return None


def check_path(path: Path, kind: Kind, what: str, fix: str) -> None:
    problem = path_problem(path, kind)
    if problem:
        raise DraftsyncError(f"{what} {path} {problem}", fix)


def read_text(path: Path, what: str, fix: str) -> str:
    """The file's text, or one error naming the file, the cause and `fix`."""
    check_path(path, "file", what, fix)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise DraftsyncError(
            f"{what} {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start})",
            "save it as UTF-8 text",
        ) from None
    except OSError as error:
        raise DraftsyncError(
            f"{what} {path} cannot be read ({error.strerror})", "check its owner and permissions"
        ) from None


def read_yaml(path: Path, what: str, fix: str) -> Any:
    """The file's YAML (JSON is YAML too), loaded safely; a syntax error is one line with its place."""
    import yaml

    text = read_text(path, what, fix)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise DraftsyncError(
            f"{what} {path} is not valid YAML{where}: {problem}", "fix the YAML syntax there"
        ) from None


def check_output_file(path: Path, what: str) -> None:
    """Refuse, before any work, an output path that could not be written at the end: a folder, a link loop, a
    parent that is a file or that cannot be made or written to. Folders still to be made are made now, as the write
    would make them."""
    fix = f"give {what} a file path in a folder you can write to"
    if path.is_dir() or path_problem(path, "file") == "is a loop of symbolic links":
        raise DraftsyncError(f"{what} {path} {path_problem(path, 'file')}", fix)
    parent = path.absolute().parent
    if not parent.exists() and not parent.is_symlink():
        make_folder(parent, f"the folder of {what}", fix)
    problem = path_problem(parent, "directory")
    if problem:
        raise DraftsyncError(f"{what} {path}: its folder {parent} {problem}", fix)
    if not os.access(parent, os.W_OK):
        raise DraftsyncError(f"{what} {path}: its folder {parent} cannot be written to", fix)


def make_folder(path: Path, what: str, fix: str) -> None:
    """Make `path` and its parents, or one error naming the folder and the real cause (a file in the way, no
    permission, a read-only or virtual file system)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise DraftsyncError(f"{what} {path} cannot be made ({existing}: is a file)", fix) from None
        blocker = error.filename or path
        raise DraftsyncError(f"{what} {path} cannot be made ({blocker}: {error.strerror})", fix) from None
