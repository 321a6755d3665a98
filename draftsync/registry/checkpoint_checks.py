"""What the registry checks before it writes: a model name its filters can quote, and a checkpoint directory
confined to the model roots that holds sound safetensors.

The registry refuses a torn or garbled checkpoint before it stores anything, so a version is never created
over weights no engine can load.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from draftsync.errors import DraftsyncError

_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NAME_LENGTH = 200  # the sync ledger's target_name column (MLflow's own holds 256)


def name_problem(name: str) -> str | None:
    """Why draftsync cannot hold a model of this name, or None. Names end up inside registry filter strings and the
    sync ledger: only characters that need no quoting (a subset of what MLflow allows), and a length both hold."""
    if not _NAME_PATTERN.fullmatch(name or ""):
        return "draftsync takes letters, digits, '.', '_' and '-', starting with a letter or a digit"
    if len(name) > MAX_NAME_LENGTH:
        return f"draftsync takes at most {MAX_NAME_LENGTH} characters, not {len(name)}"
    return None


def check_name(name: str) -> None:
    problem = name_problem(name)
    if problem:
        raise DraftsyncError(
            f"model name {name[:80]!r} cannot be used: {problem}",
            "use a plain name such as llama-3.1-8b-chat",
        )


def check_checkpoint_dir(path: Path, what: str, *, confine: bool = True) -> Path:
    """The checkpoint's real path, once it is known to lie inside a model root and to hold config and safetensors.

    The root check comes first, so nothing outside the roots is read, let alone uploaded. `confine=False` is for a
    path the operator typed: their intent, wherever it lies."""
    import os

    from draftsync.model_paths import confined_model_path

    path = confined_model_path(path, f"{what} checkpoint") if confine else Path(os.path.realpath(path))
    if not (path / "config.json").is_file():
        raise DraftsyncError(
            f"{what} checkpoint {path} has no config.json",
            f"point at the {what}'s saved checkpoint directory (config.json + *.safetensors)",
        )
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise DraftsyncError(
            f"{what} checkpoint {path} has no *.safetensors weights",
            "save it again; weights must be stored as safetensors",
        )
    for file in weights:
        check_safetensors(file, what)
    return path


SAFETENSORS_MAX_HEADER_BYTES = 100_000_000  # the format's own limit


def check_safetensors(file: Path, what: str) -> None:
    """Header and size must agree, as the format requires: a torn or garbled file is refused before it is stored.

    Reads the header only (8-byte length, then JSON), so a large checkpoint costs nothing to check."""
    size = file.stat().st_size
    problem = None
    try:
        with file.open("rb") as handle:
            prefix = handle.read(8)
            header_bytes = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < header_bytes <= min(size - 8, SAFETENSORS_MAX_HEADER_BYTES):
                problem = f"its header length {header_bytes} does not fit a file of {size} bytes"
            else:
                header = json.loads(handle.read(header_bytes))
                end = max(
                    (entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0
                )
                held = size - 8 - header_bytes
                if end != held:
                    problem = f"its header describes {end} bytes of tensors but the file holds {held}"
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as error:
        problem = f"its header cannot be read ({type(error).__name__}: {error})"
    if problem:
        raise DraftsyncError(
            f"{what} weights {file} are corrupt: {problem}",
            f"save the {what} checkpoint again (or copy it again from where it was trained); nothing was registered",
        )
