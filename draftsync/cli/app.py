"""The `draftsync` command line: the app, its global options, and the commands of each group in the order `--help`
lists them. Heavy imports (prefect, mlflow, torch) happen inside commands, after the work dir's environment is set,
so `draftsync --help` is fast and every library points at the work dir."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from draftsync.cli.common import command_group
from draftsync.cli.demo import demo_command
from draftsync.cli.drafters import sync, validate
from draftsync.cli.monitoring import report, scrape
from draftsync.cli.plan import plan_command
from draftsync.cli.recommend import recommend_command
from draftsync.cli.rollouts import rollback, rollout
from draftsync.cli.services import serve, watch
from draftsync.cli.serving import serving_app
from draftsync.cli.status import status_command
from draftsync.cli.targets import targets_app
from draftsync.cli.webhooks import webhooks_app
from draftsync.errors import DraftsyncError

app = command_group("Keep speculative-decoding drafters in sync with their target LLMs.")


@app.callback()
def main_options(
    workdir: Annotated[
        Path | None,
        typer.Option(
            "--workdir", envvar="DRAFTSYNC_WORKDIR", help="Holds MLflow, the monitor store, Prefect's home, the outbox."
        ),
    ] = None,
    debug: Annotated[
        bool, typer.Option("--debug", envvar="DRAFTSYNC_DEBUG", help="Print tracebacks for expected errors too.")
    ] = False,
) -> None:
    """Keep speculative-decoding drafters in sync with their target LLMs."""
    import os

    from draftsync.settings import Settings, apply_environment

    if workdir is not None:
        os.environ["DRAFTSYNC_WORKDIR"] = str(workdir)
    if debug:
        os.environ["DRAFTSYNC_DEBUG"] = "true"
    apply_environment(Settings.load())


app.command(name="demo")(demo_command)
for command in (watch, sync, validate, rollout, rollback, serve, scrape, report):
    app.command()(command)
app.command(name="recommend")(recommend_command)
app.command(name="plan")(plan_command)
app.command(name="status")(status_command)
app.add_typer(targets_app, name="targets", help="Target models: register a Hugging Face checkpoint as a new version.")
app.add_typer(serving_app, name="serving", help="The serving service: it owns the servers flows roll out to.")
app.add_typer(webhooks_app, name="webhooks", help="The MLflow webhook receiver: serve it, register it with MLflow.")


def main() -> None:
    try:
        app()
    except DraftsyncError as exc:
        from draftsync.settings import debug_requested

        if debug_requested():
            import traceback

            traceback.print_exc()
        typer.secho(f"error: {exc}", fg="red", err=True)
        sys.exit(2)
