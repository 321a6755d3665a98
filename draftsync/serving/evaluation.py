"""Evaluation backends: run a list of requests through a target (and its drafter) and count per request.

Validation and benchmarks talk to one interface, `EvaluationBackend`, so the same checklist runs on the
CPU reference engine (here, and on CPU workers) and on vLLM (GPU workers, `vllm_evaluation.py`). A
backend runs each request on its own and returns one `RequestResult` per request: the acceptance
counters vLLM keeps (drafts, draft tokens, accepted, accepted per position), the output, and its
timings. Percentiles are taken over these per-request counts, never derived from a mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from draftsync.errors import DraftsyncError

SERVED_NAME = "evaluation"  # the model name the evaluation's servers answer to
REFERENCE_START_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class EvalRequest:
    """One request of an evaluation: a prompt of a task, and how many tokens to generate. `ignore_eos`: generate
    all `max_tokens` past the target's EOS (True), end there (False), or as the backend does by default (None)."""

    prompt: str
    task: str
    max_tokens: int
    ignore_eos: bool | None = None

    def runs_past_eos(self, backend_default: bool) -> bool:
        return backend_default if self.ignore_eos is None else self.ignore_eos


@dataclass
class RequestResult:
    """What one request did. `ttft_s` is the time to the first token; TPOT is per token after it."""

    index: int
    task: str
    prompt_tokens: int
    output_tokens: int
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: list[int]
    seconds: float
    ttft_s: float
    token_ids: list[int] = field(default_factory=list, repr=False)

    @property
    def acceptance_rate(self) -> float:
        """accepted / draft tokens; NaN for a request that drafted nothing (it has no rate)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def tpot_ms(self) -> float:
        n = self.output_tokens
        return 1000.0 * (self.seconds - self.ttft_s) / (n - 1) if n > 1 else math.nan

    def row(self) -> dict[str, Any]:
        """The request as a flat table row (the per-request results table)."""
        return {
            "request": self.index,
            "task": self.task,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "seconds": self.seconds,
            "ttft_s": self.ttft_s,
            "tpot_ms": self.tpot_ms,
        }


class EvaluationBackend(Protocol):
    """Runs requests with speculation at `gamma` (0: off) and the given sampling temperature."""

    name: str
    max_gamma: int  # the most draft tokens the drafter can propose (Medusa: its heads)
    # How drafts are made and verified at T>0 (vLLM's draft_sample_method: "greedy" or "probabilistic"; None: the
    # backend's own). Settable between calls: validation measures both methods at a temperature above 0.
    draft_sampling: str | None
    # True when changing gamma between calls costs nothing (the reference engine keeps one engine per gamma);
    # False when it rebuilds an engine (vLLM): timings are then paired per batch instead of per request.
    cheap_gamma_switch: bool

    def generate(
        self, requests: Sequence[EvalRequest], gamma: int, temperature: float, seed: int
    ) -> list[RequestResult]: ...

    def endpoint(self, gamma: int, schedule: list | None = None) -> str:
        """The URL of the pair served at `gamma` (with a per-batch-size `schedule`, where the server takes one), under
        SERVED_NAME, for load from many clients at once (stress); one served instance at a time."""
        ...

    def prepare_endpoints(self, gammas: Sequence[int]) -> None:
        """Start the servers `endpoint` will be asked for at these gammas side by side, where the backend can hold
        them at once; each is up when this returns, so nothing starts beside a measurement."""
        ...

    def close(self) -> None: ...


def checkpoint_weight_bytes(directory: str | Path) -> int:
    """Bytes of the tensors in a checkpoint's safetensors files: the weights it puts in memory."""
    from safetensors import safe_open

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise DraftsyncError(f"{directory} holds no .safetensors weights", "point at a saved checkpoint directory")
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                total += math.prod(piece.get_shape()) * _dtype_bytes(piece.get_dtype())
    return total


def _dtype_bytes(dtype: str) -> int:
    sizes = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2, "U8": 1, "I8": 1, "BOOL": 1}
    if dtype not in sizes:
        raise DraftsyncError(f"unknown safetensors dtype {dtype}", "save the checkpoint with a standard dtype")
    return sizes[dtype]


class ReferenceBackend:
    """The CPU reference engine: target and drafter loaded once, one engine per gamma.

    Torch runs on `threads` threads (1 by default): tiny models are faster on one thread than on two
    that spin-wait on a busy machine, and timings are steadier. `ignore_eos` (default) generates every request to
    its `max_tokens`, the same load whatever the target answers, as benchmarks want; the checklist turns it off,
    so acceptance is counted on what a served request returns (a request ends at the target's EOS). `close()`
    gives the process its threads back: a sync trains after it validates, and training on one of two cores took
    45 s longer in the demo. `draft_sampling` is the engine's (`SpeculativeEngine`: "probabilistic" unless told).
    """

    name = "reference"
    cheap_gamma_switch = True

    def __init__(
        self,
        target_dir: str | Path,
        drafter_dir: str | Path | None,
        threads: int | None = 1,
        log_dir: str | Path | None = None,
        ignore_eos: bool = True,
        draft_sampling: str | None = None,
    ):
        import torch

        from draftsync.speculative.methods.registry import load_drafter
        from draftsync.speculative.targets import load_target

        self._threads_before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(int(threads))
        self.target, self.tokenizer = load_target(Path(target_dir))
        self.drafter = load_drafter(Path(drafter_dir)) if drafter_dir is not None else None
        if self.drafter is None:
            self.max_gamma = 0
        elif self.drafter.fixed_positions is not None:
            self.max_gamma = int(self.drafter.fixed_positions)  # Medusa: one proposal per head
        else:
            self.max_gamma = 16  # chains draft as far as asked
        self._engines: dict[tuple[int, str], Any] = {}  # (gamma, draft sampling) -> engine
        self.draft_sampling = draft_sampling
        self.target_dir, self.drafter_dir = Path(target_dir), Path(drafter_dir) if drafter_dir is not None else None
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.ignore_eos = bool(ignore_eos)
        self._servers: dict[tuple[int, str], Any] = {}  # (gamma, draft sampling) -> ServerProcess

    @property
    def _sampling(self) -> str:
        return self.draft_sampling or "probabilistic"

    def engine(self, gamma: int) -> Any:
        from draftsync.speculative.engine.decoding import SpeculativeEngine

        if gamma > self.max_gamma:
            raise DraftsyncError(
                f"gamma {gamma} is more than this drafter proposes ({self.max_gamma})",
                f"use a gamma of at most {self.max_gamma}",
            )
        key = (gamma, self._sampling)
        if key not in self._engines:
            self._engines[key] = SpeculativeEngine(self.target, self.drafter if gamma else None, gamma, self._sampling)
        return self._engines[key]

    def generate(
        self, requests: Sequence[EvalRequest], gamma: int, temperature: float, seed: int
    ) -> list[RequestResult]:
        import torch

        engine = self.engine(gamma)
        results = []
        with torch.no_grad():
            for index, request in enumerate(requests):
                ids = self.tokenizer(request.prompt)["input_ids"]
                eos = None if request.runs_past_eos(self.ignore_eos) else self.tokenizer.eos_token_id
                out = engine.generate(
                    ids, request.max_tokens, temperature=temperature, seed=seed + index, eos_token_id=eos
                )
                stats = out.stats
                results.append(
                    RequestResult(
                        index=index,
                        task=request.task,
                        prompt_tokens=len(ids),
                        output_tokens=len(out.token_ids),
                        drafts=stats.drafts,
                        draft_tokens=stats.draft_tokens,
                        accepted=stats.accepted,
                        accepted_per_position=list(stats.accepted_per_position),
                        seconds=out.seconds,
                        ttft_s=out.first_token_seconds,
                        token_ids=list(out.token_ids),
                    )
                )
        return results

    @property
    def max_model_len(self) -> int:
        return int(self.target.config.max_position_embeddings)

    def endpoint(self, gamma: int, schedule: list | None = None) -> str:
        """The pair behind the CPU reference server (one torch thread, as for the in-process engine). A gamma that was
        not prepared with the others stops them first. It answers one request at a time, so it takes no
        per-batch-size schedule."""
        if schedule:
            raise DraftsyncError(
                "the CPU reference server takes no per-batch-size schedule (it answers one request at a time)",
                "measure the schedule on vLLM (backend vllm)",
            )
        server = self._servers.get((gamma, self._sampling))
        if server is None or not server.running():
            self.prepare_endpoints([gamma])
        return self._servers[(gamma, self._sampling)].url

    def prepare_endpoints(self, gammas: Sequence[int]) -> None:
        """Start a reference server per gamma at once (each is a process importing torch: about 6 s, which two
        processes spend side by side on two cores), then wait until every one is healthy."""
        keys = [(g, self._sampling) for g in dict.fromkeys(gammas)]
        wanted = [key for key in keys if key not in self._servers or not self._servers[key].running()]
        if not wanted:
            return
        self._stop_servers()
        try:
            for key in keys:
                self._servers[key] = self._launch(key[0])
            for server in self._servers.values():
                server.wait_healthy(timeout=REFERENCE_START_TIMEOUT_S)
        except DraftsyncError:
            self._stop_servers()
            raise

    def _launch(self, gamma: int) -> Any:
        import tempfile

        from draftsync.serving.process import ServerProcess, free_port
        from draftsync.serving.reference_server import reference_server_command

        port = free_port()
        argv = reference_server_command(
            self.target_dir,
            self.drafter_dir if gamma else None,
            gamma,
            "127.0.0.1",
            port,
            SERVED_NAME,
            draft_sampling=self._sampling if gamma else None,
        )
        log_dir = self.log_dir or Path(tempfile.gettempdir()) / "draftsync-evaluation"
        return ServerProcess(
            argv,
            "127.0.0.1",
            port,
            log_dir / f"reference-gamma{gamma}-{self._sampling}-{port}.log",
            env={"DRAFTSYNC_TORCH_THREADS": "1"},
        ).start()

    def _stop_servers(self) -> None:
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.stop()

    def close(self) -> None:
        import torch

        self._stop_servers()
        self._engines.clear()
        torch.set_num_threads(self._threads_before)
