"""Serving a pair as a Prefect task: through the serving service's admin API when one is configured, else with
servers this process starts; and the deployments a work dir declares (the deployments file) with their traffic
capture.

The servers themselves are launched, checked, switched, adopted and stopped by `serving/servers.py` (`ServerBook`,
over `<workdir>/serving`); this module gives it the work dir, the pair's checkpoints and the run's logger.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment, load_deployments
from draftsync.serving.servers import PairChecks, PairLaunch, PairSwitch, ServerBook
from draftsync.serving.service_client import ServiceRequest, ServingServiceClient
from draftsync.tasks import context

if TYPE_CHECKING:
    from draftsync.monitors.tables import ServedPair
    from draftsync.serving.traffic_capture import CaptureConfig, CapturedPrompt


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


def captured_prompts(target_name: str) -> tuple[list[CapturedPrompt], str]:
    """The requests the deployments serving `target_name` captured (oldest first), each as a validation replays it,
    and where they came from in words: which deployments, how many, or why there are none (capture off, nothing
    captured yet)."""
    from draftsync.serving.traffic_capture import CapturedPrompt

    serving = [spec for spec in configured_deployments().values() if spec.target_name == target_name]
    if not serving:
        return [], f"no deployment in the deployments file serves {target_name}"
    prompts: list[CapturedPrompt] = []
    said = []
    for spec in serving:
        config = capture_config(spec)
        if config is None:
            said.append(f"{spec.name}: capture is off (give it a capture section)")
            continue
        found = [
            CapturedPrompt(text, row.get("max_tokens"))
            for row in captured_requests(config)
            if (text := _prompt_text(row["prompt"]))
        ]
        prompts += found
        said.append(f"{spec.name}: {len(found)} captured prompts")
    return prompts, "; ".join(said)


def captured_requests(capture: CaptureConfig, after_id: int = 0) -> list[dict]:
    """The requests a deployment's router captured after row `after_id`, oldest first: from the serving service
    when one is configured (the capture file lies with its routers), else from this work dir's file."""
    from draftsync.serving.traffic_capture import captured_rows

    if context.settings().serving_url is None:
        return captured_rows(capture.path, capture.deployment, after_id)
    return serving_service().captured(capture.deployment, after_id)


def captured_here(deployment: ServingDeployment, after_id: int = 0) -> list[dict]:
    """The requests a router of this work dir captured for the deployment after row `after_id`."""
    from draftsync.serving.traffic_capture import captured_rows

    config = capture_config(deployment)
    return [] if config is None else captured_rows(config.path, deployment.name, after_id)


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


SMOKE_REQUESTS = 3
BENCHMARK_REQUESTS = 4
BENCHMARK_TOKENS = 24


def deployment_prompts(deployment: ServingDeployment, count: int, seed: int) -> list[str]:
    """Prompts in the deployment's declared task mix: its smoke, benchmark and canary requests."""
    from draftsync.speculative.data.corpora import prompts_for_mix

    return prompts_for_mix(deployment.task_mix, count, seed=seed)


def render_launch(deployment: ServingDeployment, pair: ServedPair, port: int | None = None) -> dict:
    """The vLLM launch for the pair, as `--dry-run` prints it and as `launch: external` hands it over; for
    `launch: vllm` it is the command line of the engine installed here (vllm_engine.py), when there is one. The
    target and drafter are downloaded into this work dir."""
    registry = context.registry()
    target_dir = registry.download(deployment.target_name, pair.target_version)
    drafter_dir = (
        registry.download(pair.drafter_name, pair.drafter_version) if pair.drafter_version is not None else None
    )
    if drafter_dir is not None:
        from draftsync.speculative.methods.registry import check_drafter_fits_target

        check_drafter_fits_target(drafter_dir, target_dir)  # before any server starts on a pair that cannot serve
    engine = None
    if deployment.launch == "vllm":
        from draftsync.serving.vllm_engine import find_vllm_engine

        engine = find_vllm_engine(required=False)  # none here: the `vllm serve` a GPU worker's image runs
    launch = deployment.vllm_launch(
        target_dir,
        drafter_dir,
        pair.method,
        pair.gamma,
        schedule=pair.schedule,
        port=port,
        engine=engine,
        draft_sampling=pair.draft_sampling,
    )
    return {
        "target_dir": str(target_dir),
        "drafter_dir": str(drafter_dir) if drafter_dir else None,
        **launch.as_record(),
    }


def serve_here(deployment: ServingDeployment, pair: ServedPair) -> PairSwitch:
    """Serve the pair from this process's work dir: candidate, checks, benchmark, switch (the servers are its
    children, or the serving service's when it runs this)."""
    launch = render_launch(deployment, pair)
    checks = PairChecks(
        smoke_prompts=deployment_prompts(deployment, SMOKE_REQUESTS, seed=5),
        benchmark_prompts=deployment_prompts(deployment, BENCHMARK_REQUESTS, seed=6),
        benchmark_tokens=BENCHMARK_TOKENS,
        temperature=deployment.temperature,
    )
    started = PairLaunch(
        launch["target_dir"], launch["drafter_dir"], pair.gamma, pair.method, pair.schedule, pair.draft_sampling
    )
    return _book().serve(deployment, started, checks, capture_config(deployment))


def serving_service() -> ServingServiceClient:
    """The serving service's admin API (DRAFTSYNC_SERVING_URL, DRAFTSYNC_SERVING_TOKEN)."""
    settings = context.settings()
    assert settings.serving_url is not None, "asked only where a serving service is configured"
    if settings.serving_token is None:
        raise DraftsyncError(
            f"DRAFTSYNC_SERVING_URL is {settings.serving_url} but DRAFTSYNC_SERVING_TOKEN is not set",
            "give this flow run the serving service's admin token (DRAFTSYNC_SERVING_TOKEN, the same as the service's)",
        )
    return ServingServiceClient(settings.serving_url, settings.serving_token.get_secret_value())


@task(name="serve-pair", cache_policy=NONE)
def serve_pair(deployment: ServingDeployment, pair: ServedPair) -> PairSwitch:
    """Serve the pair at the deployment's stable address: through the serving service when one is configured (it
    owns the servers, so they outlive this run), else with servers this process starts."""
    if context.settings().serving_url is None:
        return serve_here(deployment, pair)
    return serving_service().serve(
        deployment.name,
        ServiceRequest(
            pair.target_version, pair.drafter_version, pair.gamma, pair.method, pair.schedule, pair.draft_sampling
        ),
    )


def stop_all() -> None:
    """Stop every deployment this work dir runs, and every server this process started (the end of the demo, the
    end of a test), whether this process or an earlier one started them.

    The monitor's store then says each pair is "stopped", so scrapes skip it instead of failing on a dead endpoint."""
    for deployment in _book().stop_all():
        try:
            context.store().pairs.set_state(deployment, "stopped")
        except DraftsyncError as error:  # the servers are down either way; a store outage must not keep them up
            context.logger().warning("%s stopped, but the monitor store could not record it: %s", deployment, error)
