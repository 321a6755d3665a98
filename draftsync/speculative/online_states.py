"""Online hidden states: a dataset of tokens only, whose target states are computed when a batch needs them.

Nothing but token ids goes to disk (5 bytes a token against 8 x hidden + 5 for EAGLE-3 shards), at the cost of a
target forward pass per batch. A window's states are those of its sequence run from the start (the target is run
over each sequence up to the end of its last window in the batch), so they are the states an offline build stores,
before its 16-bit rounding. Batches stay pure functions of the step, so training resumes as it does offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.hidden_states import capture
from draftsync.speculative.shard_reader import ShardDataset
from draftsync.speculative.training_batch import TrainingBatch


class OnlineDataset(ShardDataset):
    """A tokens-only dataset read with its target: `batch` runs the target over the windows' sequences."""

    def __init__(self, path: str | Path, target: Any, open_handles: int = 4):
        super().__init__(path, open_handles)
        if self.stores_states:
            raise DraftsyncError(f"the dataset in {self.path} stores its states", "read it as a ShardDataset (offline)")
        self.target = target

    def batch(self, windows: torch.Tensor, seq_len: int | None = None) -> TrainingBatch:
        windows = torch.as_tensor(windows, dtype=torch.int64).reshape(-1, 3)
        if windows.shape[0] == 0:
            raise DraftsyncError("a batch of zero windows was asked for", "select at least one window")
        width = int(seq_len) if seq_len is not None else int(windows[:, 2].max())
        if int(windows[:, 2].max()) > width:
            raise DraftsyncError(f"a window is longer than seq_len={width}", "cut windows with the same seq_len")
        # each sequence once, up to the end of its last window in this batch
        ends: dict[int, int] = {}
        for sequence, start, length in windows.tolist():
            ends[sequence] = max(ends.get(sequence, 0), start + length)
        order = sorted(ends)
        tokens = {s: self._read(s, 0, ends[s], ("input_ids", "loss_mask")) for s in order}
        longest = max(ends.values())
        ids = torch.zeros(len(order), longest, dtype=torch.long)  # right padding: causal attention ignores it
        for row, sequence in enumerate(order):
            ids[row, : ends[sequence]] = tokens[sequence]["input_ids"].to(torch.long)
        device = next(self.target.parameters()).device
        states = capture(self.target, ids.to(device), self.aux_layer_ids, all_logits=False)
        aux_all = states.aux.float().cpu() if self.has_aux else None
        final_all = states.final.float().cpu()
        if not torch.isfinite(final_all).all() or (aux_all is not None and not torch.isfinite(aux_all).all()):
            raise DraftsyncError(
                f"the target computed non-finite hidden states for the dataset in {self.path}",
                "check the target's weights and dtype (a float16 target can overflow; use bfloat16)",
            )
        del states
        row_of = {sequence: row for row, sequence in enumerate(order)}
        count, hidden = windows.shape[0], final_all.shape[-1]
        out_ids = torch.zeros(count, width, dtype=torch.long)
        valid = torch.zeros(count, width, dtype=torch.bool)
        loss_mask = torch.zeros(count, width, dtype=torch.bool)
        final = torch.zeros(count, width, hidden, dtype=torch.float32)
        aux = torch.zeros(count, width, aux_all.shape[-1], dtype=torch.float32) if aux_all is not None else None
        for row, (sequence, start, length) in enumerate(windows.tolist()):
            source, span = row_of[sequence], slice(start, start + length)
            out_ids[row, :length] = ids[source, span]
            valid[row, :length] = True
            loss_mask[row, :length] = tokens[sequence]["loss_mask"][span].to(torch.bool)
            final[row, :length] = final_all[source, span]
            if aux is not None and aux_all is not None:
                aux[row, :length] = aux_all[source, span]
        return TrainingBatch(
            ids=out_ids, valid=valid, loss_mask=loss_mask & valid, aux=aux, final=final, target_logits=None
        )


def open_dataset(path: str | Path, target: Any) -> ShardDataset:
    """The dataset at `path` as training reads it: its stored states, or states `target` computes per batch."""
    dataset = ShardDataset(path)
    return dataset if dataset.stores_states else OnlineDataset(path, target)
