"""The target's responses written by vLLM: one plain server, many requests in flight, so the engine batches them.

How speculators and SpecForge write the production guide's 50K-100K responses. The samples have the shape and
seeding of the Hugging Face loop's (`draftsync.speculative.data.responses`), so a dataset build takes either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_args import ServerResources, VllmLaunch
from draftsync.speculative.data.responses import WRITERS, response_sample, response_seed

SERVED_NAME = "responses"
IN_FLIGHT = 256  # vLLM batches up to max_num_seqs: 256 on most GPUs (1024 on H100/H200), 128 on a CPU
REQUEST_TIMEOUT_S = 900.0  # one response, queueing in the engine included


def response_writer(setting: str) -> str:
    """The writer a profile's `response_writer` names: "auto" is vLLM when an engine is installed, else "hf"."""
    from draftsync.serving.vllm_engine import find_vllm_engine

    if setting == "auto":
        return "vllm" if find_vllm_engine(required=False) is not None else "hf"
    if setting not in WRITERS:
        raise DraftsyncError(f"unknown response writer {setting!r}", f"use auto or one of {', '.join(WRITERS)}")
    if setting == "vllm":
        try:
            find_vllm_engine()
        except DraftsyncError as error:
            raise DraftsyncError(
                f"the sync profile asks vLLM to write the responses, but {error.what}",
                f"{error.fix}; or set `response_writer: hf` in the sync profile",
            ) from error
    return setting


class VllmResponseWriter:
    """One plain vLLM server for the target (no drafter) answering token-id prompts, `in_flight` at a time.

    A context manager: entering starts the server (an engine that fails is named by its own error line and log),
    leaving stops it, error or not. Requests are non-streaming completions of the prompt's ids, as the evaluation
    backend sends them; vLLM's `token_ids` keep the EOS a response ended on (the engine appends the sampled token
    before its stop check, and only the text drops it), so both writers give the same samples.
    """

    def __init__(
        self,
        target_dir: str | Path,
        log_dir: str | Path,
        in_flight: int = IN_FLIGHT,
        engine: Any = None,
        resources: ServerResources | None = None,
    ) -> None:
        from draftsync.model_paths import confined_model_path

        if in_flight < 1:
            raise DraftsyncError(f"in_flight={in_flight}", "send at least one request at a time")
        self.target_dir = confined_model_path(target_dir, "target checkpoint")  # what vLLM serves is what was checked
        self.log_dir = Path(log_dir)
        self.in_flight, self.engine = in_flight, engine
        self.resources = resources or ServerResources()  # the GPUs the sync's plan gives the server
        self.server: Any = None
        self._client: Any = None
        self._pool: Any = None

    def __enter__(self) -> VllmResponseWriter:
        from concurrent.futures import ThreadPoolExecutor

        import httpx

        from draftsync.serving.process import free_port
        from draftsync.serving.vllm_engine import find_vllm_engine, start_vllm_server, wait_until_serving

        self.engine = self.engine or find_vllm_engine()
        port = free_port()
        launch = self.launch(port)
        log = self.log_dir / f"responses-{port}.log"
        environment = self.resources.environment(server="the response writer's server")
        self.server = start_vllm_server(self.engine, launch.argv, "127.0.0.1", port, log, environment)
        wait_until_serving(self.server, f"the responses of {self.target_dir}")  # stops the server if it fails
        self._client = httpx.Client(
            timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0),
            limits=httpx.Limits(max_connections=self.in_flight, max_keepalive_connections=self.in_flight),
        )
        self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="vllm-responses")
        return self

    def launch(self, port: int) -> VllmLaunch:
        """The rendered `vllm serve` launch: the target alone, with the plan's GPUs, memory and context length."""
        from draftsync.serving.vllm_args import render_vllm_command

        return render_vllm_command(
            self.target_dir,
            port=port,
            served_model_name=SERVED_NAME,
            tensor_parallel_size=self.resources.tensor_parallel_size,
            extra_args=self.resources.extra_args(),
        )

    def __exit__(self, *exc_info: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.server is not None:
            self.server.stop()  # requests still in flight fail at once, so the pool's threads end
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()
        self.server = self._client = self._pool = None

    def complete(self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int) -> list[int]:
        """The response ids to one prompt (EOS kept when it ended on one)."""
        import httpx

        self._check_started()
        body = {
            "model": SERVED_NAME,
            "prompt": prompt_ids,
            "max_tokens": int(max_tokens),
            "temperature": float(temperature),
            "top_k": 0,  # sampling from the whole distribution, as the Hugging Face loop samples
            "seed": int(seed),
            "return_token_ids": True,
        }
        try:
            response = self._client.post(f"{self.server.url}/v1/completions", json=body)
        except httpx.HTTPError as error:
            raise self._failed(f"{type(error).__name__}: {error}") from error
        if response.status_code != 200:
            raise self._failed(f"HTTP {response.status_code}: {response.text[:300]}")
        return list(response.json()["choices"][0]["token_ids"])

    def _check_started(self) -> None:
        if self._client is None:
            raise DraftsyncError("the vLLM response writer is not started", "use it as `with VllmResponseWriter(...)`")

    def _failed(self, what: str) -> DraftsyncError:
        from draftsync.serving.vllm_engine import engine_error_line

        state = "died" if not self.server.running() else "failed a request"
        cause = engine_error_line(self.server.log_path) or what
        return DraftsyncError(
            f"vLLM writing the responses of {self.target_dir} {state}: {cause} (log: {self.server.log_path})",
            "read the log for the cause and rerun (the dataset build resumes at its last shard), or set "
            "`response_writer: hf` in the sync profile",
        )

    def responses(
        self,
        tokenizer: Any,
        prompts: Iterable[str],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
        first: int = 0,
    ) -> Iterator[tuple[list[int], list[int]]]:
        """(prompt + response ids, loss mask) per prompt in order, as `generate_responses` gives them.

        The prompt at position `first + i` is sampled with `response_seed(seed, first + i)`. Requests are sent up
        to four times `in_flight` ahead of the one waited for, so the engine stays full while the caller works;
        prompts are tokenized one by one as they are sent, as the Hugging Face loop tokenizes them unpadded.
        """
        self._check_started()
        ahead: deque[tuple[list[int], Any]] = deque()
        queue = iter(enumerate(prompts, first))
        while True:
            while len(ahead) < 4 * self.in_flight:
                nxt = next(queue, None)
                if nxt is None:
                    break
                position, prompt = nxt
                ids = list(tokenizer(prompt)["input_ids"])
                seeded = response_seed(seed, position)
                ahead.append((ids, self._pool.submit(self.complete, ids, max_new_tokens, temperature, seeded)))
            if not ahead:
                return
            ids, answer = ahead.popleft()
            yield response_sample(ids, answer.result(), tokenizer.eos_token_id)
