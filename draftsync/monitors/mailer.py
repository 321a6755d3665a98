"""Deliver report e-mails: always as an `.eml` file in the outbox folder, and by SMTP when configured.

Every message is first written to disk and recorded in the store's outbox table as 'pending';
SMTP delivery marks it 'sent'. When the SMTP server is down the message stays 'pending' with the
error, and `retry_pending()` sends it later. A delivery attempt is claimed in the store before it
starts, so two retry loops never send the same message twice. Without `smtp_host` the outbox
folder is the delivery and entries stay 'pending' until SMTP is configured. `write_unsent()` only
writes the file (a report nobody asked to deliver): it is not recorded and never sent.

The SMTP password comes from DRAFTSYNC_SMTP_PASSWORD or, when that is unset, from the secret block that
DRAFTSYNC_SMTP_PASSWORD_BLOCK names, read by the `secret_loader` the caller passes (the flows pass Prefect's,
tasks/secrets.py: this package knows nothing of Prefect). The block is read at login time, not before, and the
password is scrubbed from every error kept or logged.
"""

from __future__ import annotations

import logging
import re
import smtplib
import ssl
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import default as default_policy
from email.utils import format_datetime, getaddresses, make_msgid, parseaddr
from pathlib import Path

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write
from draftsync.monitors.outbox import Outbox
from draftsync.monitors.tables import OutboxEntry, OutboxStatus, as_utc
from draftsync.settings import Settings

log = logging.getLogger(__name__)
DEFAULT_PORTS = {"none": 25, "starttls": 587, "ssl": 465}
NO_SMTP_NOTE = "SMTP not configured (DRAFTSYNC_SMTP_HOST unset): the message is in the outbox folder only"


class Mailer:
    """Writes, records and sends e-mails; `ssl_context` overrides certificate checks (e.g. a private CA)."""

    def __init__(
        self,
        outbox_dir: Path | str,
        outbox: Outbox,
        settings: Settings,
        *,
        ssl_context: ssl.SSLContext | None = None,
        timeout: float = 10.0,
        max_attempts: int = 5,
        secret_loader: Callable[[str], str] | None = None,
    ):
        self.outbox_dir = Path(outbox_dir)
        self.outbox = outbox
        self.settings = settings
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.secret_loader = secret_loader  # block name -> its value (tasks/secrets.py reads Prefect's blocks)
        self._block_password: str | None = None  # kept once loaded, to scrub it from errors

    @property
    def smtp_configured(self) -> bool:
        return bool(self.settings.smtp_host)

    def send(self, message: EmailMessage, now: datetime | None = None) -> OutboxEntry:
        """Write `message` to the outbox, record it, and try SMTP once; failures leave it 'pending'."""
        now = as_utc(now or datetime.now(UTC))
        self._complete_headers(message, now)
        path = self._write(message, now)
        recipients = [address for _, address in getaddresses(message.get_all("To", []) + message.get_all("Cc", []))]
        entry = self.outbox.add(
            subject=str(message["Subject"] or ""),
            recipients=recipients,
            eml_path=str(path),
            message=message.as_bytes(),
            created_at=now,
        )
        if not self.smtp_configured:
            return self.outbox.mark(entry.id, "pending", error=NO_SMTP_NOTE)
        return self._deliver(entry, now) or self.outbox.entry(entry.id)  # type: ignore[return-value]

    def write_unsent(self, message: EmailMessage, now: datetime | None = None) -> Path:
        """Write `message` to the outbox folder only: not recorded in the outbox table, so never sent later."""
        now = as_utc(now or datetime.now(UTC))
        self._complete_headers(message, now)
        return self._write(message, now)

    def _complete_headers(self, message: EmailMessage, now: datetime) -> None:
        if message["From"] is None:
            message["From"] = self.settings.alert_from
        if message["To"] is None:
            recipients = self.settings.alert_recipients
            if not recipients:
                raise DraftsyncError(
                    "no e-mail recipient (DRAFTSYNC_ALERT_TO is empty)",
                    "set DRAFTSYNC_ALERT_TO to one or more comma-separated addresses",
                )
            message["To"] = ", ".join(recipients)
        if message["Date"] is None:
            message["Date"] = format_datetime(now)
        if message["Message-ID"] is None:
            message["Message-ID"] = make_msgid(domain="draftsync.local")

    def retry_pending(self, now: datetime | None = None) -> list[OutboxEntry]:
        """Try every pending message again; returns those delivered now. Does nothing without SMTP."""
        if not self.smtp_configured:
            return []
        now = as_utc(now or datetime.now(UTC))
        delivered = []
        for entry in self.outbox.entries("pending"):
            result = self._deliver(entry, now)
            if result is not None and result.status == "sent":
                delivered.append(result)
        return delivered

    def _write(self, message: EmailMessage, now: datetime) -> Path:
        """Write the .eml atomically, so a reader never sees half a message."""
        try:
            self.outbox_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DraftsyncError(
                f"outbox folder {self.outbox_dir} cannot be created ({exc})",
                "point --workdir (DRAFTSYNC_WORKDIR) at a writable folder",
            ) from exc
        slug = re.sub(r"[^A-Za-z0-9]+", "-", str(message["Subject"] or "message")).strip("-")[:60]
        path = self.outbox_dir / f"{now:%Y%m%dT%H%M%SZ}-{slug}-{uuid.uuid4().hex[:8]}.eml"
        atomic_write(path, lambda tmp: tmp.write_bytes(message.as_bytes()))
        return path

    def _deliver(self, entry: OutboxEntry, now: datetime) -> OutboxEntry | None:
        """One SMTP attempt for `entry`, or None when another sender claimed it first."""
        if not self.outbox.claim(entry.id, entry.attempts):
            return None
        attempts = entry.attempts + 1
        try:
            data = entry.message if entry.message is not None else Path(entry.eml_path).read_bytes()
        except OSError as exc:
            return self.outbox.mark(entry.id, "failed", error=f"cannot read {entry.eml_path}: {exc}")
        headers = BytesParser(policy=default_policy).parsebytes(data, headersonly=True)
        sender = parseaddr(str(headers["From"] or self.settings.alert_from))[1]
        recipients = [r for r in entry.recipients.split(",") if r]
        try:
            refused = self._smtp_send(sender, recipients, data)
        except (smtplib.SMTPException, OSError, DraftsyncError) as exc:  # DraftsyncError: the password block
            error = self._scrub(f"{type(exc).__name__}: {exc}")
            status: OutboxStatus = "failed" if attempts >= self.max_attempts else "pending"
            log.warning("e-mail %r not sent (attempt %d, now %s): %s", entry.subject, attempts, status, error)
            return self.outbox.mark(entry.id, status, error=error)
        note = f"refused by the server: {', '.join(sorted(refused))}" if refused else None
        return self.outbox.mark(entry.id, "sent", error=note, sent_at=now)

    def _smtp_send(self, sender: str, recipients: list[str], data: bytes) -> dict:
        s = self.settings
        assert s.smtp_host is not None, "_deliver sends only when smtp_configured"
        port = s.smtp_port or DEFAULT_PORTS[s.smtp_security]
        context = self.ssl_context or ssl.create_default_context()
        if s.smtp_security == "ssl":
            client: smtplib.SMTP = smtplib.SMTP_SSL(s.smtp_host, port, timeout=self.timeout, context=context)
        else:
            client = smtplib.SMTP(s.smtp_host, port, timeout=self.timeout)
        with client:
            if s.smtp_security == "starttls":
                client.starttls(context=context)
            if s.smtp_user:
                client.login(s.smtp_user, self._password())
            # the file keeps Unix line ends; SMTP needs CRLF and smtplib does not convert bytes
            return client.sendmail(sender, recipients, data.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))

    def _password(self) -> str:
        """DRAFTSYNC_SMTP_PASSWORD, else the Secret block's value (loaded now, at login, once per Mailer)."""
        if self.settings.smtp_password is not None:
            return self.settings.smtp_password.get_secret_value()
        if self.settings.smtp_password_block:
            if self.secret_loader is None:
                raise DraftsyncError(
                    f"DRAFTSYNC_SMTP_PASSWORD_BLOCK names {self.settings.smtp_password_block!r}, but this mailer was "
                    "given no way to read secret blocks",
                    "send mail through draftsync's flows or `draftsync report` (they pass the Prefect block reader), "
                    "or set DRAFTSYNC_SMTP_PASSWORD instead",
                )
            if self._block_password is None:
                self._block_password = self.secret_loader(self.settings.smtp_password_block)
            return self._block_password
        return ""

    def _scrub(self, text: str) -> str:
        """Never let the SMTP password reach a log line or the store."""
        passwords = [
            self.settings.smtp_password.get_secret_value() if self.settings.smtp_password else "",
            self._block_password or "",
        ]
        for password in passwords:
            if password:
                text = text.replace(password, "***")
        return text
