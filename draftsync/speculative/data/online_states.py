"""Online hidden states: a dataset of tokens only, whose target states are computed when a batch needs them.

Nothing but token ids goes to disk (5 bytes a token against 8 x hidden + 5 for EAGLE-3 shards), at the cost of a
target forward pass per batch. A window's states are those of its sequence run from the start (the target is run
over each sequence up to the end of its last window in the batch), so they are the states an offline build stores,
before its 16-bit rounding. Batches stay pure functions of the step, so training resumes as it does offline.
The states come from the target's own forward pass, or from a state source (`shard_writer.StateSource`): a vLLM
server asked for each batch's sequences (`serving/vllm_states.py`), as speculators' `--on-missing generate` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.data.shard_reader import ShardDataset
from draftsync.speculative.data.shard_writer import StateSource


class OnlineDataset(ShardDataset):
    """A tokens-only dataset read with its target, or with a state source: `batch` has either compute the states of
    the windows' sequences."""

    def __init__(self, path: str | Path, target: Any, open_handles: int = 4, states: StateSource | None = None):
        super().__init__(path, open_handles)
        if self.stores_states:
            raise DraftsyncError(f"the dataset in {self.path} stores its states", "read it as a ShardDataset (offline)")
        if target is None and states is None:
            raise DraftsyncError(f"the dataset in {self.path} holds tokens only", "read it with its target or states")
        self.target, self.states = target, states

    def _window_parts(self, windows: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        """Each window's tokens from the shards and its states from one forward pass of the target over the batch's
        sequences, each run once from its start to the end of its last window in the batch."""
        ends: dict[int, int] = {}
        for sequence, start, length in windows.tolist():
            ends[sequence] = max(ends.get(sequence, 0), start + length)
        order = sorted(ends)
        tokens = {s: self._read(s, 0, ends[s], ("input_ids", "loss_mask")) for s in order}
        finals, auxes = self._states(order, ends, tokens)
        for state in (*finals, *auxes):
            if not torch.isfinite(state).all():
                raise DraftsyncError(
                    f"the target computed non-finite hidden states for the dataset in {self.path}",
                    "check the target's weights and dtype (a float16 target can overflow; use bfloat16)",
                )
        row_of = {sequence: row for row, sequence in enumerate(order)}
        parts = []
        for sequence, start, length in windows.tolist():
            source, span = row_of[sequence], slice(start, start + length)
            part = {name: tokens[sequence][name][span] for name in ("input_ids", "loss_mask")}
            part["final"] = finals[source][span]
            if auxes:
                part["aux"] = auxes[source][span]
            parts.append(part)
        return parts

    def _states(
        self, order: list[int], ends: dict[int, int], tokens: dict[int, dict[str, torch.Tensor]]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per sequence of `order`, its final states and its aux states (none where the method reads none), float32."""
        if self.states is not None:
            taken = self.states([tokens[s]["input_ids"][: ends[s]].tolist() for s in order])
            return [final.float() for _, final in taken], [aux.float() for aux, _ in taken] if self.has_aux else []
        ids = torch.zeros(
            len(order), max(ends.values()), dtype=torch.long
        )  # right padding: causal attention ignores it
        for row, sequence in enumerate(order):
            ids[row, : ends[sequence]] = tokens[sequence]["input_ids"].to(torch.long)
        device = next(self.target.parameters()).device
        states = capture(self.target, ids.to(device), self.aux_layer_ids, all_logits=False)
        final = states.final.float().cpu()
        aux = states.aux.float().cpu() if self.has_aux else None
        return list(final), list(aux) if aux is not None else []


def open_dataset(path: str | Path, target: Any, states: StateSource | None = None) -> ShardDataset:
    """The dataset at `path` as training reads it: its stored states, or states `target` (or `states`) computes per
    batch."""
    dataset = ShardDataset(path)
    return dataset if dataset.stores_states else OnlineDataset(path, target, states=states)
