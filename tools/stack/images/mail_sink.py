"""A stand-in for Mailpit in `make test-stack`: an SMTP sink (aiosmtpd) that keeps every message, and the part of
Mailpit's HTTP API the stack test reads, so that the test reads mail the same way from the real Mailpit.

Listens where Mailpit does: SMTP on MP_SMTP_BIND_ADDR (0.0.0.0:1025), HTTP on MP_UI_BIND_ADDR (0.0.0.0:8025).
Messages also go to a maildir under MAILDIR (default /data/maildir)."""

from __future__ import annotations

import json
import mailbox
import os
import threading
import uuid
from datetime import datetime, timezone
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from aiosmtpd.controller import Controller

MESSAGES: list[dict] = []
LOCK = threading.Lock()


def _address(value: str) -> tuple[str, int]:
    host, port = value.rsplit(":", 1)
    return host, int(port)


def _body(message) -> tuple[str, str]:
    text = html = ""
    for part in message.walk() if message.is_multipart() else [message]:
        if part.get_content_maintype() == "multipart":
            continue
        content = part.get_content()
        if part.get_content_type() == "text/plain" and not text:
            text = content
        elif part.get_content_type() == "text/html" and not html:
            html = content
    return text, html


class Sink:
    def __init__(self, maildir: str) -> None:
        os.makedirs(os.path.dirname(maildir) or ".", exist_ok=True)
        self.maildir = mailbox.Maildir(maildir, create=True)

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's hook name)
        raw = envelope.original_content or envelope.content
        message = message_from_bytes(raw, policy=default_policy)
        text, html = _body(message)
        record = {
            "ID": uuid.uuid4().hex,
            "Subject": str(message.get("Subject", "")),
            "From": {"Address": envelope.mail_from},
            "To": [{"Address": rcpt} for rcpt in envelope.rcpt_tos],
            "Created": datetime.now(timezone.utc).isoformat(),
            "Text": text,
            "HTML": html,
        }
        with LOCK:
            MESSAGES.append(record)
            self.maildir.add(raw)
        print(f"mail: {record['Subject']!r} from {envelope.mail_from} to {envelope.rcpt_tos}", flush=True)
        return "250 Message accepted for delivery"


class Api(BaseHTTPRequestHandler):
    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's hook name)
        path = self.path.split("?", 1)[0]
        with LOCK:
            messages = list(MESSAGES)
        if path in ("/livez", "/readyz"):
            self._send(200, "ok")
        elif path == "/api/v1/messages":
            summaries = [{k: v for k, v in m.items() if k not in ("Text", "HTML")} for m in reversed(messages)]
            self._send(200, {"total": len(messages), "messages_count": len(messages), "messages": summaries})
        elif path.startswith("/api/v1/message/"):
            wanted = path.rsplit("/", 1)[1]
            found = next((m for m in messages if m["ID"] == wanted), None)
            self._send(200, found) if found else self._send(404, {"error": "not found"})
        else:
            self._send(404, {"error": "not found"})

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        pass


def main() -> None:
    smtp_host, smtp_port = _address(os.environ.get("MP_SMTP_BIND_ADDR", "0.0.0.0:1025"))
    http_host, http_port = _address(os.environ.get("MP_UI_BIND_ADDR", "0.0.0.0:8025"))
    controller = Controller(Sink(os.environ.get("MAILDIR", "/data/maildir")), hostname=smtp_host, port=smtp_port)
    controller.start()
    print(f"SMTP on {smtp_host}:{smtp_port}, HTTP on {http_host}:{http_port}", flush=True)
    ThreadingHTTPServer((http_host, http_port), Api).serve_forever()


if __name__ == "__main__":
    main()
