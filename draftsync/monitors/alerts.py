"""Alerts sent: what a finding's e-mail is deduplicated on, so the same alert is not repeated within a week unless
it got worse."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from draftsync.monitors.database import Repository
from draftsync.monitors.staleness import SEVERITY_RANK, Finding, Severity
from draftsync.monitors.tables import Alert, as_utc

ALERT_REPEAT_AFTER = timedelta(days=7)


class Alerts(Repository):
    """The `alerts` table of the monitor store: one row per alert that went out, keyed `deployment:rule`."""

    def should_send(
        self,
        key: str,
        now: datetime,
        value: float,
        *,
        severity: Severity = "warning",
        higher_is_worse: bool = False,
        margin: float = 0.05,
        repeat_after: timedelta = ALERT_REPEAT_AFTER,
    ) -> bool:
        """Whether a finding deserves an e-mail: not sent within `repeat_after`, unless it got worse.

        Worse means a higher severity, or the value moved past the last alert's by more than
        `margin` in the bad direction (down for acceptance; up when `higher_is_worse`).
        """
        now = as_utc(now)
        with self._database.transaction() as session:
            last = session.scalars(
                select(Alert).where(Alert.key == key).order_by(Alert.sent_at.desc(), Alert.id.desc()).limit(1)
            ).one_or_none()
        if last is None or now - last.sent_at >= repeat_after:
            return True
        if SEVERITY_RANK.get(severity, 0) > SEVERITY_RANK.get(last.severity, 0):
            return True
        change = value - last.value
        return change > margin if higher_is_worse else change < -margin

    def record(
        self,
        key: str,
        *,
        deployment: str,
        rule: str,
        severity: Severity,
        value: float,
        sent_at: datetime,
        outbox_id: int | None = None,
    ) -> Alert:
        """Keep that the alert `key` went out at `sent_at`: the next `should_send` of that key compares with it."""
        with self._database.transaction() as session:
            row = Alert(
                key=key,
                deployment=deployment,
                rule=rule,
                severity=severity,
                value=float(value),
                sent_at=as_utc(sent_at),
                outbox_id=outbox_id,
            )
            session.add(row)
            return row

    def record_finding(self, finding: Finding, *, sent_at: datetime, outbox_id: int | None = None) -> Alert:
        """`record` for a weekly review's finding, keyed as its `should_send` was asked (`finding.key`)."""
        return self.record(
            finding.key,
            deployment=finding.deployment,
            rule=finding.rule,
            severity=finding.severity,
            value=finding.value,
            sent_at=sent_at,
            outbox_id=outbox_id,
        )
