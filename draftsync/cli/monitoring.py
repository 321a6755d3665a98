"""`draftsync scrape` and `draftsync report`: read acceptance from serving now, and review the week."""

from __future__ import annotations

from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, echo_json, write_json
from draftsync.errors import DraftsyncError


def scrape(json_path: JsonOption = None) -> None:
    """Scrape acceptance counters from every serving deployment into the monitor store."""
    from draftsync.flows.scrape import scrape as scrape_flow

    result = scrape_flow()
    echo_json(result)
    write_json(result, json_path)


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
