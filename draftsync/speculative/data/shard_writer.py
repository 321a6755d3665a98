"""Writing hidden-state shards: the target runs once over the training set and its states are kept on disk.

Training then streams states from disk instead of running the target at every step, so a drafter can
train for many epochs, and a new method can be tried on the same data, at the cost of one target pass.

The build is streaming (one shard's worth of states in memory, plus one batch) and resumable: batches
sit at fixed sample positions, shards close on batch boundaries, and the manifest is rewritten after
each shard (see shard_manifest.py for the layout and the resume rules).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write
from draftsync.speculative.data.hidden_states import capture, num_decoder_layers, validate_aux_layer_ids
from draftsync.speculative.data.samples import Sample, SampleSource
from draftsync.speculative.data.shard_manifest import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    ONLINE,
    STORED,
    TOKEN_COUNTS_FILE,
    chain_digest,
    check_resumable,
    iterate_from,
    new_manifest,
    recount_tokens,
    remove_uncommitted,
    shard_name,
    stores_states,
    target_facts,
    write_json,
    write_token_counts,
)

_STATE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
TRANSFORMERS = "transformers"  # the engine of states taken by the target's own forward passes here

# Rows of token ids -> per row (aux [T, len(ids) * hidden], final [T, hidden]): states taken by another engine.
StateSource = Callable[[list[list[int]]], list[tuple[torch.Tensor, torch.Tensor]]]


class _ShardBuffer:
    """Sequences waiting to be written as one shard, in preallocated tensors of the on-disk dtypes.

    Filling preallocated rows (pages are touched only as rows are written) keeps the peak at one shard,
    where collecting per-sequence tensors and concatenating them would briefly need two.
    """

    def __init__(self, capacity: int, hidden: int, aux_width: int, dtype: torch.dtype, states: bool = True):
        self.input_ids = torch.empty(capacity, dtype=torch.int32)
        self.loss_mask = torch.empty(capacity, dtype=torch.bool)
        self.aux = torch.empty(capacity, aux_width, dtype=dtype) if aux_width and states else None
        self.final = torch.empty(capacity, hidden, dtype=dtype) if states else None
        self.lengths: list[int] = []
        self.tasks: list[int] = []
        self.tokens = 0

    def add(
        self, ids: torch.Tensor, mask: torch.Tensor, task: int, aux: torch.Tensor | None, final: torch.Tensor | None
    ):
        begin, end = self.tokens, self.tokens + ids.shape[0]
        self.input_ids[begin:end] = ids
        self.loss_mask[begin:end] = mask
        if self.aux is not None:
            assert aux is not None  # a buffer with aux rows is given aux states (aux_width > 0)
            self.aux[begin:end] = aux
        if self.final is not None:
            assert final is not None  # a buffer that stores states is given them
            self.final[begin:end] = final
        self.lengths.append(end - begin)
        self.tasks.append(task)
        self.tokens = end

    def tensors(self) -> dict[str, torch.Tensor]:
        used = self.tokens
        out = {
            "input_ids": self.input_ids[:used],
            "loss_mask": self.loss_mask[:used],
            "offsets": torch.cumsum(torch.tensor([0] + self.lengths, dtype=torch.int64), 0),
            "task_index": torch.tensor(self.tasks, dtype=torch.int16),
        }
        if self.final is not None:
            out["final"] = self.final[:used]
        if self.aux is not None:
            out["aux"] = self.aux[:used]
        return out


def build_shards(
    model: Any,
    samples: Iterable[Sample],
    out_dir: str | Path,
    aux_layer_ids: Sequence[int],
    *,
    dtype: torch.dtype = torch.bfloat16,
    shard_tokens: int = 65536,
    batch_size: int = 16,
    max_batch_tokens: int = 8192,
    store_aux: bool = True,
    max_seq_len: int | None = None,
    target_name: str | None = None,
    mode: str | None = None,
    on_progress: Any = None,
    online: bool = False,
    states: StateSource | None = None,
    states_engine: str = TRANSFORMERS,
) -> dict:
    """Run the target over `samples` (a stable order) and write its states as shards; returns the manifest.

    Batches are right-padded and run with causal attention only: a real token never attends to the
    padding after it, so its states equal those of the sequence run alone. Batches sit at fixed sample
    positions and shards close on batch boundaries, so a resumed build writes what an uninterrupted one
    would. Each batch of `batch_size` samples runs as forward passes of at most `max_batch_tokens`
    padded tokens (sequences grouped by length), which bounds activation memory. Samples shorter than 2
    tokens or without any loss-masked token are skipped (and counted); samples longer than `max_seq_len`
    (default: the target's max_position_embeddings) are cut there.
    `on_progress(samples_consumed, manifest)` is called after each shard. `online`: the shards keep the tokens
    only, and the target computes the states when training reads a batch (`online_states.OnlineDataset`): a few
    bytes a token on disk instead of kilobytes, at the cost of a forward pass per batch.
    `states`: where the states come from instead of `model`'s forward passes (vLLM's, `serving/vllm_states.py`),
    named `states_engine` in each shard's manifest entry; `model` still gives the target's facts.
    Long: the resume, the batch loop and the shard boundaries share one position in the samples, kept in one place.
    """
    dtype_name = {v: k for k, v in _STATE_DTYPES.items()}.get(dtype)
    if dtype_name is None:
        raise DraftsyncError(f"hidden states cannot be stored as {dtype}", "use torch.bfloat16 or torch.float16")
    if min(shard_tokens, batch_size, max_batch_tokens) < 1:
        raise DraftsyncError(
            f"shard_tokens={shard_tokens}, batch_size={batch_size}, max_batch_tokens={max_batch_tokens}",
            "use positive values",
        )
    model.eval()
    layer_ids = validate_aux_layer_ids(aux_layer_ids, num_decoder_layers(model))
    if store_aux and len(layer_ids) != 3:
        raise DraftsyncError(
            f"{len(layer_ids)} aux layer ids given {list(layer_ids)}",
            "EAGLE-3 reads exactly three depths; give three ids",
        )
    facts = target_facts(model, target_name)
    vocab_size = facts["vocab_size"]
    if max_seq_len is None:
        max_seq_len = getattr(model.config, "max_position_embeddings", None)
    source_mode = mode if mode else getattr(samples, "mode", "custom")
    fingerprint = samples.fingerprint if isinstance(samples, SampleSource) else None
    response_writer = samples.writer if isinstance(samples, SampleSource) else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / MANIFEST_FILE
    manifest = new_manifest(
        facts,
        layer_ids,
        dtype_name,
        store_aux,
        source_mode,
        fingerprint,
        response_writer,
        shard_tokens,
        batch_size,
        max_batch_tokens,
        max_seq_len,
        ONLINE if online else STORED,
    )
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        check_resumable(out_dir, old, manifest)
        if old["complete"]:
            return old
        old["target"]["name_or_path"] = facts["name_or_path"]
        manifest = old
        counts = recount_tokens(out_dir, manifest, vocab_size)
    else:
        if any(out_dir.glob("shard-*.safetensors")):
            raise DraftsyncError(f"{out_dir} holds shards but no {MANIFEST_FILE}", "build into a fresh directory")
        counts = torch.zeros(vocab_size, dtype=torch.int64)
    remove_uncommitted(out_dir, manifest)

    aux_width = len(layer_ids) * facts["hidden_size"] if store_aux else 0
    writer = _ShardWriter(out_dir, manifest, counts, shard_tokens, aux_width, dtype, on_progress, states, states_engine)
    position, digest = manifest["samples_consumed"], manifest["samples_digest"]
    batch = _PendingBatch(position, digest)
    for sample in iterate_from(samples, position, digest):
        if len(sample.loss_mask) != len(sample.input_ids):
            raise DraftsyncError(
                f"sample {position} ({sample.task}) has {len(sample.input_ids)} tokens but a loss mask of "
                f"{len(sample.loss_mask)}",
                "give one loss-mask entry per token",
            )
        if sample.input_ids and (min(sample.input_ids) < 0 or max(sample.input_ids) >= vocab_size):
            raise DraftsyncError(
                f"sample {position} ({sample.task}) holds token ids outside the target vocabulary "
                f"(0..{vocab_size - 1})",
                "tokenize with the target's own tokenizer",
            )
        digest = chain_digest(digest, sample)
        position += 1
        batch.take(sample, max_seq_len)
        if position % batch_size == 0:
            writer.add_batch(batch, model, layer_ids)
            batch = _PendingBatch(position, digest)
    if position > batch.start:
        writer.add_batch(batch, model, layer_ids)
    if position != manifest["samples_consumed"]:  # states, skips or truncations not yet committed
        writer.commit(position, digest)
    manifest["complete"] = True
    write_json(out_dir / MANIFEST_FILE, manifest)
    return manifest


class _PendingBatch:
    """Samples of positions [start, start + batch_size): the unit that is run and that shards close after."""

    def __init__(self, start: int, digest_before: str):
        self.start, self.digest_before = start, digest_before
        self.samples: list[Sample] = []
        self.tokens = 0
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0

    def take(self, sample: Sample, max_seq_len: int | None) -> None:
        if max_seq_len and len(sample.input_ids) > max_seq_len:
            sample = Sample(sample.task, sample.input_ids[:max_seq_len], sample.loss_mask[:max_seq_len])
            self.truncated += 1
        if len(sample.input_ids) < 2:
            self.skipped["too_short"] += 1
        elif not any(sample.loss_mask[1:]):  # the first token is never predicted
            self.skipped["no_loss_tokens"] += 1
        else:
            self.samples.append(sample)
            self.tokens += len(sample.input_ids)


class _ShardWriter:
    """Runs batches through the target into a shard buffer and commits shards with their manifest."""

    def __init__(
        self,
        out_dir: Path,
        manifest: dict,
        counts: torch.Tensor,
        shard_tokens: int,
        aux_width: int,
        dtype: torch.dtype,
        on_progress: Any,
        states: StateSource | None = None,
        states_engine: str = TRANSFORMERS,
    ):
        self.out_dir, self.manifest, self.counts = out_dir, manifest, counts
        self.states, self.states_engine = states, states_engine
        self.max_batch_tokens = manifest["max_batch_tokens"]
        self.shard_tokens, self.aux_width, self.dtype, self.on_progress = shard_tokens, aux_width, dtype, on_progress
        self.hidden = manifest["target"]["hidden_size"]
        self.buffer: _ShardBuffer | None = None
        self.stores_states = stores_states(manifest)
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0

    @property
    def buffered_tokens(self) -> int:
        return self.buffer.tokens if self.buffer is not None else 0

    def add_batch(self, batch: _PendingBatch, model: Any, layer_ids: tuple[int, ...]) -> None:
        if self.buffered_tokens and self.buffered_tokens + batch.tokens > self.shard_tokens:
            self.commit(batch.start, batch.digest_before)
        for reason, n in batch.skipped.items():
            self.skipped[reason] += n
        self.truncated += batch.truncated
        if not batch.samples:
            return
        if self.buffer is None:
            capacity = max(self.shard_tokens, batch.tokens)
            self.buffer = _ShardBuffer(capacity, self.hidden, self.aux_width, self.dtype, self.stores_states)
        states = (
            self._run(batch.samples, model, layer_ids) if self.stores_states else [(None, None)] * len(batch.samples)
        )
        names = self.manifest["task_names"]
        for row, sample in enumerate(batch.samples):
            if sample.task not in names:
                names.append(sample.task)
            aux, final = states[row]
            self.buffer.add(
                torch.tensor(sample.input_ids, dtype=torch.int32),
                torch.tensor(sample.loss_mask, dtype=torch.bool),
                names.index(sample.task),
                aux,
                final,
            )

    def _run(self, samples: list[Sample], model: Any, layer_ids: tuple[int, ...]) -> list[tuple[Any, torch.Tensor]]:
        """(aux, final) per sample, 16-bit on the CPU, from forward passes of at most max_batch_tokens padded tokens.

        Sequences are grouped by length so that activation memory depends on that budget, not on how
        long the longest sequence of a batch happens to be. Grouping depends only on the batch itself.
        """
        if self.states is not None:
            taken = self.states([list(s.input_ids) for s in samples])
            return [(aux.to(self.dtype) if self.aux_width else None, final.to(self.dtype)) for aux, final in taken]
        device = next(model.parameters()).device
        out: list[tuple[Any, torch.Tensor]] = [None] * len(samples)  # type: ignore[list-item]
        for group in _length_groups([len(s.input_ids) for s in samples], self.max_batch_tokens):
            width = max(len(samples[i].input_ids) for i in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)  # right padding: causal attention ignores it
            for row, index in enumerate(group):
                ids[row, : len(samples[index].input_ids)] = torch.tensor(samples[index].input_ids, dtype=torch.long)
            states = capture(model, ids.to(device), layer_ids, all_logits=False)
            aux = states.aux.to(self.dtype).cpu() if self.aux_width else None  # one transfer per forward pass
            final = states.final.to(self.dtype).cpu()
            del states
            for row, index in enumerate(group):
                length = len(samples[index].input_ids)
                out[index] = (aux[row, :length] if aux is not None else None, final[row, :length])
        return out

    def commit(self, consumed: int, digest: str) -> None:
        """Write the buffer as the next shard (if it holds anything), then the manifest that records it."""
        manifest = self.manifest
        if self.buffered_tokens:
            from safetensors.torch import save_file

            assert self.buffer is not None  # buffered_tokens counts its tokens
            tensors = self.buffer.tensors()
            name = shard_name(len(manifest["shards"]))
            atomic_write(
                self.out_dir / name,
                lambda tmp: save_file(
                    tensors, str(tmp), metadata={"format": FORMAT, "format_version": str(FORMAT_VERSION)}
                ),
            )
            ids = tensors["input_ids"].to(torch.int64)
            mask = tensors["loss_mask"]
            self.counts += torch.bincount(ids[mask], minlength=self.counts.shape[0])
            lengths = self.buffer.lengths
            position = 0
            for task_id, length in zip(self.buffer.tasks, lengths, strict=True):
                entry = manifest["tasks"].setdefault(
                    manifest["task_names"][task_id], {"sequences": 0, "tokens": 0, "loss_tokens": 0}
                )
                entry["sequences"] += 1
                entry["tokens"] += length
                entry["loss_tokens"] += int(mask[position : position + length].sum())
                position += length
            manifest["shards"].append(
                {
                    "file": name,
                    "sequences": len(lengths),
                    "tokens": int(ids.shape[0]),
                    "samples_end": consumed,
                    "states_engine": self.states_engine if self.stores_states else None,
                }
            )
            manifest["num_sequences"] += len(lengths)
            manifest["total_tokens"] += int(ids.shape[0])
            manifest["loss_tokens"] += int(mask.sum())
            del tensors, ids, mask
        self.buffer = None
        for reason, n in self.skipped.items():
            manifest["skipped_samples"][reason] += n
        manifest["truncated_samples"] += self.truncated
        self.skipped = {"too_short": 0, "no_loss_tokens": 0}
        self.truncated = 0
        manifest["samples_consumed"] = consumed
        manifest["samples_digest"] = digest
        write_token_counts(self.out_dir / TOKEN_COUNTS_FILE, self.counts)
        write_json(self.out_dir / MANIFEST_FILE, manifest)
        if self.on_progress is not None:
            self.on_progress(consumed, manifest)


def _length_groups(lengths: list[int], max_tokens: int, spread: float = 1.5) -> list[list[int]]:
    """Indices grouped shortest first, each group's rows x longest length within max_tokens (or one row).

    A group also holds no sequence longer than `spread` times its shortest: otherwise short chat turns are
    padded to the length of a long source file, and most of the forward pass computes padding.
    """
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: (lengths[i], i)):
        if (
            groups
            and (len(groups[-1]) + 1) * lengths[index] <= max_tokens
            and lengths[index] <= spread * lengths[groups[-1][0]]
        ):
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups
