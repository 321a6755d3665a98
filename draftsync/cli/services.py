"""`draftsync watch` and `draftsync serve`: run the loop once by hand, or serve its Prefect deployments."""

from __future__ import annotations

from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, ProfileOption, check_registry, echo_json, write_json
from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_url


def watch(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    profile: ProfileOption = "demo",
    json_path: JsonOption = None,
) -> None:
    """Find target versions newer than the watermark and sync a drafter for each."""
    from draftsync.flows.watch import watch as watch_flow
    from draftsync.profiles import profile as named_profile
    from draftsync.tasks import context

    named_profile(profile)  # an unknown profile is refused before the registry is asked
    check_registry()
    registry = context.registry()
    if not registry.has_model(target):  # a typo would otherwise watch nothing and exit 0
        raise DraftsyncError(
            f"MLflow at {masked_url(registry.tracking_uri)} holds no registered model named {target!r}",
            "check the name (`draftsync status` lists the targets) or register the target first "
            "(`draftsync targets register`)",
        )
    result = watch_flow(target_name=target, profile=profile)
    echo_json(result)
    write_json(result, json_path)


def serve(
    targets: Annotated[
        list[str] | None,
        typer.Option(
            "--target",
            help="Also sync this registered model (repeatable); versions tagged draftsync.kind=target "
            "are synced without it.",
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", help="Sync profile of event-started syncs (default DRAFTSYNC_SYNC_PROFILE, else 'demo')."
        ),
    ] = None,
    watch_interval: Annotated[
        int, typer.Option("--watch-interval", min=10, help="Seconds between registry polls.")
    ] = 300,
    scrape_interval: Annotated[
        int, typer.Option("--scrape-interval", min=5, help="Seconds between acceptance scrapes.")
    ] = 60,
    report_cron: Annotated[
        str, typer.Option("--report-cron", help="When the weekly report goes out (cron).")
    ] = "0 9 * * 1",
    timezone: Annotated[
        str | None,
        typer.Option("--timezone", help="Time zone of --report-cron (default DRAFTSYNC_REPORT_TIMEZONE, else UTC)."),
    ] = None,
    sync_concurrency: Annotated[
        int,
        typer.Option("--sync-concurrency", min=1, help="Syncs that may run at once (later ones wait in the queue)."),
    ] = 1,
) -> None:
    """Create or update the five Prefect deployments and run them here until stopped (Ctrl-C).

    Needs a Prefect server (PREFECT_API_URL): its automations turn draftsync's events into sync and rollout runs."""
    import os

    from draftsync.flows.prefect_deployments import Schedules, build_deployments
    from draftsync.profiles import profile as named_profile
    from draftsync.tasks import context

    if not os.environ.get("PREFECT_API_URL"):
        raise DraftsyncError(
            "draftsync serve needs a Prefect server, but PREFECT_API_URL is unset",
            "start one (`prefect server start`, or the compose stack) and set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api; an in-process API would end with this process",
        )
    settings = context.settings()
    chosen = profile or settings.sync_profile
    named_profile(chosen)  # an unknown profile fails here
    _check_schedule(report_cron, timezone or settings.report_timezone)
    # The flow runs this process starts read the same settings from the environment.
    os.environ["DRAFTSYNC_SYNC_PROFILE"] = chosen
    if targets:
        os.environ["DRAFTSYNC_TARGETS"] = ",".join(sorted(set(settings.target_names) | set(targets)))
    context.reset()
    check_registry(long_running=True)
    context.store()  # the monitor store opens (and migrates) before anything is scheduled
    from datetime import timedelta

    from prefect import serve as prefect_serve

    deployments = build_deployments(
        Schedules(
            watch_interval=timedelta(seconds=watch_interval),
            scrape_interval=timedelta(seconds=scrape_interval),
            report_cron=report_cron,
            timezone=timezone or settings.report_timezone,
            profile=chosen,
            sync_concurrency=sync_concurrency,
        )
    )
    prefect_serve(*deployments, print_starting_message=True)


def _check_schedule(cron: str, timezone: str) -> None:
    """The report's cron and time zone, checked by Prefect's own schedule type before anything starts."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as error:
        problem = error.errors()[0]
        raise DraftsyncError(
            f"weekly report schedule: {problem['msg']}",
            "--report-cron takes five cron fields (e.g. '0 9 * * 1'); --timezone an IANA name "
            "(e.g. UTC, Europe/Berlin)",
        ) from error
