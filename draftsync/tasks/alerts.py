"""Operational alerts (a fallback, a rollback): one short e-mail through the outbox, deduplicated.

The weekly report is the digest; these are the messages that cannot wait for Monday. They go through the
same outbox (kept and retried when SMTP is down) and the same de-duplication as the report's findings:
the same alert for the same deployment is not repeated within a week unless it got worse.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.message import EmailMessage

from prefect import task
from prefect.cache_policies import NONE

from draftsync.tasks import context, links


@task(name="send-alert", cache_policy=NONE)
def send_alert(
    deployment: str,
    rule: str,
    subject: str,
    text: str,
    severity: str = "warning",
    value: float = 0.0,
    now: datetime | None = None,
) -> bool:
    """Write and send the alert unless the same one went out recently; whether it went out (its outbox entry keeps
    it for a retry when SMTP is down)."""
    from draftsync.monitors.mailer import Mailer
    from draftsync.tasks.secrets import smtp_password_block

    settings, store = context.settings(), context.store()
    now = now or datetime.now(UTC)
    key = f"{deployment}:{rule}"
    if not store.alerts.should_send(key, now, value, severity=severity):
        context.logger().info("alert %s already sent this week: not repeated", key)
        return False
    message = EmailMessage()
    message["Subject"] = f"[draftsync] {severity.upper()}: {subject}"
    message["From"] = settings.alert_from
    message["To"] = ", ".join(settings.alert_recipients)
    message.set_content(f"{text}\n\nThe flow run that sent this: {links.current_run_url()}")
    entry = Mailer(settings.outbox_dir, store.outbox, settings, secret_loader=smtp_password_block).send(
        message, now=now
    )
    store.alerts.record(
        key, deployment=deployment, rule=rule, severity=severity, value=value, sent_at=now, outbox_id=entry.id
    )
    context.logger().warning("alert sent: %s (%s)", message["Subject"], entry.eml_path)
    return True
