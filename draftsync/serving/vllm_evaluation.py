"""The vLLM evaluation backend: the validation checklist and benchmarks measured on the engine that will serve.

`VllmBackend` serves the pair exactly as a rollout does (`vllm serve`, the argv `launch: vllm` starts, with the
CPU settings on a CPU), one server per gamma (gamma 0: speculation off), and sends each request on its own as a
non-streaming completion of the prompt's token ids. Every figure is vLLM's own, read from the response:
- `metrics.speculative_decoding` (`--per-request-spec-decode-metrics`, vLLM >= 0.32): the request's verify
  steps, draft tokens, accepted tokens and its acceptance histogram (steps that accepted exactly j drafts), from
  which the per-position counts follow: position i was accepted in every step that accepted more than i;
- `metrics.time_to_first_token_ms` and `generation_time_ms` (`--enable-per-request-metrics`): the engine's own
  timestamps, from scheduling to the first token and from the first to the last, so TPOT carries no HTTP time.
A server that reports no per-request counts while speculating (an older vLLM) is refused: the acceptance gates
cannot be measured there, and they must fail rather than pass on nothing. One without per-request timing gives
NaN timings, so the speed gates compare nothing and fail.

Switching gamma restarts the server (`cheap_gamma_switch = False`): the checklist groups its requests by gamma.
With `ignore_eos` (the default) every request generates exactly `max_tokens` tokens, as the reference engine does,
so both backends put the same load on the target (benchmarks); the checklist turns it off, so requests end at the
target's EOS as served ones do. Server logs stay in `log_dir`; an engine that dies mid-run is named by
its own error line and that log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import SERVED_NAME, EvalRequest, RequestResult
from draftsync.serving.vllm_args import ServerResources
from draftsync.speculative.methods import CHECKPOINT_METHODS, METHODS, VLLM_METHODS, needs_no_checkpoint

WARM_UP_PROMPT = "def main():\n    return 0\n"
MAX_CHAIN_GAMMA = 16  # chained drafters propose as far as asked; the reference backend stops at 16 too
# Timings per request, on top of the per-request spec-decode counts every speculative launch asks for.
TIMING_FLAG = "--enable-per-request-metrics"
REQUEST_TIMEOUT_S = 600.0


def resolve_method(drafter_dir: str | Path | None, method: str | None) -> str | None:
    """The drafter method to serve: the one `drafter_dir` holds (read from its config.json), checked against
    `method` when both are given; "ngram" needs no drafter; None means speculation off."""
    if method is not None and method not in VLLM_METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} is unknown to the vLLM backend",
            f"use one of {', '.join(VLLM_METHODS)}, or leave it unset to read it from the drafter",
        )
    if needs_no_checkpoint(method):
        if drafter_dir is not None:
            raise DraftsyncError(
                f"a drafter directory ({drafter_dir}) was given with method {method!r}, which "
                "drafts from the prompt and loads no checkpoint",
                "pass drafter_dir=None for ngram, or the drafter's own method for the directory",
            )
        return method
    if drafter_dir is None:
        if method is not None:
            raise DraftsyncError(
                f"method {method!r} was given without a drafter directory",
                "pass the drafter's checkpoint directory, or no method to run the target alone",
            )
        return None
    from draftsync.speculative.methods.registry import drafter_method

    saved = drafter_method(drafter_dir)
    if saved not in VLLM_METHODS:
        raise DraftsyncError(
            f"drafter {drafter_dir} is a {saved!r} drafter, which the vLLM backend cannot run",
            f"use a drafter of one of {', '.join(CHECKPOINT_METHODS)}",
        )
    if method is not None and METHODS[method].vllm_method != METHODS[saved].vllm_method:
        raise DraftsyncError(
            f"method {method!r} was given for drafter {drafter_dir}, which holds a {saved!r} drafter",
            f"pass method={saved!r}, or leave it unset to read it from the drafter",
        )
    return saved


def proposable_tokens(method: str | None, drafter_dir: str | Path | None) -> int:
    """The most draft tokens a drafter proposes per step: what its config.json bounds gamma by (a Medusa drafter's
    heads, a DFlash drafter's block), else MAX_CHAIN_GAMMA (chained drafters and ngram); none without speculation."""
    if method is None:
        return 0
    field = METHODS[method].gamma_limit_field
    if field is None:
        return MAX_CHAIN_GAMMA
    from draftsync.speculative.methods.checkpoint_files import read_json

    assert drafter_dir is not None, f"a {method} drafter is served from its directory"
    path, config = read_json(drafter_dir)
    limit = config.get(field)
    if not isinstance(limit, int) or limit < 1:
        raise DraftsyncError(
            f"{path} does not bound its {method} drafter's gamma ({field}={limit!r})",
            f"re-save the drafter with save_drafter, which writes {field}",
        )
    return limit


def accepted_per_position(histogram: Sequence[int], gamma: int) -> list[int]:
    """Accepted drafts per position from vLLM's per-request histogram (index j: steps that accepted exactly j):
    position i (0-based) was accepted in every step that accepted more than i drafts."""
    counts = [int(c) for c in histogram]
    return [sum(counts[i + 1 :]) for i in range(gamma)]


def request_result(
    index: int, request: EvalRequest, prompt_tokens: int, body: Mapping[str, Any], gamma: int, server: str
) -> RequestResult:
    """One completion response as a `RequestResult`, from vLLM's own per-request counts and timestamps."""
    choice = body["choices"][0]
    token_ids = [int(t) for t in choice.get("token_ids") or []]
    output_tokens = len(token_ids) or int(body["usage"]["completion_tokens"])
    metrics = body.get("metrics") or {}
    ttft_ms, decode_ms = metrics.get("time_to_first_token_ms"), metrics.get("generation_time_ms")
    ttft_s = ttft_ms / 1000.0 if ttft_ms is not None else math.nan
    seconds = ttft_s + decode_ms / 1000.0 if decode_ms is not None else math.nan
    drafts = draft_tokens = accepted = 0
    per_position = [0] * gamma
    if gamma:
        spec = metrics.get("speculative_decoding")
        if not spec:
            raise DraftsyncError(
                f"vLLM at {server} answered a speculative request without per-request spec-decode counts "
                "(metrics.speculative_decoding): the acceptance gates cannot be measured on it",
                "serve with vLLM 0.32 or newer, launched with --per-request-spec-decode-metrics (draftsync adds it), "
                "or validate on the reference backend (--backend reference)",
            )
        drafts = int(spec["num_spec_steps"])
        draft_tokens = int(spec["num_draft_tokens"])
        accepted = int(spec["num_accepted_draft_tokens"])
        per_position = accepted_per_position(spec["acceptance_histogram"], gamma)
    return RequestResult(
        index=index,
        task=request.task,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        accepted_per_position=per_position,
        seconds=seconds,
        ttft_s=ttft_s,
        token_ids=token_ids,
    )


class VllmBackend:
    """Real vLLM servers as an `EvaluationBackend`: one server per gamma, started when first asked for.

    `method` None reads the drafter's method from its directory; "ngram" needs no directory. `extra_args` go to
    every launch (a deployment's `extra_vllm_args`), less the flags `resources` set from the plan. Starting a server
    stops the one before, so one engine holds the device at a time, and warms the new one up. `starts` counts the
    engine starts, for the record.
    """

    name = "vllm"
    cheap_gamma_switch = False  # each gamma is its own server

    def __init__(
        self,
        target_dir: str | Path,
        drafter_dir: str | Path | None = None,
        method: str | None = None,
        *,
        log_dir: str | Path,
        extra_args: Sequence[str] = (),
        ignore_eos: bool = True,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        draft_sampling: str | None = None,
        engine: Any = None,
        resources: ServerResources | None = None,
    ):
        from draftsync.model_paths import confined_model_path

        self.target_dir = confined_model_path(target_dir, "target checkpoint")
        self.drafter_dir = confined_model_path(drafter_dir, "drafter checkpoint") if drafter_dir is not None else None
        if not (self.target_dir / "config.json").is_file():
            raise DraftsyncError(
                f"target {self.target_dir} has no config.json", "point at a saved checkpoint directory"
            )
        self.method = resolve_method(self.drafter_dir, method)
        self.max_gamma = proposable_tokens(self.method, self.drafter_dir)
        self.log_dir = Path(log_dir)
        self.resources = resources or ServerResources()
        self.extra_args = self.resources.merged_args(extra_args)
        self.ignore_eos = bool(ignore_eos)
        self.prompt_lookup = (prompt_lookup_min, prompt_lookup_max)
        # vLLM's draft_sample_method (render_vllm_command); None: its default. Settable: a server started under
        # another is restarted when next asked for.
        self.draft_sampling = draft_sampling
        if needs_no_checkpoint(self.method):  # a bad lookup window fails here, not when a server starts
            self.launch(1, 0)
        self.engine = engine  # found when the first server starts
        self.starts = 0
        self._server: Any = None
        self._speculating = False  # whether the running server drafts
        self._key: tuple | None = None  # (gamma, schedule, draft sampling) of the running server
        self._tokenizer: Any = None

    def launch(self, gamma: int, port: int, schedule: list | None = None) -> Any:
        """The rendered `vllm serve` launch for `gamma` (0: the target alone; ngram always drafts), with a
        per-batch-size `schedule` when given."""
        from draftsync.serving.vllm_args import NO_SPECULATION, SpeculationSpec, render_vllm_command

        if gamma > self.max_gamma:
            raise DraftsyncError(
                f"gamma {gamma} is more than this drafter proposes ({self.max_gamma})",
                f"use a gamma of at most {self.max_gamma}",
            )
        speculation = NO_SPECULATION
        if gamma > 0:
            speculation = SpeculationSpec(
                method=self.method,
                model=self.drafter_dir,
                num_speculative_tokens=gamma,
                schedule=schedule,
                prompt_lookup_min=self.prompt_lookup[0],
                prompt_lookup_max=self.prompt_lookup[1],
                draft_sample_method=self.draft_sampling,
            )
        return render_vllm_command(
            self.target_dir,
            port=port,
            served_model_name=SERVED_NAME,
            speculation=speculation,
            tensor_parallel_size=self.resources.tensor_parallel_size,
            extra_args=[*self.extra_args, TIMING_FLAG],
        )

    def endpoint(self, gamma: int, schedule: list | None = None) -> str:
        """The URL of the server for `gamma` (and `schedule`), started when either changes."""
        return self.server(gamma, schedule).url

    def prepare_endpoints(self, gammas: Sequence[int]) -> None:
        """Nothing: a vLLM server holds its whole KV cache, so one runs at a time and starts when asked for."""

    def server(self, gamma: int, schedule: list | None = None) -> Any:
        """The running server for `gamma` (and `schedule`, and the draft sampling), starting it (and stopping the one
        before) when any changes."""
        from draftsync.serving.process import free_port
        from draftsync.serving.vllm_engine import find_vllm_engine, start_vllm_server, wait_until_serving

        key = (gamma, tuple(tuple(entry) for entry in schedule or ()), self.draft_sampling if gamma else None)
        if self._server is not None and self._key == key:
            if not self._server.running():  # died since its last answer: say so rather than restart it quietly
                raise self._died("the server process is gone")
            return self._server
        self.launch(gamma, 0, schedule)  # refuses a gamma or schedule the drafter cannot serve before anything stops
        self._stop()
        self.engine = self.engine or find_vllm_engine()
        port = free_port()
        launch = self.launch(gamma, port, schedule)
        log = self.log_dir / f"evaluation-gamma{gamma}{'-scheduled' if schedule else ''}-{port}.log"
        environment = self.resources.environment(server="the validation server")
        server = start_vllm_server(self.engine, launch.argv, "127.0.0.1", port, log, environment)
        self.starts += 1
        wait_until_serving(server, f"evaluation at gamma {gamma}")
        self._server, self._key = server, key
        self._speculating = launch.speculative_config is not None
        # greedy and sampled verification take different paths: warm both where the engine samples drafts soundly
        sampled = () if self._speculating and self.engine.sampled_speculation_fault() else (1.0,)
        for temperature in (0.0, *sampled):
            self.complete(self._token_ids(WARM_UP_PROMPT), 8, temperature, 0)
        return server

    def _token_ids(self, prompt: str) -> list[int]:
        """Tokenized as the reference backend does it, so both backends see the same prompt ids."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            from draftsync.serving.vllm_args import trust_remote_code_setting

            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self.target_dir), trust_remote_code=trust_remote_code_setting()
            )
        return list(self._tokenizer(prompt)["input_ids"])

    def complete(
        self,
        ids: list[int],
        max_tokens: int,
        temperature: float,
        seed: int,
        http: Any = None,
        ignore_eos: bool | None = None,
    ) -> dict:
        """vLLM's answer to one completion of `ids` on the running server. Safe from several threads at once when
        each passes its own `httpx.Client` as `http` (a benchmark's concurrent clients). `ignore_eos`: None for the
        backend's own."""
        import httpx

        server = self._server
        if temperature > 0 and self._speculating:
            fault = self.engine.sampled_speculation_fault()
            if fault is not None:
                from draftsync.serving.vllm_engine import CPU_SAMPLED_SPECULATION_FIX

                raise DraftsyncError(
                    f"cannot measure speculative decoding at temperature {temperature:g} on this vLLM: {fault}",
                    CPU_SAMPLED_SPECULATION_FIX,
                )
        body = {
            "model": SERVED_NAME,
            "prompt": ids,
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "seed": int(seed),
            "ignore_eos": self.ignore_eos if ignore_eos is None else ignore_eos,
            "return_token_ids": True,
        }
        post = http.post if http is not None else httpx.post
        try:
            response = post(f"{server.url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
        except httpx.HTTPError as error:
            raise self._died(f"{type(error).__name__}: {error}") from error
        if response.status_code != 200:
            raise self._died(f"HTTP {response.status_code}: {response.text[:300]}")
        return response.json()

    def _died(self, what: str) -> DraftsyncError:
        """The error for a request that failed: the engine's own error line and its log when it has died."""
        from draftsync.serving.vllm_engine import engine_error_line

        server = self._server
        state = "died" if not server.running() else "failed a request"
        cause = engine_error_line(server.log_path) or what
        gamma = self._key[0] if self._key else "?"
        return DraftsyncError(
            f"vLLM serving the pair at gamma {gamma} {state} mid-run: {cause} (log: {server.log_path})",
            "read the log for the cause and rerun: the drafter stays a candidate, and a sync resumes at validation",
        )

    def generate(
        self, requests: Sequence[EvalRequest], gamma: int, temperature: float, seed: int
    ) -> list[RequestResult]:
        """The requests' results in order, as many in flight as the server has data-parallel replicas: vLLM's
        balancer gives each replica one, so each request still decodes alone, as the checklist measures TPOT."""
        from concurrent.futures import ThreadPoolExecutor

        server = self.server(gamma)

        def one(index: int, request: EvalRequest) -> RequestResult:
            ids = self._token_ids(request.prompt)
            body = self.complete(
                ids, request.max_tokens, temperature, seed + index, ignore_eos=request.runs_past_eos(self.ignore_eos)
            )
            return request_result(index, request, len(ids), body, gamma, server.url)

        replicas = self.resources.data_parallel_size
        if replicas == 1:
            return [one(index, request) for index, request in enumerate(requests)]
        with ThreadPoolExecutor(replicas, thread_name_prefix="vllm-validation") as pool:
            return list(pool.map(one, range(len(requests)), requests))

    def _stop(self) -> None:
        server, self._server, self._key = self._server, None, None
        self._speculating = False
        if server is not None:
            server.stop()

    def close(self) -> None:
        self._stop()
