"""The `draftsync` command line. Heavy imports (prefect, mlflow, torch) happen inside commands, after the
work dir's environment is set, so `draftsync --help` is fast and every library points at the work dir."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, check_registry, echo_json, write_json
from draftsync.cli.recommend import recommend_command
from draftsync.cli.status import status_command
from draftsync.cli.webhooks import webhooks_app
from draftsync.errors import DraftsyncError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Keep speculative-decoding drafters in sync with their target LLMs.",
)

ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        help="Sync profile: 'production' (GPU worker), 'demo' (2-core CPU), 'test' (smaller) or a YAML/JSON file.",
    ),
]


@app.callback()
def main_options(
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", envvar="DRAFTSYNC_WORKDIR", help="Holds MLflow, the monitor store, Prefect's home, the outbox."
        ),
    ] = None,
) -> None:
    """Keep speculative-decoding drafters in sync with their target LLMs."""
    import os

    from draftsync.settings import Settings, apply_environment

    if workdir is not None:
        os.environ["DRAFTSYNC_WORKDIR"] = str(workdir)
    apply_environment(Settings())


@app.command()
def demo(
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="Serving engine: 'auto' (vLLM when one is installed, `make vllm`; else the CPU reference "
            "server), 'vllm' (fail when none is installed) or 'reference'.",
        ),
    ] = "auto",
    json_path: JsonOption = None,
) -> None:
    """Run the whole loop on this machine: targets v1 and v2, drafters, serving, monitoring, a stale e-mail."""
    from draftsync.cli.demo import ENGINES, run_demo

    if engine not in ENGINES:
        raise DraftsyncError(f"demo engine {engine!r} is unknown", f"use one of {', '.join(ENGINES)}")
    result = run_demo(engine)
    write_json(result, json_path)


@app.command()
def watch(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    profile: ProfileOption = "demo",
    json_path: JsonOption = None,
) -> None:
    """Find target versions newer than the watermark and sync a drafter for each."""
    from draftsync.flows.watch import watch as watch_flow

    check_registry()
    result = watch_flow(target_name=target, profile=profile)
    echo_json(result)
    write_json(result, json_path)


@app.command()
def sync(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    version: Annotated[int, typer.Argument(help="Target version to train a drafter for.")],
    profile: ProfileOption = "demo",
    method: Annotated[
        str | None, typer.Option(help="Drafter method: eagle3, eagle3.1, eagle or medusa (default: the profile's).")
    ] = None,
    retrain: Annotated[
        bool, typer.Option("--retrain", help="Train again even though this version was synced (a new drafter version).")
    ] = False,
    json_path: JsonOption = None,
) -> None:
    """Train, validate, register and (when it passes) promote a drafter for one target version.

    A version already synced with this method is skipped (the result says `skipped`) unless --retrain."""
    from draftsync.flows.sync import sync as sync_flow
    from draftsync.profiles import profile as named_profile
    from draftsync.speculative.methods import TRAINED_METHODS, method_named

    chosen = named_profile(profile)
    if method is not None:
        method_named(method, among=TRAINED_METHODS)
        chosen = chosen.model_copy(update={"method": method})
    check_registry()
    if retrain:
        from draftsync.tasks import context

        context.sync_ledger().request(
            target, version, chosen.method, source="cli", reason="retrain by hand", retrain=True
        )
    result = sync_flow(target_name=target, target_version=version, profile=chosen, reason="started by hand")
    echo_json(result)
    write_json(result, json_path)


@app.command()
def validate(
    target: Annotated[str, typer.Argument(help="Registered model name of the target.")],
    drafter_version: Annotated[int, typer.Argument(help="Version of the target's drafter (<target>-drafter).")],
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Checklist profile: 'production' (1000 requests, 3x QPS, 4K-token outputs), "
            "'demo' (scaled to a 2-core CPU) or 'test'.",
        ),
    ] = "demo",
    target_version: Annotated[
        int | None,
        typer.Option(
            "--target-version", help="Validate against this target version (default: the one it was trained for)."
        ),
    ] = None,
    promote: Annotated[
        bool, typer.Option("--promote", help="Make the drafter `production` if every gate passes.")
    ] = False,
    backend: Annotated[
        str,
        typer.Option(
            "--backend", help="'reference' (CPU reference engine) or 'vllm' (offline vLLM; a GPU worker with vllm)."
        ),
    ] = "reference",
    json_path: JsonOption = None,
) -> None:
    """Run the validation checklist and benchmarks on a drafter version; exit 1 when a gate fails."""
    from draftsync.flows.validate import validate as validate_flow
    from draftsync.profiles import validation_profile

    chosen = validation_profile(profile)
    check_registry()
    result = validate_flow(
        target_name=target,
        drafter_version=drafter_version,
        profile=chosen,
        target_version=target_version,
        promote=promote,
        backend=backend,
    )
    write_json(result, json_path)
    for gate in result["gates"]:
        mark = "pass" if gate["passed"] else "FAIL"
        typer.echo(f"{mark:4}  {gate['name']:38} {gate['value']!s:>10} {gate['comparison']} {gate['threshold']}")
    typer.echo(
        f"gamma knee {result['gamma_knee']}; speedup {result['speedup']:.2f}x; "
        f"{'PASSED' if result['passed'] else 'FAILED'} ({result['reports_dir']})"
    )
    if not result["passed"]:
        raise typer.Exit(code=1)


DeploymentArgument = Annotated[str, typer.Argument(help="Deployment name, as declared in the deployments file.")]


def _deployment(name: str):
    from draftsync.serving.deployment import find_deployment, load_deployments
    from draftsync.tasks import context

    path = context.settings().deployments_path
    if not path.exists():
        raise DraftsyncError(
            f"no deployments file at {path}",
            "declare deployments in YAML there, or point DRAFTSYNC_DEPLOYMENTS_FILE at yours "
            "(the format: README, 'Deployments')",
        )
    return find_deployment(load_deployments(path), name)


@app.command()
def rollout(
    deployment: DeploymentArgument,
    drafter_version: Annotated[
        int | None,
        typer.Option(
            "--drafter-version", help="Serve this validated drafter version (default: the one for the served target)."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the rendered launch; start nothing.")] = False,
    canary_requests: Annotated[
        int,
        typer.Option(
            "--canary-requests", help="Canary requests to send after the switch (0: live traffic is the canary)."
        ),
    ] = 0,
    json_path: JsonOption = None,
) -> None:
    """Roll the deployment's pair out: candidate, checks, switch, canary; rolls back by itself on a bad canary."""
    from draftsync.flows.rollout import rollout as rollout_flow

    spec = _deployment(deployment)
    check_registry()
    if dry_run:
        from draftsync.flows.rollout import planned_launch

        result = {**planned_launch(spec, drafter_version)[2], "dry_run": True}
    else:
        result = rollout_flow(
            spec, drafter_version=drafter_version, canary_requests=canary_requests, reason="rolled out by hand"
        )
    echo_json(result)
    write_json(result, json_path)


@app.command()
def rollback(deployment: DeploymentArgument, json_path: JsonOption = None) -> None:
    """Point the drafter's `production` back at `previous` and serve that pair."""
    from draftsync.flows.rollout import rollback as rollback_flow

    spec = _deployment(deployment)
    check_registry()
    result = rollback_flow(spec)
    echo_json(result)
    write_json(result, json_path)


@app.command()
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

    from draftsync.flows.deployments import Schedules, build_deployments
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
    check_registry()
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


@app.command()
def scrape(json_path: JsonOption = None) -> None:
    """Scrape acceptance counters from every serving deployment into the monitor store."""
    from draftsync.flows.scrape import scrape as scrape_flow

    result = scrape_flow()
    echo_json(result)
    write_json(result, json_path)


@app.command()
def report(
    week: Annotated[
        str | None,
        typer.Option(
            "--week",
            help="Report on this ISO week, YYYY-Www (Monday to Monday, UTC): a look back, no action taken. "
            "Default: review the last 7 days up to now and act (fallback, retrain request).",
        ),
    ] = None,
    send: Annotated[
        bool,
        typer.Option(
            "--send/--no-send",
            help="Deliver by SMTP (DRAFTSYNC_SMTP_*), after any mail an earlier outage left "
            "pending; without it the e-mail is only written to the outbox folder.",
        ),
    ] = False,
    json_path: JsonOption = None,
) -> None:
    """Summarise the week per deployment, apply the staleness rules, act on them and write (or send) the e-mail.

    Exits 1 when --send could not deliver: the e-mail stays in the outbox and the next run retries it."""
    from draftsync.flows.weekly_report import iso_week_period, weekly_report
    from draftsync.tasks import context

    if week is not None:
        iso_week_period(week)  # a bad week fails here, before Prefect starts
    if send and not context.settings().smtp_host:
        raise DraftsyncError(
            "--send needs an SMTP server, but DRAFTSYNC_SMTP_HOST is unset",
            "set DRAFTSYNC_SMTP_HOST (and _PORT, _SECURITY, _USER, _PASSWORD or _PASSWORD_BLOCK), "
            "or leave --send out to write the e-mail to the outbox folder only",
        )
    result = weekly_report(week=week, send=send)
    echo_json(result)
    write_json(result, json_path)
    if send and not result["sent"]:
        typer.secho(f"not delivered: {result['delivery']}", fg="red", err=True)
        raise typer.Exit(code=1)


app.command(name="recommend")(recommend_command)
app.command(name="status")(status_command)
app.add_typer(webhooks_app, name="webhooks", help="The MLflow webhook receiver: serve it, register it with MLflow.")


def main() -> None:
    try:
        app()
    except DraftsyncError as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
