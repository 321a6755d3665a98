"""`draftsync scrape` and `draftsync report`: read acceptance from serving now, and review the week."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, echo_json, expected_errors_in_one_line, write_json
from draftsync.errors import DraftsyncError


def scrape(json_path: JsonOption = None) -> None:
    """Scrape acceptance counters from every serving deployment into the monitor store."""
    from draftsync.flows.scrape import scrape as scrape_flow

    expected_errors_in_one_line()
    result = scrape_flow()
    echo_json(result)
    write_json(result, json_path)


def report(
    week: Annotated[
        str | None,
        typer.Option(
            "--week",
            help="Report on this ISO week, YYYY-Www (Monday to Monday, UTC): a look back, which never acts. "
            "Default: the last 7 days up to now.",
        ),
    ] = None,
    act: Annotated[
        bool,
        typer.Option(
            "--act",
            help="Act as the scheduled review does: fall back, mark stale, request retrains, record alerts and "
            "write the e-mail to the outbox. Without it (or --send) the report only reads.",
        ),
    ] = False,
    send: Annotated[
        bool,
        typer.Option(
            "--send/--no-send",
            help="Deliver the e-mail by SMTP (DRAFTSYNC_SMTP_*), after any mail an earlier outage left pending; the "
            "last 7 days are then acted on as with --act.",
        ),
    ] = False,
    json_path: JsonOption = None,
) -> None:
    """Summarise the week per deployment and apply the staleness rules; with --act or --send, act on them and write
    (or send) the e-mail.

    Exits 1 when --send could not deliver: the e-mail stays in the outbox and the next run retries it."""
    from draftsync.flows.weekly_report import iso_week_period, weekly_report
    from draftsync.tasks import context

    expected_errors_in_one_line()
    if week is not None:
        iso_week_period(week)  # a bad week fails here, before Prefect starts
        if act:
            raise DraftsyncError(
                "--act with --week: a look back at a past week never acts (the deployments may have changed since)",
                "leave --week out to act on the last 7 days, or --act out to read the past week",
            )
    if send and not context.settings().smtp_host:
        raise DraftsyncError(
            "--send needs an SMTP server, but DRAFTSYNC_SMTP_HOST is unset",
            "set DRAFTSYNC_SMTP_HOST (and _PORT, _SECURITY, _USER, _PASSWORD or _PASSWORD_BLOCK), "
            "or use --act to write the e-mail to the outbox folder only",
        )
    charts = context.settings().root / "reports" / (week or datetime.now(UTC).strftime("%Y-%m-%d"))
    result = weekly_report(week=week, send=send, act=act or send, charts_dir=str(charts))
    typer.echo(report_text(result))
    write_json(result, json_path)
    if send and not result["sent"]:
        typer.secho(f"not delivered: {result['delivery']}", fg="red", err=True)
        raise typer.Exit(code=1)


def report_text(result: dict) -> str:
    """The week as a person reads it in a terminal: per deployment what serves now, the week's figures, the
    findings, what was done (or would be), and the chart; then the lines judged against and what the figures mean."""
    import io
    import shutil

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    week, thresholds = result["week"], result["thresholds"]
    start, end = (datetime.fromisoformat(week[key]) for key in ("start", "end"))
    blocks: list = [f"Acceptance review {start:%Y-%m-%d %H:%M} -> {end:%Y-%m-%d %H:%M} UTC"]
    for row in result["deployments"]:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True)
        grid.add_column()
        target = row["target"]
        served = row["serving_drafter_version"]
        drafter = "speculation off" if served is None else f"drafter v{served}"
        rows = [
            ("serving now", f"{row['serving_state']}: {target['name']} v{target['version']}, {drafter}"),
            (
                "this week",
                f"acceptance {_number(row['acceptance_rate'])} (intervals p5 {_number(row['p5'])}, "
                f"p50 {_number(row['p50'])}), trend {_number(row['trend_per_day'], '+.3f')} a day",
            ),
            *((f"[{finding['severity']}]", finding["message"]) for finding in row["findings"]),
            ("done", "; ".join(row["actions"])),
        ]
        if row["name"] in result["charts"]:
            rows.append(("chart", result["charts"][row["name"]]))
        for label, value in rows:
            grid.add_row(Text(label), Text(value))
        blocks += ["", f"{row['name']}: {row['status']}", grid]
    blocks += [
        "",
        f"Lines: stale under {thresholds['stale']:.2f} (fall back, then retrain), mismatch under "
        f"{thresholds['mismatch']:.2f} (the drafter may not match the target serving). Acceptance: accepted / drafted "
        "tokens over the 7 days; p5 and p50 of the scrape intervals; trend: the slope of the daily acceptance.",
    ]
    blocks += [f"Note: {note}" for note in result["notes"]]
    if result["eml_path"]:
        blocks.append(f"E-mail: {result['eml_path']} ({result['delivery']})")
    buffer = io.StringIO()
    console = Console(file=buffer, width=shutil.get_terminal_size().columns, highlight=False)
    for block in blocks:
        console.print(block, markup=False) if isinstance(block, str) else console.print(block)
    return buffer.getvalue().rstrip()


def _number(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)
