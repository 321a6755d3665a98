"""A writer killed mid-write, for real: a child process that dies inside `atomic_write` after writing part of a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_CHILD = """
import os, sys
from pathlib import Path
from draftsync.files import atomic_write

def write_and_die(tmp):
    tmp.write_bytes(sys.argv[2].encode())
    os._exit(9)  # no cleanup, no finally: what a kill -9 or a power cut leaves

atomic_write(Path(sys.argv[1]), write_and_die)
"""


def killed_mid_write(path: Path, partial: str) -> None:
    """Leave what a writer of `path` killed after writing `partial` leaves: its temporary file, `path` untouched."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), partial], capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
