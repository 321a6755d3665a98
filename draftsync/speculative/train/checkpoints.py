"""A training's resumable checkpoint: written atomically, read back only by the run it belongs to."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write

if TYPE_CHECKING:
    from draftsync.speculative.data.shard_reader import ShardDataset

CHECKPOINT_FILE = "trainer-state.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a crash while writing leaves the previous checkpoint intact."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: Path, fingerprint: str, dataset_id: str) -> dict[str, Any] | None:
    """The checkpoint at `path` (None: none yet); one of another run or torn is refused, naming the fix."""
    import torch

    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a torn or foreign file: say which and how to recover
        raise DraftsyncError(
            f"training checkpoint {path} cannot be read ({error})", f"delete {path} to train from scratch"
        ) from error
    if state.get("fingerprint") != fingerprint or state.get("dataset") != dataset_id:
        raise DraftsyncError(
            f"training checkpoint {path} belongs to another run (different config or dataset)",
            f"use another checkpoint directory, or delete {path} to train from scratch",
        )
    return state


def dataset_identity(dataset: ShardDataset) -> str:
    """The dataset a checkpoint was trained on: its target, its samples and how many sequences it holds."""
    manifest = dataset.manifest
    return f"{manifest['target']['fingerprint']}:{manifest['samples_digest']}:{manifest['num_sequences']}"
