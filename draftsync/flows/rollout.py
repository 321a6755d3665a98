"""Rollout: serve the target version the deployment's alias points at, with the drafter validated for it.

The procedure: start the candidate -> `/health` and `/v1/models` -> smoke requests -> a short benchmark
against the current instance -> switch (the router moves traffic, the old server drains and stops; the
drafter aliases flip, `production` -> new, `previous` -> old; the serving pair is recorded) -> canary watch
(acceptance >= the threshold, TPOT not worse than the instance it replaced) -> else automatic rollback:
aliases restored exactly and the previous pair served again.

The pair rule: a target version without a validated drafter trained for it is served with speculation
off (state `fallback`), an alert goes out, a sync is requested (and run, when a sync profile is given),
and the pair is rolled out when its drafter arrives. A drafter is never served with another target version.
"""

from __future__ import annotations

import json
import math

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from draftsync.errors import DraftsyncError
from draftsync.monitors.tables import ServedPair
from draftsync.profiles import SyncProfile
from draftsync.registry.model_registry import PRODUCTION, drafter_model_name, rolled_back
from draftsync.registry.tags import DrafterVersion
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.servers import PairSwitch
from draftsync.speculative.methods import DEFAULT_METHOD
from draftsync.tasks import context, events
from draftsync.tasks.alerts import send_alert
from draftsync.tasks.registration import promote_drafter, restore_drafter_aliases
from draftsync.tasks.serving import (
    BENCHMARK_TOKENS,
    configured_deployments,
    deployment_prompts,
    render_launch,
    serve_pair,
)
from draftsync.tasks.sync_requests import request_sync

TPOT_TOLERANCE = 0.25  # the canary's TPOT may be this much worse than the replaced instance's (CPU noise)


def choose_pair(deployment: ServingDeployment, drafter_version: int | None, speculation: bool) -> ServedPair:
    """The target version the alias points at and the drafter to serve with it (None: speculation off)."""
    registry = context.registry()
    target_version = registry.alias_version(deployment.target_name, deployment.target_alias)
    if target_version is None:
        raise DraftsyncError(
            f"target {deployment.target_name} has no alias {deployment.target_alias!r}",
            f"register a version and set the alias (deployment {deployment.name} follows it)",
        )
    drafter_name = drafter_model_name(deployment.target_name)
    if drafter_version is not None:
        drafter = DrafterVersion.from_tags(
            drafter_name, drafter_version, registry.version_tags(drafter_name, drafter_version)
        )
        trained_for = drafter.trained_for_version()
        if trained_for != target_version:
            raise DraftsyncError(
                f"drafter {drafter_name} v{drafter_version} was trained for {deployment.target_name} v{trained_for}, "
                f"but deployment {deployment.name} serves v{target_version} (alias {deployment.target_alias})",
                "never serve a mismatched pair: sync a drafter for the served version, or pick one trained for it",
            )
        if not drafter.validation_passed:
            raise DraftsyncError(
                f"drafter {drafter_name} v{drafter_version} has not passed validation",
                f"run `draftsync validate {deployment.target_name} {drafter_version}` first",
            )
    elif speculation:
        drafter_version = _production_drafter_for(deployment.target_name, target_version)
    if drafter_version is None:
        return ServedPair(deployment.target_name, target_version, None, 0, method=DEFAULT_METHOD)
    drafter = DrafterVersion.from_tags(
        drafter_name, drafter_version, registry.version_tags(drafter_name, drafter_version)
    )
    return ServedPair(
        deployment.target_name,
        target_version,
        drafter_version,
        drafter.served_gamma(),
        drafter_name=drafter_name,
        method=drafter.method,
        schedule=drafter.gamma_schedule(),
        draft_sampling=served_draft_sampling(deployment, drafter)[0],
    )


def served_draft_sampling(deployment: ServingDeployment, drafter: DrafterVersion | None) -> tuple[str | None, str]:
    """(vLLM's draft_sample_method to serve with, why): the deployment's when it sets one (its explicit choice
    wins), else the one validation measured better at the deployment's temperature, else vLLM's default (None)."""
    measured = drafter.draft_sampling if drafter is not None else None
    if deployment.draft_sampling is not None:
        differs = (
            f"; validation measured {measured} better" if measured and measured != deployment.draft_sampling else ""
        )
        return deployment.draft_sampling, f"{deployment.draft_sampling}: the deployment sets it{differs}"
    if measured is not None:
        return measured, f"{measured}: validation measured it better at the deployment's temperature"
    return None, "vLLM's default (greedy): validation chose none (it ran at T=0, or before it measured both)"


def _production_drafter_for(target_name: str, target_version: int) -> int | None:
    """The drafter `production` points at when it was trained for this target version and passed validation
    (the team's choice; a rollback moves it), else the newest validated drafter for the version, else None."""
    registry = context.registry()
    name = drafter_model_name(target_name)
    production = registry.alias_version(name, PRODUCTION)
    if production is not None:
        drafter = DrafterVersion.from_tags(name, production, registry.version_tags(name, production))
        if drafter.trained_for == int(target_version) and drafter.validation_passed:
            return production
    return registry.drafter_for_target_version(target_name, target_version)


def planned_launch(
    deployment: ServingDeployment,
    drafter_version: int | None = None,
    speculation: bool = True,
    reason: str = "",
    port: int | None = None,
) -> tuple[ServedPair, dict, dict]:
    """The pair, its rendered launch and the summary a rollout reports, as `rollout --dry-run` prints them; `port`:
    render the launch on it instead of the deployment's."""
    pair = choose_pair(deployment, drafter_version, speculation)
    launch = render_launch(deployment, pair, port)
    return pair, launch, _summary(deployment, pair, launch, reason)


def _summary(deployment: ServingDeployment, pair: ServedPair, launch: dict, reason: str) -> dict:
    import shlex

    drafter = None
    if pair.drafter_version is not None and pair.drafter_name is not None:
        tags = context.registry().version_tags(pair.drafter_name, pair.drafter_version)
        drafter = DrafterVersion.from_tags(pair.drafter_name, pair.drafter_version, tags)
    return {
        "deployment": deployment.name,
        "target_version": pair.target_version,
        "drafter_version": pair.drafter_version,
        "gamma": pair.gamma,
        # why the drafts are sampled as they are (None: speculation off)
        "draft_sampling": served_draft_sampling(deployment, drafter)[1] if drafter is not None else None,
        "argv": launch["argv"],
        "command": shlex.join(launch["argv"]),
        "speculative_config": launch["speculative_config"],
        "reason": reason,
    }


def _canary(
    deployment: ServingDeployment, endpoint: str, requests: int, threshold: float, replaced_ms_per_token: float | None
) -> dict:
    """Send canary traffic through the deployment's address; judge acceptance from /metrics and TPOT."""
    from draftsync.monitors.metrics import scrape_counters
    from draftsync.serving.completions import ms_per_token

    before = scrape_counters(f"{endpoint}/metrics", timeout=30)
    ms = ms_per_token(
        endpoint,
        deployment.name,
        deployment_prompts(deployment, requests, seed=77),
        BENCHMARK_TOKENS,
        deployment.temperature,
    )
    after = scrape_counters(f"{endpoint}/metrics", timeout=30)
    draft_tokens = after.draft_tokens - before.draft_tokens
    acceptance = (after.accepted - before.accepted) / draft_tokens if draft_tokens > 0 else math.nan
    tpot_ok = replaced_ms_per_token is None or ms is None or ms <= replaced_ms_per_token * (1 + TPOT_TOLERANCE)
    passed = not math.isnan(acceptance) and acceptance >= threshold and tpot_ok
    return {
        "requests": requests,
        "acceptance": None if math.isnan(acceptance) else round(acceptance, 4),
        "threshold": threshold,
        "ms_per_token": ms,
        "replaced_ms_per_token": replaced_ms_per_token,
        "tpot_ok": tpot_ok,
        "passed": passed,
    }


@flow(name="rollout", log_prints=True)
def rollout(
    deployment: ServingDeployment,
    speculation: bool = True,
    reason: str = "",
    drafter_version: int | None = None,
    canary_requests: int = 0,
    canary_threshold: float | None = None,
    sync_profile: str | SyncProfile | None = None,
    state: str | None = None,
) -> dict:
    """Serve the deployment's pair: launch, check, switch, canary; roll back by itself on a bad canary.

    `canary_requests` > 0 sends that many canary requests after the switch (production traffic is the
    canary otherwise); `canary_threshold` defaults to the live mismatch threshold. `state` overrides the
    recorded state (the acceptance guard records `fallback` for a speculation-off relaunch).
    Long: the rollout's steps in order, each undone by the step that failed."""
    logger = get_run_logger()
    registry, settings = context.registry(), context.settings()
    pair = choose_pair(deployment, drafter_version, speculation)
    missing_drafter = speculation and pair.drafter_version is None
    new_state = state or ("serving" if pair.drafter_version is not None else "fallback")
    steps: list[str] = []
    if deployment.launch == "external":
        launch = render_launch(deployment, pair)
        path = settings.root / "serving" / "external" / f"{deployment.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(launch, indent=2))
        assert deployment.endpoint is not None, "a launch: external deployment is validated to have one"
        endpoint, replaced, canary = deployment.endpoint, None, None
        steps.append(f"vLLM arguments written to {path} for the orchestrator; watching {endpoint}")
    else:
        switched = _serve(deployment, pair)
        launch = switched.vllm
        steps.extend(switched.steps)
        endpoint, replaced, canary = switched.endpoint, switched.replaced, switched.replaced_ms_per_token
    summary = _summary(deployment, pair, launch, reason)
    snapshot = registry.alias_snapshot(deployment.target_name)
    if pair.drafter_version is not None and snapshot[PRODUCTION] != pair.drafter_version:
        promote_drafter(deployment.target_name, pair.drafter_version)
        steps.append(f"aliases: production -> v{pair.drafter_version}, previous -> v{snapshot[PRODUCTION]}")
    _record_pair(deployment, pair, endpoint, new_state)
    steps.append(
        f"serving pair recorded: target v{pair.target_version}, drafter "
        f"{f'v{pair.drafter_version}' if pair.drafter_version else 'none'} ({new_state})"
    )
    result = {
        **summary,
        "state": new_state,
        "endpoint": endpoint,
        "replaced": replaced,
        "canary": None,
        "rolled_back": False,
    }
    if canary is not None and pair.drafter_version is not None and canary_requests > 0:
        threshold = settings.mismatch_threshold if canary_threshold is None else canary_threshold
        verdict = _canary(deployment, endpoint, canary_requests, threshold, canary)
        result["canary"] = verdict
        steps.append(
            f"canary: acceptance {verdict['acceptance']} (threshold {threshold}), "
            f"{verdict['ms_per_token']} ms/token vs {verdict['replaced_ms_per_token']}: "
            f"{'passed' if verdict['passed'] else 'FAILED'}"
        )
        if not verdict["passed"]:
            restore_drafter_aliases(deployment.target_name, snapshot)
            steps.append(f"rolled back: aliases restored to {snapshot}")
            back = rollout_previous(deployment, snapshot, reason=f"canary failed for drafter v{pair.drafter_version}")
            steps.extend(back["steps"])
            send_alert(
                deployment.name,
                "canary-rollback",
                f"{deployment.name}: drafter v{pair.drafter_version} rolled back by its canary",
                "\n".join(steps),
                value=verdict["acceptance"] or 0.0,
            )
            result.update(
                rolled_back=True, state=back["state"], drafter_version=back["drafter_version"], gamma=back["gamma"]
            )
    if missing_drafter:
        _missing_drafter(deployment, pair, steps, sync_profile)
    result["steps"] = steps
    create_markdown_artifact(
        key=f"rollout-{deployment.name}".lower().replace("_", "-").replace(".", "-"),
        markdown=(
            f"# {deployment.name}: {result['state']}\n\n{reason}\n\n"
            + "\n".join(f"1. {s}" for s in steps)
            + f"\n\nOn a GPU worker the pair runs as:\n\n```\n{' '.join(launch['argv'])}\n```\n"
        ),
        description="rollout",
    )
    logger.info(
        "%s now %s: target v%d, drafter %s",
        deployment.name,
        result["state"],
        pair.target_version,
        result["drafter_version"],
    )
    return result


def _serve(deployment: ServingDeployment, pair: ServedPair) -> PairSwitch:
    """Serve the pair at the deployment; a candidate that does not come up healthy is an alert, and the deployment
    keeps what it served."""
    try:
        return serve_pair(deployment, pair)
    except DraftsyncError as error:
        current = context.store().pairs.get(deployment.name)
        kept = f"it keeps serving {current.endpoint}" if current and current.endpoint else "nothing was serving it"
        send_alert(
            deployment.name,
            "launch-failed",
            f"{deployment.name}: the candidate server did not start or failed its checks; {kept}",
            f"{error.what}\n\nfix: {error.fix}\n\nThe rollout stopped before any traffic or alias moved: "
            f"{deployment.name} {kept}.",
        )
        raise


def _record_pair(deployment: ServingDeployment, pair: ServedPair, endpoint: str, state: str) -> None:
    store = context.store()
    store.acceptance.forget_baseline(deployment.name)  # the new instance's counters start from zero
    store.pairs.record(deployment.name, pair, endpoint=endpoint, state=state)


def rollout_previous(deployment: ServingDeployment, snapshot: dict, reason: str) -> dict:
    """Serve the pair the aliases say is production (after a restore or a rollback), or plain decoding."""
    steps: list[str] = []
    registry = context.registry()
    target_version = registry.alias_version(deployment.target_name, deployment.target_alias)
    previous = snapshot.get(PRODUCTION)
    trained_for = None
    if previous is not None:
        name = drafter_model_name(deployment.target_name)
        drafter = DrafterVersion.from_tags(name, previous, registry.version_tags(name, previous))
        trained_for = drafter.trained_for_version()
    if previous is not None and trained_for == target_version:
        pair = choose_pair(deployment, previous, True)
    else:
        pair = choose_pair(deployment, None, False)
        steps.append(f"no validated drafter for target v{target_version} to return to: speculation off")
    switched = _serve(deployment, pair)
    steps.extend(switched.steps)
    endpoint = switched.endpoint
    state = "serving" if pair.drafter_version is not None else "fallback"
    _record_pair(deployment, pair, endpoint, state)
    steps.append(f"{reason}: serving drafter {pair.drafter_version} again ({state})")
    return {"state": state, "drafter_version": pair.drafter_version, "gamma": pair.gamma, "steps": steps}


def _missing_drafter(
    deployment: ServingDeployment, pair: ServedPair, steps: list[str], sync_profile: str | SyncProfile | None
) -> None:
    """The pair rule's other half: alert, request a sync, and (with a profile) run it and roll the pair out."""
    target = f"{deployment.target_name} v{pair.target_version}"
    send_alert(
        deployment.name,
        "fallback-no-drafter",
        f"{deployment.name} serves {target} with speculation off: no validated drafter",
        f"The alias {deployment.target_alias!r} of {deployment.target_name} points at v{pair.target_version}, "
        f"which has no validated drafter. {deployment.name} serves it with speculation off (state fallback) "
        f"until a drafter for it passes validation; a sync was requested.",
    )
    asked = request_sync(
        deployment.target_name,
        pair.target_version,
        source="rollout",
        reason=f"{deployment.name} serves {target} without a drafter",
    )
    steps.append(
        f"alert sent; sync {'requested' if asked.requested else 'already requested'} "
        f"(event {events.SYNC_REQUESTED} for {target})"
    )
    if sync_profile is None:
        return
    from draftsync.flows.sync import sync

    synced = sync(deployment.target_name, pair.target_version, sync_profile, reason=f"{target} has no drafter")
    steps.append(f"sync ran: drafter v{synced['drafter_version']} {'passed' if synced['passed'] else 'FAILED'}")
    if synced["passed"]:
        again = rollout(deployment, reason=f"drafter v{synced['drafter_version']} arrived for {target}")
        steps.append(f"pair rolled out: {again['state']} with drafter v{again['drafter_version']}")


@flow(name="rollout-target", log_prints=True)
def rollout_target(target_name: str, alias: str | None = None, reason: str = "") -> dict:
    """The `rollout` deployment: bring every deployment of the deployments file that serves `target_name`
    (following `alias`, when given) to the pair the registry says; one already serving it is left alone."""
    context.require_settings("rollout", "registry", "store", "serving")
    logger = get_run_logger()
    store = context.store()
    results = []
    for spec in configured_deployments().values():
        if spec.target_name != target_name or (alias and spec.target_alias != alias):
            continue
        pair = choose_pair(spec, None, True)
        current = store.pairs.get(spec.name)
        if (
            current is not None
            and current.state == "serving"
            and current.target_version == pair.target_version
            and current.drafter_version == pair.drafter_version
        ):
            results.append({"deployment": spec.name, "state": "unchanged", "drafter_version": pair.drafter_version})
            continue
        results.append(rollout(spec, reason=reason or f"{target_name} changed"))
    if not results:
        logger.info(
            "no deployment in %s serves %s%s",
            context.settings().deployments_path,
            target_name,
            f" through alias {alias!r}" if alias else "",
        )
    return {"target_name": target_name, "alias": alias, "rollouts": results}


@flow(name="rollback", log_prints=True)
def rollback(deployment: ServingDeployment, reason: str = "rolled back by hand") -> dict:
    """`production` back to `previous` (and `previous` to the version rolled back from); serve that pair."""
    registry = context.registry()
    before = registry.alias_snapshot(deployment.target_name)
    wanted = rolled_back(deployment.target_name, before)  # a state to write: the retried write lands it once
    restore_drafter_aliases(deployment.target_name, wanted)
    back = rollout_previous(deployment, {PRODUCTION: wanted[PRODUCTION]}, reason)
    return {
        "deployment": deployment.name,
        "aliases_before": before,
        "aliases_after": registry.alias_snapshot(deployment.target_name),
        **back,
    }
