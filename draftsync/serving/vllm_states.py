"""The target's hidden states taken by vLLM: how a sync gets them from a target only vLLM can hold (tensor parallel,
quantized, MoE kernels), and on the CPU build too.

A vLLM server of the target runs the `extract_hidden_states` speculative method with draftsync's hidden-states
connector (`speculative/data/vllm_connector.py`). A request is a completion of the row's token ids with one token to
generate; the response names the file its states were written to, on this machine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_args import ServerResources, VllmLaunch
from draftsync.speculative.data.vllm_connector import (
    CONNECTOR_CLASS,
    CONNECTOR_MODULE,
    extract_hidden_states_config,
    hidden_states_connector_config,
    read_states_file,
)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)
SERVED_NAME = "hidden-states"
IN_FLIGHT = 64  # rows in the engine at once: vLLM batches their prefills
REQUEST_TIMEOUT_S = 900.0
CONNECTOR_FIX = (
    "install draftsync's vLLM plugin into the engine's environment (`make vllm` does, or "
    "`pip install deploy/vllm-cpu-plugin` with that environment's pip)"
)


def check_connector(engine: Any) -> None:
    """Refuse, before any server starts, an engine whose Python cannot import draftsync's connector. An engine given
    as a command (not an interpreter) cannot be asked, and is trusted."""
    import subprocess

    if not engine.interpreter:
        return
    probe = [engine.command[0], "-c", f"import {CONNECTOR_MODULE}; {CONNECTOR_MODULE}.{CONNECTOR_CLASS}"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DraftsyncError(
            f"the vLLM at {engine.command[0]} could not be asked for its connector ({error})", CONNECTOR_FIX
        ) from error
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise DraftsyncError(
            f"the vLLM at {engine.command[0]} cannot load draftsync's hidden-states connector "
            f"{CONNECTOR_MODULE}.{CONNECTOR_CLASS}: {lines[-1] if lines else f'exit code {done.returncode}'}",
            f"{CONNECTOR_FIX}; or set `hidden_states_engine: transformers` in the sync profile",
        )


class VllmStateReader:
    """One vLLM server of the target caching the states of `layer_ids`, answering rows of token ids `in_flight` at
    a time. A context manager: entering starts the server (an engine that fails is named by its own error line and
    log), leaving stops it. Each file is read, checked against the row and deleted. A server that dies is started
    again up to `restarts` times, and the rows it lost are asked again: a training that reads its states online goes
    on where it was."""

    def __init__(
        self,
        target_dir: str | Path,
        layer_ids: Sequence[int],
        work_dir: str | Path,
        in_flight: int = IN_FLIGHT,
        engine: Any = None,
        resources: ServerResources | None = None,
        restarts: int = 0,
    ) -> None:
        from draftsync.model_paths import confined_model_path

        if in_flight < 1:
            raise DraftsyncError(f"in_flight={in_flight}", "send at least one row at a time")
        self.target_dir = confined_model_path(target_dir, "target checkpoint")
        self.layer_ids = tuple(layer_ids)
        self.work_dir = Path(work_dir)
        self.storage = self.work_dir / "states"
        self.in_flight, self.engine = in_flight, engine
        self.resources = resources or ServerResources()
        self.restarts = restarts
        self.server: Any = None
        self._client: Any = None
        self._pool: Any = None
        self._lock = threading.Lock()
        self._generation = 0  # the server's starts: a thread that saw it die restarts it only once

    def launch(self, port: int) -> VllmLaunch:
        """The rendered launch: the target alone, with the plan's resources, caching `layer_ids` through the
        connector."""
        import json

        from draftsync.serving.vllm_args import render_vllm_command

        launch = render_vllm_command(
            self.target_dir,
            port=port,
            served_model_name=SERVED_NAME,
            tensor_parallel_size=self.resources.tensor_parallel_size,
            extra_args=self.resources.extra_args(),
        )
        speculative = extract_hidden_states_config(self.layer_ids)
        argv = [
            *launch.argv,
            "--speculative-config",
            json.dumps(speculative, separators=(",", ":")),
            "--kv-transfer-config",
            json.dumps(hidden_states_connector_config(self.storage), separators=(",", ":")),
        ]
        return VllmLaunch(argv=argv, speculative_config=speculative)

    def __enter__(self) -> VllmStateReader:
        from concurrent.futures import ThreadPoolExecutor

        import httpx

        from draftsync.serving.vllm_engine import find_vllm_engine

        self.engine = self.engine or find_vllm_engine()
        self.storage.mkdir(parents=True, exist_ok=True)
        self._start()
        self._client = httpx.Client(
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
            limits=httpx.Limits(max_connections=self.in_flight, max_keepalive_connections=self.in_flight),
        )
        self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="vllm-states")
        return self

    def _start(self) -> None:
        from draftsync.serving.process import free_port
        from draftsync.serving.vllm_engine import start_vllm_server, wait_until_serving

        port = free_port()
        log = self.work_dir / f"hidden-states-{port}.log"
        environment = self.resources.environment(server="the hidden states' server")
        self.server = start_vllm_server(self.engine, self.launch(port).argv, "127.0.0.1", port, log, environment)
        wait_until_serving(self.server, f"the hidden states of {self.target_dir}")

    def _restart(self, seen: int, why: DraftsyncError) -> None:
        """Start the server again after the start `seen` died, unless another thread already has; out of restarts,
        `why` is the error."""
        with self._lock:
            if self._generation != seen:
                return
            if self.restarts < 1:
                raise why
            self.restarts -= 1
            logger.warning("%s; starting it again (%d restart(s) left)", why.what, self.restarts)
            self.server.stop()
            self._start()
            self._generation += 1

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
        self.server = self._client = self._pool = None

    def states(self, rows: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Per row, its states [tokens, len(layer_ids), hidden] in `layer_ids` order, as the target's dtype."""
        if self._client is None:
            raise DraftsyncError("the vLLM state reader is not started", "use it as `with VllmStateReader(...)`")
        futures = [self._pool.submit(self._row, list(map(int, row))) for row in rows]
        return [future.result() for future in futures]

    def _row(self, ids: list[int]) -> torch.Tensor:
        with self._lock:  # the server and its start, read together (a restart holds the lock until it serves)
            server, seen = self.server, self._generation
        try:
            return self._ask(ids, server)
        except _RequestFailed as failed:
            died = _died(server)
            error = self._failed(failed.cause, server)  # after the wait: "died" once its process is gone
            if not died:
                raise error from failed
            self._restart(seen, error)
        with self._lock:
            server = self.server
        try:
            return self._ask(ids, server)
        except _RequestFailed as failed:
            raise self._failed(failed.cause, server) from failed

    def _ask(self, ids: list[int], server: Any) -> torch.Tensor:
        import httpx

        body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
        try:
            response = self._client.post(f"{server.url}/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise _RequestFailed(f"{type(error).__name__}: {error}") from error
        if response.status_code != 200:
            raise _RequestFailed(f"HTTP {response.status_code}: {response.text[:300]}")
        path = Path(str((response.json().get("kv_transfer_params") or {}).get("hidden_states_path", "")))
        if not path.is_absolute() or path.resolve().parent != self.storage.resolve():
            raise _RequestFailed(
                f"the server named no states file under {self.storage} ({str(path)!r}): is its connector "
                f"{CONNECTOR_MODULE}.{CONNECTOR_CLASS}?"
            )
        try:
            saved = read_states_file(path)
        finally:
            path.unlink(missing_ok=True)
            Path(f"{path}.lock").unlink(missing_ok=True)
        if saved["token_ids"].tolist() != ids:
            raise _RequestFailed(f"the states file {path.name} holds other tokens than the row sent")
        return saved["hidden_states"]

    def _failed(self, what: str, server: Any) -> DraftsyncError:
        from draftsync.serving.vllm_engine import engine_error_line

        state = "died" if not server.running() else "failed a request"
        cause = engine_error_line(server.log_path) or what
        return DraftsyncError(
            f"vLLM taking the hidden states of {self.target_dir} {state}: {cause} (log: {server.log_path})",
            "read the log for the cause and rerun (the dataset build resumes at its last shard), or set "
            "`hidden_states_engine: transformers` in the sync profile",
        )


class _RequestFailed(Exception):
    """A row the server did not answer: `cause` goes into the reader's error once it knows whether the server died."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


def _died(server: Any, wait_s: float = 2.0) -> bool:
    """Whether `server` has exited: a request can fail a moment before its process is reaped."""
    deadline = time.monotonic() + wait_s
    while server.running():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def aux_and_final(reader: VllmStateReader, aux_layer_ids: Sequence[int], num_layers: int, final_norm: Any) -> Any:
    """A shard writer's state source (`shard_writer.StateSource`) reading through `reader`: per row, the aux states
    side by side in `aux_layer_ids` order and the last state through `final_norm` (the target's own norm module)."""
    import torch

    where = {layer: index for index, layer in enumerate(reader.layer_ids)}
    missing = [layer for layer in (*aux_layer_ids, num_layers) if layer not in where]
    if missing:
        raise DraftsyncError(
            f"the hidden states' server caches layers {list(reader.layer_ids)}, not {missing}",
            "start it with captured_layer_ids(aux ids, num_layers)",
        )

    def source(rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for states in reader.states(rows):
            aux = torch.cat([states[:, where[layer]] for layer in aux_layer_ids] or [states[:, :0, 0]], dim=-1)
            weight = next(final_norm.parameters())  # a device_map may hold the norm on a GPU
            with torch.no_grad():
                final = final_norm(states[:, where[num_layers]].to(weight.device, weight.dtype)).cpu()
            out.append((aux, final))
        return out

    return source
