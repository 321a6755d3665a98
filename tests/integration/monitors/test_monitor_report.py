"""The weekly report e-mail: its parts, the outbox, and delivery to a real SMTP server (plain, STARTTLS, SSL)."""

from __future__ import annotations

import logging
import ssl
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path

import pytest
from draftsync.monitors.mailer import Mailer
from draftsync.monitors.report import build_weekly_report, render_chart
from draftsync.monitors.staleness import Thresholds, evaluate
from draftsync.monitors.store import Store
from draftsync.monitors.trends import summarize
from draftsync.settings import Settings
from pydantic import SecretStr

START = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
END = START + timedelta(days=7)
HOUR = timedelta(hours=1)
PASSWORD = "s3cret-smtp-pw"


class Row:
    def __init__(self, deployment, ts, rates, drafts=100, target_version=1):
        per_position = [round(p * drafts) for p in rates]
        self.deployment, self.ts, self.interval_start = deployment, ts, ts - HOUR
        self.drafts, self.draft_tokens, self.accepted = drafts, drafts * len(rates), sum(per_position)
        self.accepted_per_position = per_position
        self.target_name, self.target_version, self.drafter_version, self.gamma = "demo-target", target_version, 1, 3
        self.tpot_sum = self.tpot_count = None
        self.reset = False


def report_inputs():
    stale_rows = [
        Row("demo-deployment", START + h * HOUR, (0.9, 0.8, 0.7) if h <= 100 else (0.6, 0.35, 0.2))
        for h in range(1, 169)
    ]
    healthy_rows = [Row("other-deployment", START + h * HOUR, (0.9, 0.8, 0.7)) for h in range(1, 169)]
    summaries = [summarize(healthy_rows, START, END), summarize(stale_rows, START, END)]
    findings = [f for s in summaries for f in evaluate(s, 1, 1)]
    actions = {
        "demo-deployment": [
            "fell back to plain decoding (speculation off)",
            "started sync for demo-target v1 (retrain the drafter)",
        ]
    }
    links = {
        "MLflow drafter versions": "http://127.0.0.1:5000/#/models/demo-target-drafter",
        "Prefect flow run": "http://127.0.0.1:4200/runs/flow-run/abc",
    }
    return summaries, findings, actions, links


def build():
    summaries, findings, actions, links = report_inputs()
    return build_weekly_report(
        summaries,
        findings,
        actions,
        links,
        (START, END),
        thresholds=Thresholds(),
        notes=["demo clock: one week compressed into minutes"],
    )


def parts_of(message):
    text = message.get_body(preferencelist=("plain",)).get_content()
    html = message.get_body(preferencelist=("html",)).get_content()
    images = [p for p in message.walk() if p.get_content_type() == "image/png"]
    return text, html, images


def check_report(message):
    assert message["Subject"] == "[draftsync] STALE: demo-deployment acceptance 0.38 (was 0.80)"
    assert message.get_content_type() == "multipart/alternative"
    text, html, images = parts_of(message)
    for body in (text, html):
        assert "demo-deployment" in body and "other-deployment" in body
        assert "0.80 -&gt; 0.38" in body or "0.80 -> 0.38" in body  # the acceptance trend
        assert "fell back to plain decoding" in body  # the action taken
        assert "drafter stale" in body and "demo clock" in body
        assert "11-02 0.80" in body or "<th>11-02</th>" in body  # the daily series
    assert text.index("demo-deployment: STALE") < text.index("other-deployment: OK")  # worst first
    assert len(images) == 2
    for image in images:
        assert image.get_content().startswith(b"\x89PNG\r\n\x1a\n")
        assert f"cid:{image['Content-ID'].strip('<>')}" in html
        assert image.get_content_disposition() == "inline"


def test_report_has_text_html_and_inline_charts():
    check_report(build())


def test_healthy_report_subject_and_chart():
    summaries, _, _, _ = report_inputs()
    message = build_weekly_report(summaries[:1], [], {}, {}, (START, END))
    assert message["Subject"] == "[draftsync] OK: other-deployment acceptance 0.80 (was 0.80)"
    assert render_chart(summaries[0]).startswith(b"\x89PNG")
    assert "none: healthy" in parts_of(message)[0]


def make_mailer(tmp_path: Path, **smtp) -> tuple[Mailer, Store]:
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(workdir=tmp_path, alert_to="ml-platform@example.org, oncall@example.org", **smtp)
    return Mailer(tmp_path / "outbox", store.outbox, settings, **smtp.pop("_mailer", {})), store


def test_without_smtp_the_outbox_file_is_the_delivery(tmp_path):
    mailer, store = make_mailer(tmp_path)
    entry = mailer.send(build(), now=END)
    assert entry.status == "pending" and "SMTP not configured" in entry.last_error
    saved = message_from_bytes(Path(entry.eml_path).read_bytes(), policy=default_policy)
    check_report(saved)
    assert saved["To"] == "ml-platform@example.org, oncall@example.org"
    assert entry.recipients == "ml-platform@example.org,oncall@example.org"
    assert list((tmp_path / "outbox").iterdir()) == [Path(entry.eml_path)]  # no partial file left
    assert mailer.retry_pending(END) == []


def test_delivered_to_a_real_smtp_server(tmp_path, smtp_server):
    mailer, store = make_mailer(tmp_path, smtp_host=smtp_server.host, smtp_port=smtp_server.port)
    entry = mailer.send(build(), now=END)
    assert entry.status == "sent" and entry.attempts == 1 and entry.sent_at == END
    assert len(smtp_server.messages) == 1
    check_report(smtp_server.messages[0])
    assert smtp_server.envelopes == [("draftsync@localhost", ["ml-platform@example.org", "oncall@example.org"])]
    assert mailer.retry_pending(END) == []
    assert len(smtp_server.messages) == 1


def test_smtp_down_then_retry_delivers_exactly_once(tmp_path, smtp_server_factory):
    from draftsync.serving.process import free_port

    port = free_port()
    mailer, store = make_mailer(tmp_path, smtp_host="127.0.0.1", smtp_port=port)
    entry = mailer.send(build(), now=END)
    assert entry.status == "pending" and entry.attempts == 1
    assert "Connection" in entry.last_error or "refused" in entry.last_error.lower()
    assert Path(entry.eml_path).exists()

    server = smtp_server_factory(port=port)
    delivered = mailer.retry_pending(END + HOUR)
    assert [e.id for e in delivered] == [entry.id]
    assert mailer.retry_pending(END + 2 * HOUR) == []
    assert len(server.messages) == 1
    check_report(server.messages[0])
    final = store.outbox.entry(entry.id)
    assert (final.status, final.attempts, final.last_error, final.sent_at) == ("sent", 2, None, END + HOUR)


def test_a_retry_on_another_worker_delivers_the_message_its_container_wrote(tmp_path, smtp_server_factory):
    """A docker or kubernetes flow run writes the `.eml` into its own container; the retry runs in another one."""
    import shutil

    from draftsync.serving.process import free_port

    port = free_port()
    (tmp_path / "first").mkdir()
    first, store = make_mailer(tmp_path / "first", smtp_host="127.0.0.1", smtp_port=port)
    entry = first.send(build(), now=END)
    assert entry.status == "pending"
    shutil.rmtree(first.outbox_dir)  # that container is gone
    settings = Settings(workdir=tmp_path / "second", smtp_host="127.0.0.1", smtp_port=port)
    second = Mailer(tmp_path / "second" / "outbox", store.outbox, settings)

    server = smtp_server_factory(port=port)
    delivered = second.retry_pending(END + HOUR)

    assert [e.id for e in delivered] == [entry.id] and delivered[0].status == "sent"
    assert len(server.messages) == 1
    check_report(server.messages[0])


def test_gives_up_after_max_attempts(tmp_path):
    from draftsync.serving.process import free_port

    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(workdir=tmp_path, smtp_host="127.0.0.1", smtp_port=free_port())
    mailer = Mailer(tmp_path / "outbox", store.outbox, settings, max_attempts=2)
    entry = mailer.send(build(), now=END)
    assert entry.status == "pending"
    assert mailer.retry_pending(END) == []
    assert store.outbox.entry(entry.id).status == "failed"
    assert store.outbox.entries("pending") == []


def self_signed_tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context, client context trusting only that server's certificate) for 127.0.0.1."""
    x509 = pytest.importorskip("cryptography.x509", reason="cryptography is needed to make a test certificate")
    import ipaddress
    import tempfile

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=cert_pem.decode())
    return server, client


def password_check(seen: list[tuple[bytes, bytes]]):
    from aiosmtpd.smtp import AuthResult

    def authenticate(server, session, envelope, mechanism, auth_data):
        seen.append((auth_data.login, auth_data.password))
        ok = auth_data.login == b"reporter" and auth_data.password == PASSWORD.encode()
        return AuthResult(success=ok, handled=False)  # handled=False: the server answers 535 itself

    return authenticate


@pytest.mark.parametrize("security", ["starttls", "ssl"])
def test_tls_with_login_and_the_password_stays_secret(tmp_path, smtp_server_factory, caplog, security):
    server_tls, client_tls = self_signed_tls()
    seen: list = []
    if security == "starttls":
        server = smtp_server_factory(
            tls_context=server_tls, require_starttls=True, authenticator=password_check(seen), auth_require_tls=True
        )
    else:
        # implicit TLS: aiosmtpd cannot tell the socket is encrypted, so it must not insist on STARTTLS
        server = smtp_server_factory(ssl_context=server_tls, authenticator=password_check(seen), auth_require_tls=False)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(
        workdir=tmp_path,
        smtp_host=server.host,
        smtp_port=server.port,
        smtp_security=security,
        smtp_user="reporter",
        smtp_password=SecretStr(PASSWORD),
    )
    caplog.set_level(logging.DEBUG)
    entry = Mailer(tmp_path / "outbox", store.outbox, settings, ssl_context=client_tls).send(build(), now=END)
    assert entry.status == "sent", entry.last_error
    assert seen == [(b"reporter", PASSWORD.encode())]
    check_report(server.messages[0])

    wrong = Settings(**{**settings.model_dump(), "smtp_password": SecretStr("wrong-" + PASSWORD)})
    failed = Mailer(tmp_path / "outbox", store.outbox, wrong, ssl_context=client_tls).send(build(), now=END)
    assert failed.status == "pending" and "Authentication" in failed.last_error, failed.last_error
    assert PASSWORD not in failed.last_error and PASSWORD not in caplog.text
    assert len(server.messages) == 1


def test_tls_refuses_an_untrusted_certificate(tmp_path, smtp_server_factory):
    server_tls, _ = self_signed_tls()
    server = smtp_server_factory(tls_context=server_tls, require_starttls=True)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(workdir=tmp_path, smtp_host=server.host, smtp_port=server.port, smtp_security="starttls")
    entry = Mailer(tmp_path / "outbox", store.outbox, settings).send(build(), now=END)
    assert entry.status == "pending" and "CERTIFICATE_VERIFY_FAILED" in entry.last_error
    assert server.messages == []


class BlockStore:
    """Secret blocks by name, as the Mailer's `secret_loader` sees them; counts each read."""

    def __init__(self, blocks: dict[str, str]):
        self.blocks, self.reads = blocks, []

    def __call__(self, name: str) -> str:
        from draftsync.errors import DraftsyncError

        self.reads.append(name)
        if name not in self.blocks:
            raise DraftsyncError(
                f"SMTP password block {name!r} (a Prefect Secret) cannot be read: not found", "create it"
            )
        return self.blocks[name]


def test_password_from_a_secret_block_is_read_at_login_only_and_never_shown(tmp_path, smtp_server_factory, caplog):
    seen: list = []
    server = smtp_server_factory(authenticator=password_check(seen), auth_require_tls=False)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    blocks = BlockStore({"smtp-password": PASSWORD, "old-smtp-password": "old-" + PASSWORD})
    settings = Settings(
        workdir=tmp_path,
        smtp_host=server.host,
        smtp_port=server.port,
        smtp_user="reporter",
        smtp_password_block="smtp-password",
    )
    caplog.set_level(logging.DEBUG)
    mailer = Mailer(tmp_path / "outbox", store.outbox, settings, secret_loader=blocks)
    assert blocks.reads == []  # not read when the mailer is made
    assert mailer.send(build(), now=END).status == "sent"
    assert blocks.reads == ["smtp-password"] and seen == [(b"reporter", PASSWORD.encode())]
    check_report(server.messages[0])

    stale = Settings(**{**settings.model_dump(), "smtp_password_block": "old-smtp-password"})
    failed = Mailer(tmp_path / "outbox", store.outbox, stale, secret_loader=blocks).send(build(), now=END)
    assert failed.status == "pending" and "Authentication" in failed.last_error
    assert "old-" + PASSWORD not in failed.last_error and PASSWORD not in caplog.text
    assert len(server.messages) == 1

    both = Settings(**{**settings.model_dump(), "smtp_password": SecretStr(PASSWORD), "smtp_password_block": "missing"})
    assert Mailer(tmp_path / "outbox", store.outbox, both, secret_loader=blocks).send(build(), now=END).status == "sent"
    assert "missing" not in blocks.reads  # DRAFTSYNC_SMTP_PASSWORD, when set, wins over the block


def test_a_password_block_that_cannot_be_read_keeps_the_mail_pending(tmp_path, smtp_server_factory):
    server = smtp_server_factory(authenticator=password_check([]), auth_require_tls=False)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(
        workdir=tmp_path,
        smtp_host=server.host,
        smtp_port=server.port,
        smtp_user="reporter",
        smtp_password_block="smtp-pasword",
    )
    blocks = BlockStore({"smtp-password": PASSWORD})
    entry = Mailer(tmp_path / "outbox", store.outbox, settings, secret_loader=blocks).send(build(), now=END)
    assert entry.status == "pending" and "'smtp-pasword'" in entry.last_error
    assert server.messages == []
    fixed = Settings(**{**settings.model_dump(), "smtp_password_block": "smtp-password"})
    delivered = Mailer(tmp_path / "outbox", store.outbox, fixed, secret_loader=blocks).retry_pending(END + HOUR)
    assert [e.id for e in delivered] == [entry.id] and len(server.messages) == 1


def test_write_unsent_is_a_file_only(tmp_path, smtp_server):
    mailer, store = make_mailer(tmp_path, smtp_host=smtp_server.host, smtp_port=smtp_server.port)
    path = mailer.write_unsent(build(), now=END)
    check_report(message_from_bytes(path.read_bytes(), policy=default_policy))
    assert store.outbox.entries() == [] and mailer.retry_pending(END + HOUR) == []
    assert smtp_server.messages == []


def test_every_state_a_heading_can_show_has_a_colour():
    """A declining trend made the HTML body fail with KeyError: every state of STATE_BY_RULE, and OK, has one."""
    from draftsync.monitors.report import STATE_BY_RULE, STATE_COLORS

    assert set(STATE_COLORS) == {*STATE_BY_RULE.values(), "OK"}


def test_the_report_explains_its_figures_and_links_only_to_addresses():
    summaries, findings, actions, links = report_inputs()
    links["MLflow UI on this work dir"] = "mlflow ui --backend-store-uri sqlite:////tmp/w/mlflow.db"
    message = build_weekly_report(summaries, findings, actions, links, (START, END), thresholds=Thresholds())
    text, html, _ = parts_of(message)
    for body in (text, html):
        assert "stale (critical) under 0.50" in body and "mismatch (warning) under 0.60" in body
        assert "Per position: the share of drafts whose k-th token was accepted" in body
        assert "Slope: the daily acceptance" in body
    assert '<a href="http://127.0.0.1:5000/#/models/demo-target-drafter">' in html
    assert "<code>mlflow ui --backend-store-uri sqlite:////tmp/w/mlflow.db</code>" in html
    assert 'href="mlflow ui' not in html  # a command is text to copy, never a link
