"""Reading and writing the files of a drafter directory: config.json and safetensors weights.

Writes go to temporary names first and are renamed into place (weights before config.json), so a reader
never sees half a file; every read failure names the file and says how to repair it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write_all

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.json"
RESAVE = "re-save the drafter with draftsync.speculative.methods.registry.save_drafter (or re-train it)"


@dataclass(frozen=True)
class SavedFor:
    """What every drafter format records beside its weights: the target it drafts for and the gamma it runs at."""

    verifier_name_or_path: str
    verifier_architectures: tuple[str, ...]
    speculative_tokens: int

    def __post_init__(self) -> None:
        if self.speculative_tokens < 1:
            raise DraftsyncError(
                f"speculative_tokens={self.speculative_tokens} is below 1",
                "record the gamma the drafter is meant to run with (>= 1)",
            )

    def verifier(self) -> dict[str, Any]:
        return {"name_or_path": self.verifier_name_or_path, "architectures": list(self.verifier_architectures)}


def bf16_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors in bf16 (the format's dtype), integer and bool buffers as they are, on the CPU."""
    import torch

    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().cpu()
        out[name] = (tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor).contiguous()
    return out


def write_directory(
    out_dir: str | Path, weights: dict[str, dict[str, torch.Tensor]], documents: dict[str, dict[str, Any]]
) -> Path:
    """Write safetensors files (`weights`: file name -> tensors) then JSON files, each atomically."""
    from safetensors.torch import save_file

    def safetensors(tensors: dict[str, torch.Tensor]) -> Callable[[Path], object]:
        return lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"})

    def json_document(document: dict[str, Any]) -> Callable[[Path], object]:
        return lambda tmp: tmp.write_text(json.dumps(document, indent=2) + "\n")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_all(  # weights first, config.json last: nothing is replaced unless every file was written
        [(out / name, safetensors(tensors)) for name, tensors in weights.items()]
        + [(out / name, json_document(document)) for name, document in documents.items()]
    )
    return out


def read_json(directory: str | Path, name: str = CONFIG_FILE) -> tuple[Path, dict[str, Any]]:
    """(path, object) of a JSON file in a drafter directory."""
    folder = Path(directory)
    if not folder.is_dir():
        raise DraftsyncError(
            f"drafter directory {folder} does not exist",
            "pass a directory written by save_drafter (or re-train the drafter)",
        )
    path = folder / name
    if not path.is_file():
        raise DraftsyncError(f"{path} is missing", f"the drafter directory is incomplete: {RESAVE}")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DraftsyncError(f"{path} is not valid JSON ({error})", f"the file is damaged: {RESAVE}") from error
    if not isinstance(document, dict):
        raise DraftsyncError(f"{path} does not hold a JSON object", f"the file is damaged: {RESAVE}")
    return path, document


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file, or an error naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise DraftsyncError(f"{path} is missing", f"the drafter directory is incomplete: {RESAVE}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as error:
        raise DraftsyncError(
            f"{path} is not a readable safetensors file ({error})", f"the drafter weights are damaged: {RESAVE}"
        ) from error


def check_tensors(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], where: str) -> None:
    """Every expected tensor present with its shape, and nothing else; else an error naming `where`."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(name for name in set(expected) & set(found) if found[name].shape != expected[name].shape)
    if missing or unexpected or wrong:
        raise DraftsyncError(
            f"{where} does not match its config: missing {missing or 'none'}, unexpected {unexpected or 'none'}, "
            f"wrong shape {wrong or 'none'}",
            f"config and weights must come from the same drafter: {RESAVE}",
        )


def config_value(config: dict[str, Any], path: Path, *keys: str) -> Any:
    """config[keys[0]][keys[1]]...; a missing field is an error naming the file and the field."""
    value: Any = config
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise DraftsyncError(f"{path} lacks the field {'.'.join(keys)}", RESAVE)
        value = value[key]
    return value
