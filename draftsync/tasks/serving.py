"""Serving steps of a rollout as Prefect tasks: start a candidate, check it, switch the deployment's router to it,
stop the old one; and the deployments a work dir declares (the deployments file) with their traffic capture.

The servers themselves are launched, recorded, adopted and stopped by `serving/servers.py` (`ServerBook`, over
`<workdir>/serving`); these tasks give it the work dir, the run's logger and the monitor store's side of a stop.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import httpx
from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment, load_deployments
from draftsync.serving.servers import LaunchedServer, PairLaunch, ServerBook, Switched
from draftsync.tasks import context
from draftsync.tasks.traffic import complete

if TYPE_CHECKING:
    from draftsync.serving.traffic_capture import CaptureConfig


def configured_deployments(
    given: list[ServingDeployment] | None = None, problems: list[str] | None = None
) -> dict[str, ServingDeployment]:
    """The specs to act on: those given, else the deployments file's (the work dir's default file may be absent).

    With `problems`, a broken file is noted there instead of raised (the weekly e-mail is how the team hears of it)."""
    if given is not None:
        return {d.name: d for d in given}
    settings = context.settings()
    path = settings.deployments_path
    if settings.deployments_file is None and not os.path.lexists(path):
        return {}  # the work dir's default file is optional; a named file, a dangling link or a loop is not
    try:
        return {d.name: d for d in load_deployments(path)}
    except DraftsyncError as error:
        if problems is None:
            raise
        problems.append(f"{error.what} (fix: {error.fix}); no deployment was relaunched")
        return {}


def declared_deployment_problems() -> list[str]:
    """Why the declared deployments cannot all be served: a deployments file that cannot be read, or a deployment of
    a target MLflow does not hold. Read-only commands show these instead of skipping the deployment without a word."""
    try:
        specs = configured_deployments()
    except DraftsyncError as error:
        return [f"{error.what} (fix: {error.fix})"]
    problems: list[str] = []
    registry = context.registry()
    for spec in specs.values():
        if not registry.has_model(spec.target_name):
            problems.append(
                f"deployment {spec.name} serves target {spec.target_name!r}, which MLflow does not hold "
                f"(fix: register it with `draftsync targets register`, or correct its target_name in "
                f"{context.settings().deployments_path})"
            )
    return problems


def capture_config(deployment: ServingDeployment) -> CaptureConfig | None:
    """Where and how a deployment's router captures traffic (None: capture is off): a file per deployment under the
    work dir's traffic folder."""
    from draftsync.serving.traffic_capture import CaptureConfig

    settings = deployment.capture
    if settings is None:
        return None
    return CaptureConfig(
        path=context.settings().root / "traffic" / f"{deployment.name}.db",
        deployment=deployment.name,
        rate=settings.rate,
        max_rows=settings.max_rows,
        retention_days=settings.retention_days,
        redact=settings.redact,
        keep_responses=settings.keep_responses,
    )


def captured_prompts(target_name: str) -> tuple[list[str], str]:
    """The prompts the deployments serving `target_name` captured (oldest first), and where they came from in words:
    which deployments, how many, or why there are none (capture off, nothing captured yet)."""
    from draftsync.serving.traffic_capture import captured_rows

    serving = [spec for spec in configured_deployments().values() if spec.target_name == target_name]
    if not serving:
        return [], f"no deployment in the deployments file serves {target_name}"
    prompts: list[str] = []
    said = []
    for spec in serving:
        config = capture_config(spec)
        if config is None:
            said.append(f"{spec.name}: capture is off (give it a capture section)")
            continue
        rows = captured_rows(config.path, spec.name)
        texts = [text for row in rows if (text := _prompt_text(row["prompt"]))]
        prompts += texts
        said.append(f"{spec.name}: {len(texts)} captured prompts")
    return prompts, "; ".join(said)


def _prompt_text(prompt: object) -> str | None:
    """A completion's prompt, or a chat's last user message: what the target is asked to answer again."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
    return None


def _book() -> ServerBook:
    """The servers this work dir runs (`<workdir>/serving`), logging to the run's log."""
    return ServerBook(context.settings().root / "serving", context.logger())


def serving_record(deployment: str) -> dict | None:
    """What the deployment runs now: its router, the server behind it (pid, endpoint, argv), the vLLM launch."""
    return _book().record(deployment)


@task(name="launch-server", cache_policy=NONE)
def launch_server(deployment: ServingDeployment, pair: PairLaunch) -> LaunchedServer:
    """Start a server for the pair on a free port and wait until it is healthy; the vLLM launch is recorded
    whatever the launch mode (it is what a GPU worker runs). Its log stays under <workdir>/serving; a vLLM that
    does not come up is named by its own error line and that log."""
    return _book().launch(deployment, pair)


@task(name="smoke-requests", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def smoke_requests(endpoint: str, model: str, prompts: list[str], max_tokens: int = 8) -> dict:
    """Real completions: the candidate must answer each before any traffic moves to it."""
    with httpx.Client(base_url=endpoint, timeout=120) as client:
        tokens = [
            complete(client, model, p, max_tokens, temperature=0.0)["usage"]["completion_tokens"] for p in prompts
        ]
    return {"requests": len(prompts), "completion_tokens": sum(tokens)}


def ms_per_token(endpoint: str, model: str, prompts: list[str], max_tokens: int, temperature: float) -> float | None:
    """Wall time per output token over a few sequential requests: what a client sees, prefill included."""
    with httpx.Client(base_url=endpoint, timeout=300) as client:
        started, tokens = time.perf_counter(), 0
        for i, prompt in enumerate(prompts):
            tokens += complete(client, model, prompt, max_tokens, temperature, seed=i)["usage"]["completion_tokens"]
        return 1000.0 * (time.perf_counter() - started) / tokens if tokens else None


@task(name="benchmark-against-current", cache_policy=NONE)
def benchmark_against_current(
    candidate: str, current: str | None, model: str, prompts: list[str], max_tokens: int, temperature: float
) -> dict:
    """The same short load on the candidate and on the instance it would replace: ms per output token each."""
    result = {
        "candidate_ms_per_token": ms_per_token(candidate, model, prompts, max_tokens, temperature),
        "current_ms_per_token": None,
    }
    if current is not None:
        try:
            result["current_ms_per_token"] = ms_per_token(current, model, prompts, max_tokens, temperature)
        except (httpx.HTTPError, DraftsyncError) as error:  # the old instance may already be gone
            context.logger().warning("the current instance %s did not answer the benchmark: %s", current, error)
    return result


@task(name="switch-traffic", cache_policy=NONE)
def switch_traffic(deployment: ServingDeployment, launched: LaunchedServer) -> Switched:
    """Point the deployment's router at the launched server, let the old server drain, then stop it.

    Returns the stable endpoint and the server it replaced (None on the first rollout)."""
    switched = _book().switch(deployment, launched, capture_config(deployment))
    context.logger().info(
        "%s: router %s now forwards to %s (replaced %s)",
        deployment.name,
        switched.endpoint,
        launched.endpoint,
        switched.replaced or "nothing",
    )
    return switched


def stop_candidate(launched: LaunchedServer) -> None:
    """A candidate that failed its checks never takes traffic: stop it."""
    _book().stop_candidate(launched)


def stop_all() -> None:
    """Stop every deployment this work dir runs, and every server this process started (the end of the demo, the
    end of a test), whether this process or an earlier one started them.

    The monitor's store then says each pair is "stopped", so scrapes skip it instead of failing on a dead endpoint."""
    for deployment in _book().stop_all():
        try:
            context.store().pairs.set_state(deployment, "stopped")
        except DraftsyncError as error:  # the servers are down either way; a store outage must not keep them up
            context.logger().warning("%s stopped, but the monitor store could not record it: %s", deployment, error)
