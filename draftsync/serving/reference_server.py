"""The CPU reference server: a target (and optionally its drafter) behind an OpenAI-style API.

It stands in for vLLM where no GPU is at hand and speaks the parts of vLLM's interface that
draftsync relies on: `POST /v1/completions`, `GET /v1/models`, `GET /health`, and `GET /metrics`
with vLLM's metric names and labels, so the monitor scrapes it exactly as it would scrape vLLM.
The model is loaded before the port opens, so `/health` answers 200 as soon as anything answers.

Run: python -m draftsync.serving.reference_server --target DIR [--drafter DIR --gamma K]
         --host 127.0.0.1 --port P --served-model-name NAME

Both directories must lie inside the model roots (the work dir and DRAFTSYNC_MODEL_ROOTS, see model_paths.py),
symlinks and `..` followed; otherwise the server exits with code 2 before it reads anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from draftsync.errors import DraftsyncError
from draftsync.speculative.engine.decoding import DRAFT_SAMPLE_METHODS

# vLLM's time-per-output-token buckets, with finer ones in front for tiny CPU models.
TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
ENGINE_LABEL = "0"  # vLLM labels every series with its engine index; one engine here


def reference_server_command(
    target_dir: Path | str,
    drafter_dir: Path | str | None,
    gamma: int,
    host: str,
    port: int,
    served_model_name: str,
    draft_sampling: str | None = None,
) -> list[str]:
    """The argument list that runs this server with the current interpreter; `draft_sampling` (with a drafter): how
    drafts are made and verified at T>0, as vLLM's draft_sample_method (None: the engine's own, probabilistic).

    The directories must lie inside the model roots (model_paths.py): refused here, before a process starts; the
    server checks them again itself."""
    from draftsync.model_paths import confined_model_path

    confined_model_path(target_dir, "target checkpoint")
    if drafter_dir is not None:
        confined_model_path(drafter_dir, "drafter checkpoint")
    argv = [sys.executable, "-m", "draftsync.serving.reference_server", "--target", str(target_dir)]
    if drafter_dir is not None:
        argv += ["--drafter", str(drafter_dir), "--gamma", str(int(gamma))]
        if draft_sampling is not None:
            argv += ["--draft-sampling", draft_sampling]
    return argv + ["--host", host, "--port", str(int(port)), "--served-model-name", served_model_name]


class BadRequest(Exception):
    """A client error, answered in OpenAI's error shape."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    max_tokens: int
    temperature: float
    seed: int | None


class ServingMetrics:
    """vLLM's metric names and labels on a registry of our own (never the process-global one).

    Like vLLM, the spec-decode series exist only when a drafter is loaded, with one per-position
    series for each of the gamma draft positions.
    """

    def __init__(self, model_name: str, gamma: int | None):
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        values = (model_name, ENGINE_LABEL)
        self.request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=self.registry,
        )
        self._success_labels = values
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=self.registry
        ).labels(*values)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=self.registry
        ).labels(*values)
        self.time_per_output_token = Histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            labels,
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        ).labels(*values)
        self.spec: dict[str, Any] | None = None  # the speculative counters, with a drafter
        if gamma is not None:
            per_position = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                labels + ["position"],
                registry=self.registry,
            )
            self.spec = {
                "drafts": Counter(
                    "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=self.registry
                ).labels(*values),
                "draft_tokens": Counter(
                    "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=self.registry
                ).labels(*values),
                "accepted": Counter(
                    "vllm:spec_decode_num_accepted_tokens",
                    "Number of accepted tokens.",
                    labels,
                    registry=self.registry,
                ).labels(*values),
                "per_position": [per_position.labels(*values, str(i)) for i in range(gamma)],
            }
        for reason in ("stop", "length"):  # present at zero from the start, as in vLLM
            self.request_success.labels(*values, reason)

    def observe(self, prompt_tokens: int, completion_tokens: int, finish_reason: str, stats: Any, seconds: float):
        self.request_success.labels(*self._success_labels, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)
        if completion_tokens:
            self.time_per_output_token.observe(seconds / completion_tokens)
        if self.spec is not None:
            self.spec["drafts"].inc(stats.drafts)
            self.spec["draft_tokens"].inc(stats.draft_tokens)
            self.spec["accepted"].inc(stats.accepted)
            for counter, accepted in zip(self.spec["per_position"], stats.accepted_per_position, strict=False):
                counter.inc(accepted)


class CompletionService:
    """One loaded engine, used by one request at a time (the lock), off the event loop."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        model_name: str,
        max_model_len: int,
        target_dir: str,
        drafter_dir: str | None,
        gamma: int | None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.target_dir = target_dir
        self.drafter_dir = drafter_dir
        self.gamma = gamma
        self.metrics = ServingMetrics(model_name, gamma)
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()  # fast tokenizers are not safe to share across threads

    def parse(self, body: Any) -> tuple[CompletionRequest, list[int]]:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise BadRequest(f"The model `{model}` does not exist.", "model", status=404, kind="NotFoundError")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest("`prompt` is required: a non-empty string (or a list of one)", "prompt")
        with self._tokenizer_lock:
            prompt_ids = self.tokenizer(prompt)["input_ids"]
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise BadRequest(
                f"the prompt has {len(prompt_ids)} tokens; this model's context is {self.max_model_len}", "prompt"
            )
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= room:
            raise BadRequest(f"`max_tokens` must be an integer from 1 to {room} for this prompt", "max_tokens")
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not 0 <= temperature <= 2:
            raise BadRequest("`temperature` must be a number from 0 to 2", "temperature")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise BadRequest("`seed` must be an integer", "seed")
        return CompletionRequest(prompt, max_tokens, float(temperature), seed), prompt_ids

    def complete(self, request: CompletionRequest, prompt_ids: list[int]) -> dict:
        """Blocking: runs in a worker thread."""
        eos = self.tokenizer.eos_token_id
        with self._lock:
            generation = self.engine.generate(
                prompt_ids,
                request.max_tokens,
                temperature=request.temperature,
                seed=request.seed,
                eos_token_id=eos,
            )
        tokens = list(generation.token_ids)
        finish_reason = "stop" if tokens and eos is not None and tokens[-1] == eos else "length"
        with self._tokenizer_lock:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        stats = generation.stats
        self.metrics.observe(len(prompt_ids), len(tokens), finish_reason, stats, generation.seconds)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
            "metrics": {"speculative_decoding": per_request_spec_decode(stats, self.gamma)},
            "draftsync": {
                "speculative": self.gamma is not None,
                "drafts": stats.drafts,
                "draft_tokens": stats.draft_tokens,
                "accepted": stats.accepted,
                "accepted_per_position": list(stats.accepted_per_position),
                "seconds": generation.seconds,
            },
        }


def per_request_spec_decode(stats: Any, gamma: int | None) -> dict | None:
    """A request's counts in the shape vLLM's `--per-request-spec-decode-metrics summary` gives them (None when
    speculation is off, as vLLM): clients read one format from either engine. With chain drafting, position i
    is accepted in every step that accepted more than i tokens, so the histogram of accepted tokens per step
    follows from the per-position counts."""
    if gamma is None:
        return None
    at_least = [stats.drafts, *stats.accepted_per_position] + [0] * (gamma + 1 - len(stats.accepted_per_position))
    histogram = [at_least[k] - at_least[k + 1] for k in range(gamma)] + [at_least[gamma]]
    return {
        "num_spec_tokens": gamma,
        "num_spec_steps": stats.drafts,
        "num_draft_tokens": stats.draft_tokens,
        "num_accepted_draft_tokens": stats.accepted,
        "acceptance_histogram": histogram,
        "mean_acceptance_length": stats.mean_acceptance_length,
        "draft_acceptance_rate": stats.acceptance_rate,
    }


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def create_app(service: CompletionService) -> Starlette:
    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(_: Request) -> Response:
        card = {
            "id": service.model_name,
            "object": "model",
            "created": service.created,
            "owned_by": "draftsync",
            "root": service.target_dir,
            "max_model_len": service.max_model_len,
            "draftsync": {"drafter": service.drafter_dir, "gamma": service.gamma},
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not valid JSON")
        try:
            parsed, prompt_ids = service.parse(body)
        except BadRequest as bad:
            return _error(bad.status, bad.message, bad.param, bad.kind)
        try:
            return JSONResponse(await run_in_threadpool(service.complete, parsed, prompt_ids))
        except Exception as error:  # the server keeps serving; the log keeps the traceback
            traceback.print_exc(file=sys.stderr)
            return _error(500, f"generation failed: {type(error).__name__}: {error}", kind="InternalServerError")

    async def metrics(_: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/v1/models", models),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/metrics", metrics),
        ]
    )


def load_service(
    target_dir: Path,
    drafter_dir: Path | None,
    gamma: int | None,
    model_name: str,
    draft_sampling: str = "probabilistic",
) -> CompletionService:
    """Load the target (and drafter) and wrap them in an engine; errors name the checkpoint at fault."""
    from draftsync.speculative.targets import load_target

    model, tokenizer = load_target(target_dir)
    from draftsync.speculative.engine.decoding import SpeculativeEngine

    drafter = None
    if drafter_dir is not None:
        from draftsync.speculative.methods.registry import load_drafter

        drafter = load_drafter(drafter_dir)
        assert gamma is not None, "a drafter is served with its gamma"
    engine = SpeculativeEngine(
        model, drafter, gamma if gamma is not None and drafter is not None else 0, draft_sampling=draft_sampling
    )
    return CompletionService(
        engine,
        tokenizer,
        model_name,
        max_model_len=int(model.config.max_position_embeddings),
        target_dir=str(target_dir),
        drafter_dir=str(drafter_dir) if drafter_dir is not None else None,
        gamma=gamma if drafter is not None else None,
    )


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m draftsync.serving.reference_server",
        description="CPU reference server: OpenAI-style completions with vLLM's metric names.",
    )
    parser.add_argument("--target", type=Path, required=True, help="target checkpoint directory (HF format)")
    parser.add_argument("--drafter", type=Path, help="EAGLE-3 drafter directory (speculators format)")
    parser.add_argument("--gamma", type=int, help="speculative tokens per draft (required with --drafter)")
    parser.add_argument(
        "--draft-sampling",
        choices=DRAFT_SAMPLE_METHODS,
        default="probabilistic",
        help="at T>0: drafts sampled from the drafter (probabilistic) or its argmax (greedy, vLLM's default)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", required=True)
    args = parser.parse_args(argv)
    if args.drafter is not None and (args.gamma is None or args.gamma < 1):
        parser.error("--drafter needs --gamma K with K >= 1")
    if args.drafter is None and args.gamma is not None:
        parser.error("--gamma only makes sense with --drafter")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    threads = os.environ.get("DRAFTSYNC_TORCH_THREADS")
    try:
        from draftsync.model_paths import confined_model_path

        target = confined_model_path(args.target, "target checkpoint")
        drafter = confined_model_path(args.drafter, "drafter checkpoint") if args.drafter is not None else None
        if threads:
            import torch

            if not threads.isdigit() or int(threads) < 1:
                raise DraftsyncError(
                    f"DRAFTSYNC_TORCH_THREADS={threads!r} is not a positive integer",
                    "set it to e.g. 1 or 2, or unset it",
                )
            torch.set_num_threads(int(threads))
        service = load_service(target, drafter, args.gamma, args.served_model_name, args.draft_sampling)
    except DraftsyncError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    import uvicorn

    print(
        f"serving {args.served_model_name} on http://{args.host}:{args.port} "
        f"(drafter: {args.drafter or 'none'}, gamma: {args.gamma or '-'})",
        flush=True,
    )
    uvicorn.run(create_app(service), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
