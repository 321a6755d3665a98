"""Reading a built hidden-state dataset: the batches a drafter trains and is evaluated on.

Shards are memory-mapped and sliced, never loaded whole. Sequences are cut into windows, and the
batch of any training step is a pure function of (step, seed, windows), so training resumes mid-epoch
on exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.shard_manifest import FORMAT, FORMAT_VERSION, MANIFEST_FILE, stores_states
from draftsync.speculative.data.training_batch import TrainingBatch

MIN_WINDOW_TOKENS = 3  # a window needs a state, a next token and one token after it to train on


class ShardDataset:
    """A built shard directory, read lazily: shards are memory-mapped and sliced, never loaded whole.

    Sequence ids are 0..num_sequences-1 in build order. Windows are rows (sequence, start, length).
    """

    def __init__(self, path: str | Path, open_handles: int = 4):
        from safetensors import safe_open

        self.path = Path(path)
        manifest_path = self.path / MANIFEST_FILE
        if not manifest_path.exists():
            raise DraftsyncError(f"{self.path} has no {MANIFEST_FILE}", "point at a directory written by build_shards")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != FORMAT or self.manifest.get("format_version") != FORMAT_VERSION:
            raise DraftsyncError(
                f"{self.path} holds format {self.manifest.get('format')!r} v{self.manifest.get('format_version')}",
                f"rebuild it with this version of draftsync ({FORMAT} v{FORMAT_VERSION})",
            )
        if not self.manifest.get("complete"):
            raise DraftsyncError(
                f"the dataset in {self.path} is incomplete ({len(self.manifest['shards'])} shards)",
                "rerun build_shards with the same inputs to finish it",
            )
        self._open_handles = max(1, open_handles)
        self._handles: OrderedDict[int, Any] = OrderedDict()
        shard_of, starts, lengths = [], [], []
        for index, shard in enumerate(self.manifest["shards"]):
            with safe_open(str(self.path / shard["file"]), framework="pt") as handle:
                offsets = handle.get_tensor("offsets")
            shard_of.append(torch.full((offsets.shape[0] - 1,), index, dtype=torch.int64))
            starts.append(offsets[:-1])
            lengths.append(offsets[1:] - offsets[:-1])
        empty = torch.zeros(0, dtype=torch.int64)
        self._shard_of = torch.cat(shard_of) if shard_of else empty
        self._start = torch.cat(starts) if starts else empty
        self._length = torch.cat(lengths) if lengths else empty
        self._perm_cache: tuple[tuple[int, int, int], torch.Tensor] | None = None

    # facts
    @property
    def num_sequences(self) -> int:
        return int(self._length.shape[0])

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return tuple(self.manifest["aux_layer_ids"])

    @property
    def has_aux(self) -> bool:
        return bool(self.manifest["store_aux"])

    @property
    def stores_states(self) -> bool:
        """False for a dataset of tokens only, whose states the target computes per batch (`OnlineDataset`)."""
        return stores_states(self.manifest)

    def token_counts(self) -> torch.Tensor:
        """How often each target id is a loss-masked token: LongTensor[V], for choosing the draft vocabulary."""
        from safetensors import safe_open

        with safe_open(str(self.path / self.manifest["token_counts_file"]), framework="pt") as handle:
            return handle.get_tensor("token_counts").to(torch.int64)

    def token_rows(self) -> Iterator[tuple[list[int], list[int]]]:
        """Each sequence's (input ids, loss mask), in order: the dataset as another trainer reads it."""
        for sequence in range(self.num_sequences):
            row = self._read(sequence, 0, int(self._length[sequence]), ("input_ids", "loss_mask"))
            yield row["input_ids"].tolist(), row["loss_mask"].tolist()

    # selection
    def split(self, holdout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
        """(train, holdout) sequence ids, sorted; at least one of each when there are two or more sequences."""
        n = self.num_sequences
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        held = round(holdout_fraction * n) if n > 1 else 0
        held = min(max(held, 1 if n > 1 and holdout_fraction > 0 else 0), max(n - 1, 0))
        return sorted(order[held:]), sorted(order[:held])

    def windows(self, sequence_ids: Sequence[int] | torch.Tensor, seq_len: int) -> torch.Tensor:
        """Cut sequences into consecutive windows of up to `seq_len` tokens, dropping those under 3 tokens.

        Returns LongTensor [W, 3] of (sequence id, start, length), in sequence order.
        """
        if seq_len < MIN_WINDOW_TOKENS:
            raise DraftsyncError(f"seq_len={seq_len} is too short", f"use seq_len >= {MIN_WINDOW_TOKENS}")
        ids = torch.as_tensor(
            list(sequence_ids) if not isinstance(sequence_ids, torch.Tensor) else sequence_ids, dtype=torch.int64
        )
        if ids.numel() == 0:
            return torch.zeros(0, 3, dtype=torch.int64)
        lengths = self._length[ids]
        per_sequence = (lengths + seq_len - 1) // seq_len
        sequence = torch.repeat_interleave(ids, per_sequence)
        first_of = torch.repeat_interleave(torch.cumsum(per_sequence, 0) - per_sequence, per_sequence)
        start = (torch.arange(sequence.shape[0]) - first_of) * seq_len
        length = torch.clamp(torch.repeat_interleave(lengths, per_sequence) - start, max=seq_len)
        keep = length >= MIN_WINDOW_TOKENS
        return torch.stack([sequence[keep], start[keep], length[keep]], dim=1)

    # reading
    def _handle(self, shard: int) -> Any:
        from safetensors import safe_open

        handle = self._handles.pop(shard, None)
        if handle is None:
            handle = safe_open(str(self.path / self.manifest["shards"][shard]["file"]), framework="pt")
        self._handles[shard] = handle
        while len(self._handles) > self._open_handles:
            self._handles.popitem(last=False)
        return handle

    def _read(self, sequence: int, start: int, length: int, names: Sequence[str]) -> dict[str, torch.Tensor]:
        shard = int(self._shard_of[sequence])
        begin = int(self._start[sequence]) + start
        handle = self._handle(shard)
        return {name: handle.get_slice(name)[begin : begin + length] for name in names}

    def batch(self, windows: torch.Tensor, seq_len: int | None = None) -> TrainingBatch:
        """The windows' tokens and states, right-padded to `seq_len` (default: the longest window).

        States come back in float32; `target_logits` is None (the trainer computes lm_head(final)).
        """
        windows = torch.as_tensor(windows, dtype=torch.int64).reshape(-1, 3)
        if windows.shape[0] == 0:
            raise DraftsyncError("a batch of zero windows was asked for", "select at least one window")
        width = int(seq_len) if seq_len is not None else int(windows[:, 2].max())
        if int(windows[:, 2].max()) > width:
            raise DraftsyncError(f"a window is longer than seq_len={width}", "cut windows with the same seq_len")
        hidden = self.manifest["target"]["hidden_size"]
        count = windows.shape[0]
        ids = torch.zeros(count, width, dtype=torch.long)
        valid = torch.zeros(count, width, dtype=torch.bool)
        loss_mask = torch.zeros(count, width, dtype=torch.bool)
        final = torch.zeros(count, width, hidden, dtype=torch.float32)
        aux_width = len(self.manifest["aux_layer_ids"]) * hidden
        aux = torch.zeros(count, width, aux_width, dtype=torch.float32) if self.has_aux else None
        for row, part in enumerate(self._window_parts(windows)):
            length = part["input_ids"].shape[0]
            ids[row, :length] = part["input_ids"].to(torch.long)
            valid[row, :length] = True
            loss_mask[row, :length] = part["loss_mask"].to(torch.bool)
            final[row, :length] = part["final"].to(torch.float32)
            if aux is not None:
                aux[row, :length] = part["aux"].to(torch.float32)
        return TrainingBatch(
            ids=ids, valid=valid, loss_mask=loss_mask & valid, aux=aux, final=final, target_logits=None
        )

    def _window_parts(self, windows: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Each window's input_ids, loss_mask, final and (EAGLE-3) aux rows, as stored in the shards."""
        if not self.stores_states:
            raise DraftsyncError(
                f"the dataset in {self.path} holds tokens only: its states are computed online",
                "read it through draftsync.speculative.data.online_states.OnlineDataset with its target",
            )
        names = ("input_ids", "loss_mask", "final", "aux") if self.has_aux else ("input_ids", "loss_mask", "final")
        return [self._read(sequence, start, length, names) for sequence, start, length in windows.tolist()]

    def _epoch_order(self, seed: int, epoch: int, count: int) -> torch.Tensor:
        key = (seed, epoch, count)
        if self._perm_cache is None or self._perm_cache[0] != key:
            mixed = int.from_bytes(hashlib.sha256(f"{seed}/{epoch}".encode()).digest()[:7], "big")
            self._perm_cache = (key, torch.randperm(count, generator=torch.Generator().manual_seed(mixed)))
        return self._perm_cache[1]

    def batch_for_step(
        self, step: int, batch_size: int, seq_len: int, seed: int, windows: torch.Tensor
    ) -> TrainingBatch:
        """Step `step`'s batch: a pure function of its arguments, so training can resume mid-epoch.

        Each epoch is a permutation of `windows` drawn from (seed, epoch); an epoch has
        max(1, W // batch_size) steps and the remainder of the permutation is left out that epoch.
        """
        rows = self.windows_for_step(step, batch_size, seed, windows)
        return self.batch(windows[rows], seq_len)

    def windows_for_step(self, step: int, batch_size: int, seed: int, windows: torch.Tensor) -> torch.Tensor:
        """Row indices into `windows` that step `step` trains on (see batch_for_step)."""
        count = int(windows.shape[0])
        if count == 0:
            raise DraftsyncError("there are no training windows", "give longer sequences or a smaller seq_len")
        per_epoch = max(1, count // batch_size)
        epoch, index = divmod(int(step), per_epoch)
        return self._epoch_order(seed, epoch, count)[index * batch_size : (index + 1) * batch_size]

    def batches(self, windows: torch.Tensor, batch_size: int, seq_len: int | None = None) -> Iterator[TrainingBatch]:
        """All windows in order, `batch_size` at a time: for evaluation on held-out sequences."""
        for begin in range(0, int(windows.shape[0]), batch_size):
            yield self.batch(windows[begin : begin + batch_size], seq_len)

    # checks
    def summary_rows(self, chunk_tokens: int = 8192) -> list[dict]:
        """One row per sequence for the data checks, read shard by shard in chunks of ~chunk_tokens."""
        from safetensors import safe_open

        names = self.manifest["task_names"]
        rows: list[dict] = []
        for shard in self.manifest["shards"]:
            with safe_open(str(self.path / shard["file"]), framework="pt") as handle:
                keys = set(handle.keys())
                offsets = handle.get_tensor("offsets")
                tasks = handle.get_tensor("task_index").tolist()
                if "final" in keys:
                    aux_width = handle.get_slice("aux").get_shape()[1] if "aux" in keys else 0
                    final_width = handle.get_slice("final").get_shape()[1]
                else:  # tokens only: the target computes states of these widths when training reads them
                    hidden = self.manifest["target"]["hidden_size"]
                    aux_width = len(self.manifest["aux_layer_ids"]) * hidden if self.has_aux else 0
                    final_width = hidden
                count = offsets.shape[0] - 1
                first = 0
                while first < count:
                    last = first + 1
                    while last < count and int(offsets[last + 1] - offsets[first]) <= chunk_tokens:
                        last += 1
                    begin, end = int(offsets[first]), int(offsets[last])
                    ids = handle.get_slice("input_ids")[begin:end].to(torch.int64)
                    mask = handle.get_slice("loss_mask")[begin:end].to(torch.int64)
                    bad = torch.zeros(end - begin, dtype=torch.int64)
                    if "final" in keys:
                        bad += (~torch.isfinite(handle.get_slice("final")[begin:end].float())).sum(-1)
                    if aux_width and "aux" in keys:
                        bad = bad + (~torch.isfinite(handle.get_slice("aux")[begin:end].float())).sum(-1)
                    for i in range(first, last):
                        a, b = int(offsets[i]) - begin, int(offsets[i + 1]) - begin
                        rows.append(
                            {
                                "task": names[tasks[i]] if 0 <= tasks[i] < len(names) else f"<task {tasks[i]}>",
                                "length": b - a,
                                "loss_tokens": int(mask[a:b].sum()),
                                "max_token_id": int(ids[a:b].max()) if b > a else -1,
                                "nonfinite": int(bad[a:b].sum()),
                                "aux_width": int(aux_width),
                                "final_width": int(final_width),
                            }
                        )
                    first = last
        return rows
