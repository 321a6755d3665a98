"""`draftsync status`: one block per target with its drafters' lineage, the deployments serving them with the
weekly review's acceptance of the pair serving now and its findings, recommended against measured gamma and the
last sync, readable at 80 columns. A plain function with typer options; the `draftsync` app registers it as
`status`. MLflow and the monitor store are opened only inside the command.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from draftsync.cli.common import JsonOption, check_registry, write_json

if TYPE_CHECKING:
    from rich.console import Group

SHOWN_DRAFTERS = 5  # newest drafter versions listed per target in the terminal; the JSON has them all
STATE_STYLES = {"serving": "green", "fallback": "yellow", "stale": "red"}
SYNC_STYLES = {"succeeded": "green", "running": "cyan", "requested": "cyan", "failed": "red"}
VALIDATION_STYLES = {"passed": "green", "failed": "red", "pending": "yellow"}
FINDING_STYLES = {"critical": "red", "warning": "yellow"}
FINDING_CHARS = 160  # a finding's message is cut here in the terminal; the JSON and `draftsync report` have it whole


def status_command(json_path: JsonOption = None) -> None:
    """Show every target: versions and aliases, drafter versions with lineage, deployments and their state
    (serving / fallback / stale) with the last 7 days' acceptance of the pair serving now and the weekly review's
    findings, recommended vs measured gamma, the last sync."""
    from rich.console import Console

    from draftsync.cli.status_query import current_status

    check_registry()
    status = current_status()
    console = Console()
    if status["targets"]:
        console.print(status_table(status))
    else:
        console.print(
            "no targets: register a model version tagged draftsync.kind=target "
            "(draftsync demo does) or name one in DRAFTSYNC_TARGETS"
        )
        for problem in status["problems"]:
            console.print(f"problem: {escape(problem)}", style="yellow", highlight=False)
    write_json(status, json_path)


def _gamma_recommended(recommended: dict[str, Any] | None) -> str:
    if recommended is None:
        return "-"
    if recommended.get("method") == "none":
        return "none"
    span = "-"
    if recommended["range"] is not None:
        low, high = recommended["range"]
        span = str(low) if low == high else f"{low}-{high}"
    start = recommended["start"]
    return span if start is None else f"{span} (start {start})"


def _drafter_lines(drafters: list[dict[str, Any]]) -> str:
    """Newest first: `v3 <- t2 eagle3 passed [production]; gamma rec 2-4 (start 3) / meas 4`."""
    if not drafters:
        return "[dim]no drafter[/]"
    shown = sorted(drafters, key=lambda d: d["version"], reverse=True)[:SHOWN_DRAFTERS]
    lines = []
    for drafter in shown:
        trained_for = "?" if drafter["trained_for"] is None else drafter["trained_for"]
        style = VALIDATION_STYLES.get(drafter["validation"], "")
        validation = f"[{style}]{drafter['validation']}[/]" if style else escape(drafter["validation"])
        aliases = escape(f" [{', '.join(drafter['aliases'])}]") if drafter["aliases"] else ""
        method = escape(drafter["method"] or "?") + (f" ({drafter['mtp_head']} head)" if drafter["mtp_head"] else "")
        measured = "-" if drafter["gamma_measured"] is None else drafter["gamma_measured"]
        gamma = f"gamma rec {_gamma_recommended(drafter['gamma_recommended'])} / meas {measured}"
        lines.append(f"v{drafter['version']} <- t{trained_for} {method} {validation}{aliases}; {gamma}")
    if len(drafters) > len(shown):
        lines.append(f"... {len(drafters) - len(shown)} older")
    return "\n".join(lines)


def _target_heading(target: dict[str, Any]) -> str:
    versions = ", ".join(f"v{v}" for v in target["versions"]) or "no versions"
    aliases = "; ".join(f"{alias} -> v{version}" for alias, version in target["aliases"].items())
    heads = "; ".join(f"v{head['version']} ships a {head['family']} MTP head" for head in target["mtp_heads"])
    return (
        f"[bold]{escape(target['name'])}[/] ({versions}"
        + "".join(f"; {part}" for part in (aliases, heads) if part)
        + ")"
    )


def _sync_cell(job: dict[str, Any] | None) -> str:
    if job is None:
        return "-"
    style = SYNC_STYLES.get(job["status"], "")
    status = f"[{style}]{job['status']}[/]" if style else job["status"]
    # a re-opened job keeps the drafter of its previous generation: name it only for a success
    drafter = f" -> d{job['drafter_version']}" if job["status"] == "succeeded" and job["drafter_version"] else ""
    moments = [datetime.fromisoformat(job[key]) for key in ("requested_at", "started_at", "finished_at") if job[key]]
    why = f": {escape(job['detail'].splitlines()[0][:160])}" if job["status"] == "failed" and job["detail"] else ""
    return f"t{job['target_version']} {job['method']} {status}{drafter}, {max(moments):%Y-%m-%d %H:%M} UTC{why}"


def _pair_text(target_version: int, drafter_version: int | None) -> str:
    drafter = ", speculation off" if drafter_version is None else f" + d{drafter_version}"
    return f"t{target_version}{drafter}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _acceptance_text(deployment: dict[str, Any]) -> str:
    """`acceptance 0.92 (pair serving now, 1,234 drafted); pooled 7d 0.06`: the weekly review's figure of the
    pair it judges, and the week of every pair pooled only where other pairs drafted too."""
    judged = deployment["judged"]
    served = (deployment["target_version"], deployment["drafter_version"])
    if judged is None or (judged["target_version"], judged["drafter_version"]) == served:
        whose = "pair serving now"
    else:  # speculation off after a fallback: the review judges the drafter it fell back from
        whose = f"{_pair_text(judged['target_version'], judged['drafter_version'])} before speculation went off"
    tokens = deployment["draft_tokens_7d"]
    drafted = f"{tokens:,} drafted" if tokens else "nothing drafted this week"
    text = f"acceptance {_rate(deployment['acceptance_7d'])} ({whose}, {drafted})"
    if deployment["review_error"] is not None:
        text = f"acceptance not judged ({escape(deployment['review_error'])})"
    if deployment["pooled_draft_tokens_7d"] != tokens:
        text += f"; pooled 7d {_rate(deployment['pooled_acceptance_7d'])}"
    return text


def _finding_line(finding: dict[str, Any], name: str) -> str:
    message = finding["message"].removeprefix(f"{name}: ")
    if len(message) > FINDING_CHARS:
        message = message[: FINDING_CHARS - 4].rstrip() + " ..."
    style = FINDING_STYLES.get(finding["severity"], "")
    action = "" if finding["action"] == "none" else f" ({finding['action']})"
    label = f"{finding['severity']} {finding['rule']}{action}"
    return f"[{style}]{escape(label)}[/]: {escape(message)}" if style else f"{escape(label)}: {escape(message)}"


def _deployment_line(deployment: dict[str, Any]) -> str:
    """What serves, the review's acceptance of it, then one line per warning or critical finding and one for the
    pairs it replaced this week (those the pooled figure mixes in)."""
    style = STATE_STYLES.get(deployment["state"], "")
    state = f"[{style}]{deployment['state']}[/]" if style else deployment["state"]
    if deployment["drafter_version"] is None:
        served = f"t{deployment['target_version']}, speculation off"
    else:
        served = f"t{deployment['target_version']} + d{deployment['drafter_version']}, gamma {deployment['gamma']}"
    lines = [f"{state}: {served}; {_acceptance_text(deployment)}"]
    lines += [_finding_line(finding, deployment["name"]) for finding in deployment["findings"]]
    replaced = [
        f"{_pair_text(p['target_version'], p['drafter_version'])} {_rate(p['acceptance_rate'])} "
        f"({p['draft_tokens']:,} drafted)"
        for p in deployment["replaced_pairs"]
        if p["draft_tokens"]
    ]
    if replaced:
        lines.append("replaced this week: " + "; ".join(replaced))
    return "\n".join(lines)


LEGEND = (
    "v3 <- t2: drafter version 3, trained for target version 2. t2 + d3: target v2 served with drafter v3. "
    "gamma rec: the range (and start) the decision framework recommends, none when it advises no speculation; "
    "meas: the gamma validation measured best. acceptance: accepted / drafted tokens over the last 7 days of the "
    "pair serving now, its hours only, as `draftsync report` judges it (after a fallback, of the drafter it fell "
    "back from); pooled 7d: every pair the deployment served this week together, shown where it differs."
)


def status_table(status: dict[str, Any]) -> Group:
    """One block per target: its versions and aliases, its drafters, each deployment serving it, its last sync;
    labels on the left, values that wrap at any terminal width, and the legend of the short forms."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    blocks: list[Any] = [Text("draftsync status", style="bold")]
    for target in status["targets"]:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        grid.add_row("drafters", _drafter_lines(target["drafters"]))
        for deployment in target["deployments"]:
            grid.add_row(escape(deployment["name"]), _deployment_line(deployment))
        if not target["deployments"]:
            grid.add_row("deployment", "[dim]not deployed[/]")
        grid.add_row("last sync", _sync_cell(target["last_sync"]))
        if target["last_attempt"] is not None:
            grid.add_row("last attempt", _sync_cell(target["last_attempt"]))
        blocks += [Text(""), _target_heading(target), grid]
    for problem in status.get("problems", []):
        blocks += [Text(""), Text(f"problem: {problem}", style="yellow")]
    blocks += [Text(""), Text(LEGEND, style="dim")]
    return Group(*blocks)
