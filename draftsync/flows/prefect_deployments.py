"""The five Prefect deployments of draftsync in production, as `draftsync serve` creates and runs them.

`prefect.yaml` declares the same deployments for work pools (GPU work on `draftsync-gpu`); a test keeps
the two in step. Syncs start from events, never from a scheduler of ours: the MLflow webhook receiver,
the registry poll, the weekly review and rollouts ask the sync ledger, and the one that wins emits the
event these triggers match. One sync runs at a time (the deployment's concurrency limit; later events
wait in the queue), so a GPU is never shared by two trainings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from draftsync.settings import GPU_COUNTS, Settings
from draftsync.tasks import events

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.deployments.runner import RunnerDeployment

# Each deployment, in the order prefect.yaml and build_deployments list them, and the work pool it runs on.
WORK_POOLS = {
    "registry-watch": "draftsync-cpu",
    "drafter-sync": "draftsync-gpu",
    "acceptance-scrape": "draftsync-cpu",
    "weekly-acceptance-report": "draftsync-cpu",
    "rollout": "draftsync-cpu",  # it only steers the serving service (DRAFTSYNC_SERVING_URL)
}
TARGET_PARAMETERS = {
    "target_name": "{{ event.resource['draftsync.target.name'] }}",
    # labels are strings; the server checks parameters against the flow's schema (an int)
    "target_version": "{{ event.resource['draftsync.target.version'] | int }}",
}


@dataclass(frozen=True)
class Schedules:
    """What `draftsync serve` is told: how often to poll and scrape, when the weekly report goes out."""

    watch_interval: timedelta = timedelta(minutes=5)
    scrape_interval: timedelta = timedelta(minutes=1)
    report_cron: str = "0 9 * * 1"  # Monday 09:00
    timezone: str = "UTC"
    profile: str = "demo"
    sync_concurrency: int = 1
    tags: tuple[str, ...] = field(default=("draftsync",))


def sync_triggers() -> list[dict[str, Any]]:
    """drafter-sync runs for each sync event (a new version, a request, a stale drafter): one trigger per GPU count
    an event's `draftsync.gpus` label asks for, each giving its run that many GPUs (a trigger's job variables are
    static: Prefect renders only its parameters from the event)."""
    return [
        {
            "name": f"sync-events-{count}-gpu",
            "expect": set(events.SYNC_EVENTS),
            "match": {events.GPUS_LABEL: str(count)},
            "parameters": {**TARGET_PARAMETERS, "reason": "{{ event.event }}: {{ event.payload.get('reason', '') }}"},
            "job_variables": gpu_job_variables(count),
        }
        for count in GPU_COUNTS
    ]


def gpu_job_variables(count: int) -> dict[str, Any]:
    """What gives a run on the GPU pool `count` GPUs: a kubernetes pool's nvidia.com/gpu limit, a docker pool's
    device request with the /dev/shm NCCL needs (a run's variables replace the deployment's key by key); a process
    pool's runs share their worker's GPUs."""
    return {
        "gpu_limit": count,
        "container_create_kwargs": {
            "device_requests": [{"driver": "nvidia", "count": count, "capabilities": [["gpu"]]}],
            "shm_size": "16g",
        },
    }


def rollout_trigger() -> dict[str, Any]:
    """rollout runs when a drafter passed validation and when a target alias moved."""
    return {
        "expect": set(events.ROLLOUT_EVENTS),
        "parameters": {
            "target_name": TARGET_PARAMETERS["target_name"],
            "alias": "{{ event.resource.get('draftsync.alias', '') }}",
            "reason": "{{ event.event }} for {{ event.resource['prefect.resource.name'] }}",
        },
    }


def build_deployments(schedules: Schedules | None = None) -> list[RunnerDeployment]:
    """The deployments, ready for `prefect.serve`; each names its work pool in a tag for the UI's filters."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.events import DeploymentEventTrigger

    from draftsync.flows.rollout import rollout_target
    from draftsync.flows.scrape import scrape
    from draftsync.flows.sync import sync
    from draftsync.flows.watch import watch
    from draftsync.flows.weekly_report import weekly_report

    chosen = schedules or Schedules()

    def tags(name: str) -> list[str]:
        return [*chosen.tags, WORK_POOLS[name]]

    deployments = [
        watch.to_deployment(
            "registry-watch",
            interval=chosen.watch_interval,
            tags=tags("registry-watch"),
            parameters={"dispatch": "event", "profile": chosen.profile},
            description="Polls the registry for target versions the webhooks missed; re-sends lost sync requests.",
        ),
        sync.to_deployment(
            "drafter-sync",
            tags=tags("drafter-sync"),
            parameters={"profile": chosen.profile},
            triggers=[DeploymentEventTrigger(**trigger) for trigger in sync_triggers()],
            concurrency_limit=ConcurrencyLimitConfig(
                limit=chosen.sync_concurrency, collision_strategy=ConcurrencyLimitStrategy.ENQUEUE
            ),
            description="Dataset, training, validation, registration of a drafter for one target version.",
        ),
        scrape.to_deployment(
            "acceptance-scrape",
            interval=chosen.scrape_interval,
            tags=tags("acceptance-scrape"),
            description="Scrapes acceptance from every serving deployment; falls back when it collapses.",
        ),
        weekly_report.to_deployment(
            "weekly-acceptance-report",
            tags=tags("weekly-acceptance-report"),
            parameters={"send": True},
            # typed as prefect.schedules.Schedule; Prefect builds the deployment's schedules from a CronSchedule too
            schedule=CronSchedule(cron=chosen.report_cron, timezone=chosen.timezone),  # type: ignore[arg-type]
            description="The weekly acceptance review and e-mail; stale drafters get a retrain.",
        ),
        rollout_target.to_deployment(
            "rollout",
            tags=tags("rollout"),
            triggers=[DeploymentEventTrigger(name="rollout-events", **rollout_trigger())],
            description="Serves each deployment's target alias with its validated drafter (vLLM).",
        ),
    ]
    # to_deployment is async_dispatch-wrapped, typed as a deployment or a coroutine: from sync code, the deployment
    return cast("list[RunnerDeployment]", deployments)


def register_paused_deployments(schedules: Schedules | None = None) -> list[UUID]:
    """Create or update the five deployments in the Prefect API this process uses, paused, with their triggers
    disabled, and return their ids: what `draftsync serve` runs, shown in the Prefect UI (schedules and triggers
    included) while nothing runs until someone asks (a run by hand, or `draftsync serve`, which registers them again
    unpaused with their triggers on). Prefect's pause only stops its scheduler: an automation still starts runs of a
    paused deployment, so the triggers are registered disabled. Registering again updates in place (deployments by
    name; Prefect replaces the automations a deployment owns). Default schedules: `draftsync serve`'s defaults, with
    this work dir's sync profile and report time zone."""
    if schedules is None:
        settings = Settings.load()
        schedules = Schedules(profile=settings.sync_profile, timezone=settings.report_timezone)
    ids = []
    for deployment in build_deployments(schedules):
        off = [trigger.model_copy(update={"enabled": False}) for trigger in deployment.triggers]
        paused = deployment.model_copy(update={"paused": True, "triggers": off})
        # apply is async_dispatch-wrapped like to_deployment: from sync code, the id
        ids.append(cast("UUID", paused.apply()))
    return ids
