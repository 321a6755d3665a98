"""register_paused_deployments puts the five deployments of `draftsync serve` in the Prefect API paused, with their
schedules, and their triggers registered disabled: Prefect's pause stops only its scheduler, an enabled automation
still starts runs of a paused deployment (shown here as the control). Registering twice leaves five."""

from __future__ import annotations

import time
import uuid

from draftsync.tasks import events


def test_registers_the_five_deployments_paused_with_schedules_and_disabled_triggers_once(workdir):
    from draftsync.flows.prefect_deployments import WORK_POOLS, register_paused_deployments
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterDeploymentId,
    )
    from prefect.events import Event

    first = register_paused_deployments()
    second = register_paused_deployments()  # again: updated in place, nothing added
    assert second == first and len(set(first)) == 5

    with get_client(sync_client=True) as client:
        try:
            found = client.read_deployments(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=list(WORK_POOLS)))
            )
            deployments = {d.name: d for d in found}
            assert len(found) == 5 and sorted(deployments) == sorted(WORK_POOLS)
            assert {d.id for d in found} == set(first)
            assert all(d.paused for d in found), {d.name: d.paused for d in found}

            schedules = {name: [s.schedule for s in d.schedules] for name, d in deployments.items()}
            assert [s.interval.total_seconds() for s in schedules["registry-watch"]] == [300.0]
            assert [s.interval.total_seconds() for s in schedules["acceptance-scrape"]] == [60.0]
            assert [(s.cron, s.timezone) for s in schedules["weekly-acceptance-report"]] == [("0 9 * * 1", "UTC")]
            assert schedules["drafter-sync"] == schedules["rollout"] == []

            # Triggers are automations owned by their deployment (a related resource, not read back as the owner):
            # one of each after two registrations, all off.
            owned = {
                name: client.read_resource_related_automations(f"prefect.deployment.{d.id}")
                for name, d in deployments.items()
            }
            assert sorted(a.name for a in owned["drafter-sync"]) == [f"sync-events-{n}-gpu" for n in (1, 2, 4, 8)]
            assert [a.name for a in owned["rollout"]] == ["rollout-events"]
            assert not any(owned[name] for name in ("registry-watch", "acceptance-scrape", "weekly-acceptance-report"))
            triggers = [a for name in ("drafter-sync", "rollout") for a in owned[name]]
            assert not any(a.enabled for a in triggers)
            assert all(set(a.trigger.expect) == set(events.SYNC_EVENTS) for a in owned["drafter-sync"])
            (rollout_automation,) = owned["rollout"]
            assert set(rollout_automation.trigger.expect) == set(events.ROLLOUT_EVENTS)
            rollout_id = deployments["rollout"].id
            assert [(a.type, a.deployment_id) for a in rollout_automation.actions] == [("run-deployment", rollout_id)]

            # Events for the disabled triggers start nothing. The control: drafter-sync's 2-GPU trigger turned on
            # starts runs of the deployment though it stays paused. Each round sends a 1-GPU sync event and a rollout
            # event (odd versions, for triggers that stay off), then a 2-GPU one (even), until the control fires
            # (Prefect reloads a changed automation a moment after the change); then one more 2-GPU event whose run
            # is the barrier: the same trigger path as the 1-GPU events sent before it, so those were handled by then.
            target = f"paused-{uuid.uuid4().hex[:8]}"
            sync_id = deployments["drafter-sync"].id
            control = next(a for a in owned["drafter-sync"] if a.name == "sync-events-2-gpu")

            def send(name: str, version: int, **labels: str) -> None:
                event = Event(event=name, resource=events.target_resource(target, version, **labels), payload={})
                client.request("POST", "/events", json=[event.model_dump(mode="json")]).raise_for_status()

            def runs(deployment_id: uuid.UUID) -> list:
                return client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]))
                )

            def synced(version: int) -> bool:
                return any(run.parameters["target_version"] == version for run in runs(sync_id))

            client.resume_automation(control.id)
            try:
                deadline = time.monotonic() + 30
                version = 0
                while not runs(sync_id) and time.monotonic() < deadline:
                    send(events.SYNC_REQUESTED, version + 1, gpus="1")
                    send(events.DRAFTER_VALIDATED, version + 1)
                    send(events.SYNC_REQUESTED, version + 2, gpus="2")
                    version += 2
                    time.sleep(1)
                assert runs(sync_id), "the control: drafter-sync's 2-GPU trigger, turned on, started no run in 30 s"
                barrier = version + 2
                send(events.SYNC_REQUESTED, barrier, gpus="2")
                while not synced(barrier) and time.monotonic() < deadline + 15:
                    time.sleep(0.25)
                assert synced(barrier), "the barrier's sync run did not start within 15 s"
            finally:
                client.pause_automation(control.id)
            started = runs(sync_id)
            odd = [run.parameters["target_version"] for run in started if run.parameters["target_version"] % 2]
            assert odd == [], "a disabled trigger of a paused deployment started a run"
            assert {run.job_variables["gpu_limit"] for run in started} == {2}  # the control's job variables
            assert runs(rollout_id) == [], "a disabled trigger of a paused deployment started a run"
            after = client.read_deployments(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=first)))
            assert len(after) == 5 and all(d.paused for d in after)  # the control's runs did not unpause anything
        finally:
            for deployment_id in first:  # the session's Prefect API is shared: leave no deployment, run or trigger
                for run in client.read_flow_runs(
                    flow_run_filter=FlowRunFilter(deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id]))
                ):
                    client.delete_flow_run(run.id)
                client.delete_resource_owned_automations(f"prefect.deployment.{deployment_id}")
                client.delete_deployment(deployment_id)
