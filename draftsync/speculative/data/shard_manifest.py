"""The on-disk hidden-state dataset: its layout, its manifest, and the rules for resuming a build.

A directory holds `manifest.json`, `token_counts.safetensors` and `shard-NNNNN.safetensors`.
Each shard concatenates its sequences' tokens flat:

    input_ids  int32 [N]        loss_mask  bool [N]          offsets  int64 [n+1] (sequence i: offsets[i]:offsets[i+1])
    task_index int16 [n]        aux  bf16/fp16 [N, 3H]       final    bf16/fp16 [N, H] (post-norm last state)

(`aux` is absent when the dataset was built without it.) States are never stored in fp32: they are
half the disk and page-cache traffic in 16 bits, and drafters train on them in fp32 after loading.

Every file is written atomically, and the manifest, rewritten after each shard, is the only commit
point: a rerun with the same inputs checks that the target and settings match, drops anything written
after the last commit, and skips the samples that completed shards consumed. The writer
(shard_writer.py) and the reader (shard_reader.py) share this module's names for the format.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write, is_temp_file
from draftsync.speculative.data.hidden_states import num_decoder_layers
from draftsync.speculative.data.samples import Sample, SampleSource
from draftsync.speculative.targets import target_fingerprint

FORMAT = "draftsync-hidden-states"
FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
TOKEN_COUNTS_FILE = "token_counts.safetensors"


# --- the target the states come from --------------------------------------------------------------
def target_facts(model: Any, target_name: str | None) -> dict:
    """The manifest's record of the target: what a resume and the trainer check the states against."""
    config = model.config
    return {
        "name_or_path": target_name or getattr(config, "_name_or_path", "") or "",
        "architecture": (getattr(config, "architectures", None) or [type(model).__name__])[0],
        "hidden_size": int(config.hidden_size),
        "num_layers": num_decoder_layers(model),
        "vocab_size": int(config.vocab_size),
        "fingerprint": target_fingerprint(model),
    }


# --- files, each written atomically (draftsync/files.py) -------------------------------------------
def write_json(path: Path, payload: dict) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(payload, indent=2)))


def write_token_counts(path: Path, counts: torch.Tensor) -> None:
    from safetensors.torch import save_file

    atomic_write(path, lambda tmp: save_file({"token_counts": counts.contiguous()}, str(tmp)))


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


# --- the manifest ---------------------------------------------------------------------------------
STORED = "stored"  # the states are in the shards (offline)
ONLINE = "online"  # the shards hold tokens only; the target computes the states when a batch needs them


def stores_states(manifest: dict) -> bool:
    """Whether the shards hold the states (builds from before online states all did)."""
    return manifest.get("states", STORED) == STORED


def new_manifest(
    facts: dict,
    layer_ids: tuple[int, ...],
    dtype_name: str,
    store_aux: bool,
    mode: str,
    fingerprint: str | None,
    response_writer: str | None,
    shard_tokens: int,
    batch_size: int,
    max_batch_tokens: int,
    max_seq_len: int | None,
    states: str = STORED,
) -> dict:
    """The manifest of an empty build: its settings, and counters that each committed shard adds to."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "complete": False,
        "target": facts,
        "aux_layer_ids": list(layer_ids),
        "store_aux": store_aux,
        "states": states,
        "dtype": dtype_name,
        "mode": mode,
        "source_fingerprint": fingerprint,
        "response_writer": response_writer,  # the engine that wrote the responses ("hf", "vllm"); None: none
        "shard_tokens": shard_tokens,
        "batch_size": batch_size,
        "max_batch_tokens": max_batch_tokens,
        "max_seq_len": max_seq_len,
        "samples_consumed": 0,
        "samples_digest": "",
        "skipped_samples": {"too_short": 0, "no_loss_tokens": 0},
        "truncated_samples": 0,
        "task_names": [],
        "tasks": {},
        "num_sequences": 0,
        "total_tokens": 0,
        "loss_tokens": 0,
        "token_counts_file": TOKEN_COUNTS_FILE,
        "shards": [],
    }


# --- resuming -------------------------------------------------------------------------------------
# Fields a resumed build must share with the directory it continues: anything else would mix datasets.
_RESUME_FIELDS = (
    "states",
    "format_version",
    "aux_layer_ids",
    "store_aux",
    "dtype",
    "mode",
    "source_fingerprint",
    "shard_tokens",
    "batch_size",
    "max_batch_tokens",
    "max_seq_len",
)
_TARGET_FIELDS = ("hidden_size", "num_layers", "vocab_size", "fingerprint")


def check_resumable(out_dir: Path, old: dict, new: dict) -> None:
    """Refuse to continue a directory built for another target or with other settings."""
    fix = f"build into a fresh directory, or delete {out_dir} to rebuild it"
    if old.get("format") != FORMAT:
        raise DraftsyncError(f"{out_dir} holds a {MANIFEST_FILE} that is not a hidden-state dataset", fix)
    for key in _TARGET_FIELDS:
        if old["target"].get(key) != new["target"][key]:
            raise DraftsyncError(
                f"{out_dir} was built for another target ({key} {old['target'].get(key)!r}, "
                f"this target has {new['target'][key]!r}; built from {old['target'].get('name_or_path')!r})",
                fix,
            )
    for key in _RESUME_FIELDS:
        was = old.get(key, STORED if key == "states" else None)  # builds before online states stored them all
        if was != new[key]:
            raise DraftsyncError(f"{out_dir} was built with {key}={was!r}, this build asks for {key}={new[key]!r}", fix)


def recount_tokens(out_dir: Path, manifest: dict, vocab_size: int) -> torch.Tensor:
    """Token counts of the completed shards, read back: the counts file may be newer than the manifest."""
    from safetensors import safe_open

    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for shard in manifest["shards"]:
        with safe_open(str(out_dir / shard["file"]), framework="pt") as handle:
            ids = handle.get_tensor("input_ids").to(torch.int64)
            mask = handle.get_tensor("loss_mask").to(torch.bool)
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def remove_uncommitted(out_dir: Path, manifest: dict) -> None:
    """Delete shards written after the last manifest update (an interrupted build) and leftover temp files."""
    kept = {shard["file"] for shard in manifest["shards"]}
    for path in out_dir.iterdir():
        if is_temp_file(path) or (path.name.startswith("shard-") and path.name not in kept):
            path.unlink()


def chain_digest(previous: str, sample: Sample) -> str:
    """Running digest of every sample consumed so far: a resumed build checks it is fed the same inputs."""
    digest = hashlib.sha256(previous.encode())
    digest.update(sample.task.encode())
    digest.update(torch.tensor(sample.input_ids, dtype=torch.int64).numpy().tobytes())
    digest.update(bytes(1 if m else 0 for m in sample.loss_mask))
    return digest.hexdigest()


def iterate_from(samples: Any, start: int, expected_digest: str) -> Iterator[Sample]:
    """Samples from position `start`; a plain iterable is replayed up to there and checked to be the same."""
    if isinstance(samples, SampleSource):
        yield from samples.iter_from(start)
        return
    iterator = iter(samples)
    digest = ""
    for _ in range(start):
        sample = next(iterator, None)
        if sample is None:
            break
        digest = chain_digest(digest, sample)
    if start and digest != expected_digest:
        raise DraftsyncError(
            f"the samples given differ from the {start} samples the existing shards were built from",
            "rerun with the same inputs in the same order, or build into a fresh directory",
        )
    yield from iterator
