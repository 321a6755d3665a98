"""The weekly acceptance report e-mail: plain text + HTML with an inline acceptance chart per deployment."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage, MIMEPart
from email.utils import make_msgid
from io import BytesIO

from draftsync.monitors.staleness import SEVERITY_RANK, Finding, Thresholds, worst
from draftsync.monitors.trends import DeploymentSummary, slope_text

STATE_BY_RULE = {
    "stale": "STALE",
    "lineage": "LINEAGE MISMATCH",
    "mismatch": "MISMATCH",
    "trend": "DECLINING",
    "baseline": "BELOW BASELINE",
}
ACCEPTANCE_RULES = {"stale", "mismatch"}
# Every state a deployment heading can show (STATE_BY_RULE's and OK): red acts now, amber is a warning.
STATE_COLORS = {
    "STALE": "#c00000",
    "LINEAGE MISMATCH": "#c00000",
    "MISMATCH": "#e69500",
    "DECLINING": "#e69500",
    "BELOW BASELINE": "#e69500",
    "OK": "#2e7d32",
}


FIGURES_EXPLAINED = (
    "Acceptance: accepted / drafted tokens. Per position: the share of drafts whose k-th token was accepted (each "
    "counts only when every token before it was), so later positions fall. Slope: the daily acceptance's change a "
    "day, fitted over the period. Intervals: the scrapes' own acceptance, whose p5 shows the worst stretches."
)


def deployment_state(findings: Sequence[Finding]) -> str:
    """One word for the subject and headings: the worst actionable finding's, or OK."""
    actionable = [f for f in findings if f.rule in STATE_BY_RULE]
    top = worst(actionable)
    return STATE_BY_RULE[top.rule] if top else "OK"


def render_chart(summary: DeploymentSummary, thresholds: Thresholds | None = None) -> bytes:
    """PNG of per-interval and daily acceptance over the period, with the threshold lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.dates import DateFormatter
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 3.0), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    # The x values are datetimes, which matplotlib plots through its date units; its stubs take only numbers.
    if summary.points:
        ax.plot(
            [p.midpoint for p in summary.points],  # type: ignore[arg-type]  # datetimes: see above
            [p.rate for p in summary.points],
            ".",
            color="#7f9fbf",
            markersize=3,
            label="per scrape interval",
        )
    if summary.daily:
        days = [d for d, _ in summary.daily] + [min(summary.end, summary.daily[-1][0] + summary.bucket)]
        rates = [r for _, r in summary.daily] + [summary.daily[-1][1]]
        ax.step(days, rates, where="post", color="#1f4e79", linewidth=2, label="daily")  # type: ignore[arg-type]
    if thresholds is not None:
        ax.axhline(thresholds.mismatch, color="#e69500", linestyle="--", linewidth=1, label="mismatch")
        ax.axhline(thresholds.stale, color="#c00000", linestyle="--", linewidth=1, label="stale")
    ax.set_xlim(summary.start, summary.end)  # type: ignore[arg-type]  # datetimes: see above
    ax.set_ylim(0.0, 1.0)
    ax.set_ylabel("acceptance")
    ax.set_title(f"{summary.deployment}: draft-token acceptance", fontsize=10)
    ax.xaxis.set_major_formatter(DateFormatter("%m-%d"))
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", fontsize=7, ncol=4, frameon=False)  # below the axes: it hides no data
    buffer = BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _subject(summaries: Sequence[DeploymentSummary], by_deployment: Mapping[str, list[Finding]]) -> str:
    if not summaries:
        return "[draftsync] weekly report: no deployment was monitored"
    ranked = sorted(summaries, key=lambda s: _rank(by_deployment.get(s.deployment, [])), reverse=True)
    head = ranked[0]
    findings = by_deployment.get(head.deployment, [])
    state = deployment_state(findings)
    acceptance_finding = next((f for f in findings if f.rule in ACCEPTANCE_RULES), None)
    now = acceptance_finding.value if acceptance_finding else head.end_rate
    subject = f"[draftsync] {state}: {head.deployment} acceptance {_fmt(now)}"
    if head.start_rate is not None:
        subject += f" (was {head.start_rate:.2f})"
    others = sum(1 for s in ranked[1:] if deployment_state(by_deployment.get(s.deployment, [])) != "OK")
    if others:
        subject += f"; {others} more deployment{'s' if others > 1 else ''} need attention"
    return subject


def _rank(findings: Sequence[Finding]) -> int:
    actionable = [f for f in findings if f.rule in STATE_BY_RULE]
    return max((SEVERITY_RANK[f.severity] + 1 for f in actionable), default=0)


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _pair_text(s: DeploymentSummary) -> str:
    if s.target_name is None:
        return "no samples"
    drafter = "speculation off" if s.drafter_version is None else f"drafter v{s.drafter_version}, gamma {s.gamma}"
    return f"target {s.target_name} v{s.target_version}, {drafter}"


def _trend(s: DeploymentSummary) -> str:
    slope = "" if s.slope_per_day is None else f", slope {slope_text(s.slope_per_day)}"
    return f"{_fmt(s.start_rate)} -> {_fmt(s.end_rate)} (period {_fmt(s.acceptance_rate)}{slope})"


def _daily_text(s: DeploymentSummary) -> str:
    return " | ".join(f"{day:%m-%d} {rate:.2f}" for day, rate in s.daily) or "no traffic"


@dataclass(frozen=True)
class _ReportContent:
    """What the text body and the HTML body both show: one set of arguments, so the two cannot drift apart."""

    summaries: Sequence[DeploymentSummary]  # in the report's order
    by_deployment: Mapping[str, list[Finding]]
    actions_taken: Mapping[str, Sequence[str]]
    links: Mapping[str, str]
    period: tuple[datetime, datetime]
    notes: Sequence[str]

    def findings(self, deployment: str) -> list[Finding]:
        return self.by_deployment.get(deployment, [])

    def actions(self, deployment: str) -> Sequence[str]:
        return self.actions_taken.get(deployment, [])


def _text_body(content: _ReportContent) -> str:
    period = content.period
    lines = [
        "draftsync weekly acceptance report",
        f"Period: {period[0]:%Y-%m-%d %H:%M} -> {period[1]:%Y-%m-%d %H:%M} UTC",
    ]
    lines += [f"Note: {note}" for note in content.notes]
    lines.append(f"How to read it: {FIGURES_EXPLAINED}")
    for s in content.summaries:
        findings = content.findings(s.deployment)
        lines += [
            "",
            f"== {s.deployment}: {deployment_state(findings)} ==",
            f"Serving: {_pair_text(s)}",
            f"Acceptance trend: {_trend(s)}",
            f"Daily acceptance: {_daily_text(s)}",
            f"Mean acceptance length: {_fmt(s.mean_acceptance_length)}; per position: "
            + (", ".join(f"{r:.2f}" for r in s.per_position_rate) or "n/a"),
            f"Intervals: {s.intervals} (p5 {_fmt(s.interval_p5)}, p50 {_fmt(s.interval_p50)}), "
            f"draft tokens {s.draft_tokens}, accepted {s.accepted}, server restarts seen {s.resets}",
            "Findings:",
        ]
        lines += [f"  [{f.severity.upper()}] {f.message} (action: {f.action})" for f in findings] or ["  none: healthy"]
        lines.append("Action taken:")
        lines += [f"  - {a}" for a in content.actions(s.deployment)] or ["  - none"]
    if content.links:
        lines += ["", "Links:"] + [f"  {label}: {url}" for label, url in content.links.items()]
    return "\n".join(lines) + "\n"


def _html_body(content: _ReportContent, chart_cids: Mapping[str, str]) -> str:
    e, period = html.escape, content.period
    parts = [
        '<html><body style="font-family: sans-serif">',
        "<h2>draftsync weekly acceptance report</h2>",
        f"<p>Period: {period[0]:%Y-%m-%d %H:%M} &rarr; {period[1]:%Y-%m-%d %H:%M} UTC</p>",
    ]
    parts += [f"<p><em>{e(note)}</em></p>" for note in content.notes]
    for s in content.summaries:
        findings = content.findings(s.deployment)
        state = deployment_state(findings)
        parts.append(f'<h3>{e(s.deployment)}: <span style="color:{STATE_COLORS[state]}">{e(state)}</span></h3>')
        parts.append('<table border="1" cellpadding="4" cellspacing="0">')
        rows = [
            ("Serving", _pair_text(s)),
            ("Acceptance trend", _trend(s)),
            ("Mean acceptance length", _fmt(s.mean_acceptance_length)),
            ("Per position", ", ".join(f"{r:.2f}" for r in s.per_position_rate) or "n/a"),
            ("Intervals", f"{s.intervals} (p5 {_fmt(s.interval_p5)}, p50 {_fmt(s.interval_p50)})"),
            ("Draft tokens / accepted", f"{s.draft_tokens} / {s.accepted}"),
            ("Server restarts seen", str(s.resets)),
        ]
        parts += [f'<tr><th align="left">{e(k)}</th><td>{e(v)}</td></tr>' for k, v in rows]
        parts.append("</table>")
        parts.append(f"<p><small>{e(FIGURES_EXPLAINED)}</small></p>")
        if s.daily:
            parts.append('<p>Daily acceptance:</p><table border="1" cellpadding="4" cellspacing="0"><tr>')
            parts += [f"<th>{day:%m-%d}</th>" for day, _ in s.daily]
            parts.append("</tr><tr>")
            parts += [f"<td>{rate:.2f}</td>" for _, rate in s.daily]
            parts.append("</tr></table>")
        if s.deployment in chart_cids:
            parts.append(
                f'<p><img src="cid:{chart_cids[s.deployment]}" '
                f'alt="acceptance of {e(s.deployment)} over the period"></p>'
            )
        parts.append("<p><b>Findings</b></p><ul>")
        parts += [f"<li>[{e(f.severity.upper())}] {e(f.message)} (action: {e(f.action)})</li>" for f in findings] or [
            "<li>none: healthy</li>"
        ]
        parts.append("</ul><p><b>Action taken</b></p><ul>")
        parts += [f"<li>{e(a)}</li>" for a in content.actions(s.deployment)] or ["<li>none</li>"]
        parts.append("</ul>")
    if content.links:
        parts.append("<p><b>Links</b></p><ul>")
        parts += [
            f'<li><a href="{e(url, quote=True)}">{e(label)}</a></li>'
            if url.startswith(("http://", "https://"))
            else f"<li>{e(label)}: <code>{e(url)}</code></li>"  # a command to run, not an address
            for label, url in content.links.items()
        ]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_weekly_report(
    summaries: Sequence[DeploymentSummary],
    findings: Sequence[Finding],
    actions_taken: Mapping[str, Sequence[str]],
    links: Mapping[str, str],
    period: tuple[datetime, datetime],
    *,
    thresholds: Thresholds | None = None,
    notes: Sequence[str] = (),
) -> EmailMessage:
    """The report as multipart/alternative (text, and HTML with one inline PNG chart per deployment).

    `actions_taken` maps a deployment to what was done (e.g. "fell back to plain decoding",
    "started sync for target v2"); `links` maps labels to URLs (MLflow, Prefect); `notes` are shown
    on top (e.g. that the demo compresses a week into minutes). From/To are set by the Mailer.
    """
    by_deployment: dict[str, list[Finding]] = {}
    for finding in findings:
        by_deployment.setdefault(finding.deployment, []).append(finding)
    ordered = sorted(summaries, key=lambda s: (-_rank(by_deployment.get(s.deployment, [])), s.deployment))

    charts = {s.deployment: render_chart(s, thresholds) for s in ordered if s.points}
    chart_cids = {name: make_msgid(domain="draftsync.local")[1:-1] for name in charts}

    if thresholds is not None:  # the chart's two lines, said where they are shown
        notes = [
            *notes,
            f"Lines: stale (critical) under {thresholds.stale:.2f} sustained over the last intervals: fall back to "
            f"plain decoding and retrain; mismatch (warning) under {thresholds.mismatch:.2f}: the drafter may not "
            "fit the traffic or the target, speculation falls back.",
        ]
    message = EmailMessage()
    message["Subject"] = _subject(ordered, by_deployment)
    content = _ReportContent(ordered, by_deployment, actions_taken, links, period, notes)
    message.set_content(_text_body(content))
    message.add_alternative(_html_body(content, chart_cids), subtype="html")
    html_part = message.get_payload()[1]  # type: ignore[index]  # multipart now: a list of parts
    assert isinstance(html_part, MIMEPart), "add_alternative made the message multipart/alternative"
    for name, png in charts.items():
        html_part.add_related(
            png,
            maintype="image",
            subtype="png",
            cid=f"<{chart_cids[name]}>",
            disposition="inline",
            filename=f"{_slug(name)}-acceptance.png",
        )
    return message


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "deployment"
