"""vLLM's hidden-states connector on every device vLLM runs on, its CPU build included.

A sync takes a target's hidden states from vLLM with the `extract_hidden_states` speculative method: the target's
aux layers are cached beside its KV cache, and a KV connector writes each finished request's states to a
safetensors file. vLLM's own connector (`ExampleHiddenStatesConnector`) copies them out with a CUDA stream, a CUDA
event and pinned memory, so on the CPU build it dies ("pin_memory=True requires a CUDA ..."). This subclass keeps
vLLM's connector where the cache is on a GPU and, elsewhere, copies the states out of the cache at once (a CPU cache
needs no transfer) before handing the write to the same writer threads and file locks. vLLM loads it by module
path: `kv_connector_module_path: draftsync_hidden_states`, `kv_connector: DraftsyncHiddenStatesConnector`.

Requests and files are vLLM's: a client reads `kv_transfer_params.hidden_states_path` from the response and the file
holds `hidden_states` [tokens, layers, hidden] and `token_ids`; the `.lock` beside it is held until the file is whole.
"""

from __future__ import annotations

import os
from functools import partial

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)

CONNECTOR = "DraftsyncHiddenStatesConnector"  # the class name vLLM's kv_connector names


class _Copied:
    """What vLLM's connector polls for a finished device-to-host copy: a CPU copy has finished when it returns."""

    def query(self) -> bool:
        return True


def _write(tensors: dict[str, torch.Tensor], filename: str, lock_fd: int | None) -> None:
    """Writer thread: the file, then the lock released, so a reader holding LOCK_SH sees it whole."""
    try:
        save_file(tensors, filename)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


class DraftsyncHiddenStatesConnector(ExampleHiddenStatesConnector):
    """`ExampleHiddenStatesConnector` on a GPU; a synchronous copy out of the cache anywhere else."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if self._kv_cache is None or self._kv_cache.is_cuda:
            super()._submit_async_write(pending)
            return
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size, dtype=torch.long)).flatten()
        # A copy, not a view: the request's blocks go back to the cache once get_finished reports it.
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        if pending.req_id in self._req_futures:
            raise RuntimeError(f"hidden states of request {pending.req_id} are already being written")
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            import fcntl

            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(_write, tensors, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Copied()  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
