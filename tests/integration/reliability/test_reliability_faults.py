"""Faults in the services the monitor depends on: a Postgres restarted between scrapes loses and doubles no traffic,
and an SMTP server that refuses the login keeps the mail pending until a retry delivers it exactly once."""

from __future__ import annotations

import logging
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from pathlib import Path

import pytest
from draftsync.monitors.tables import ServedPair
from draftsync.serving.process import free_port

from tests.integration.reliability.test_reliability_data import MetricsEndpoint, counters_text

START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
PASSWORD = "pw-9f3c-never-logged"


# --- Postgres restarted while scraping ----------------------------------------------------------
class RestartablePostgres:
    """A Postgres cluster of its own (trust auth, loopback) that a test can stop and start on the same port.

    The session's cluster in tests/conftest.py is shared, so stopping it would break other tests. initdb refuses
    to run as root: under root the cluster belongs to `postgres` (or `nobody`) and commands go through runuser.
    """

    def __init__(self, bin_dir: Path, root: Path, prefix: list[str]):
        self.bin_dir, self.root, self.prefix = bin_dir, root, prefix
        self.data, self.log = root / "data", root / "server.log"
        self.port = free_port()

    def _pg(self, *args: str) -> None:
        try:
            subprocess.run(self.prefix + list(args), check=True, capture_output=True, text=True, timeout=120)
        except subprocess.CalledProcessError as exc:
            detail = exc.stderr + (self.log.read_text() if self.log.exists() else "")
            raise RuntimeError(f"{' '.join(args[:1])} failed: {detail}") from exc

    def init(self) -> None:
        self._pg(
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "draftsync",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        self._pg(
            str(self.bin_dir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self) -> None:
        """`-m fast`: open sessions are cut, as in a restart by an operator or an orchestrator."""
        self._pg(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="draftsync", dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://draftsync@127.0.0.1:{self.port}/{name}"


@pytest.fixture
def restartable_postgres():
    from tests.conftest import cluster_home

    bin_dir, root, prefix = cluster_home("draftsync-pg-restart-")
    cluster = RestartablePostgres(bin_dir, root, prefix)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        if cluster.running():
            subprocess.run(
                prefix + [str(bin_dir / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=120,
            )
        shutil.rmtree(root, ignore_errors=True)


def served_counters(step: int) -> dict:
    """What the server's counters read after `step` intervals of traffic: they only grow."""
    drafts = 40 * step + 7 * step * step
    accepted = drafts + drafts // 2
    return {"drafts": drafts, "accepted": accepted, "first": drafts - drafts // 5}


def test_postgres_restarted_while_scraping_loses_and_doubles_nothing(workdir, restartable_postgres, monkeypatch):
    """Scrapes, a refused scrape while Postgres is down, scrapes after it is back, then a quick restart between two
    scrapes: the booked deltas add up to the counters' growth exactly, none is negative, and the interval after
    each outage spans it."""
    from draftsync.errors import DraftsyncError
    from draftsync.monitors.metrics import scrape_counters
    from draftsync.monitors.tables import HourlyRollup, Sample, ScrapeState
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import scrape_deployment
    from sqlalchemy import make_url, select
    from sqlalchemy.exc import OperationalError

    monkeypatch.setenv("DRAFTSYNC_MONITOR_DB_URL", restartable_postgres.create_database("monitor"))
    context.reset()
    store = context.store()
    assert store.engine.dialect.name == "postgresql"
    endpoint = MetricsEndpoint()
    try:
        store.pairs.record(
            "chat",
            ServedPair(target_name="t", target_version=1, drafter_version=1, gamma=2, drafter_name="t-drafter"),
            endpoint=endpoint.url,
            state="serving",
            now=START,
        )
        step, scraped_at, failed_after_restart = 0, [], []

        def serve_more() -> None:
            nonlocal step
            step += 1
            endpoint.text = counters_text(**served_counters(step))

        def scrape(minute: int) -> None:
            """One scrape as the task runs it, retried once as its Prefect retries would."""
            now = START + minute * MINUTE
            try:
                scrape_deployment.fn("chat", now)
            except DraftsyncError as exc:  # a store failure names the store; the driver's error is chained
                failed_after_restart.append(exc)
                scrape_deployment.fn("chat", now + timedelta(seconds=2))
                now += timedelta(seconds=2)
            scraped_at.append(now)

        for minute in (1, 2, 3):  # three good intervals; the server started at zero, so the first is booked too
            serve_more()
            scrape(minute)
        before_outage = store.acceptance.samples("chat", START, START + timedelta(hours=1))
        assert len(before_outage) == 3

        restartable_postgres.stop()
        serve_more()
        shown = make_url(store.url).render_as_string(hide_password=True)
        with pytest.raises(DraftsyncError) as refused_task:  # the whole task, as the scrape flow runs it
            scrape_deployment.fn("chat", START + 4 * MINUTE)
        assert f"monitor store {shown} is unavailable" in refused_task.value.what
        assert isinstance(refused_task.value.__cause__, OperationalError)
        counters = scrape_counters(f"{endpoint.url}/metrics")  # the metrics are fine; only the store is gone
        with pytest.raises(DraftsyncError) as refused_write:  # the store's own write
            store.acceptance.record_scrape(
                "chat", START + 4 * MINUTE + timedelta(seconds=30), counters, before_outage[-1], count_first=True
            )
        assert f"port {restartable_postgres.port} failed: Connection refused" in str(refused_write.value)
        assert f"monitor store {shown} is unavailable" in refused_write.value.what
        assert "start the database" in refused_write.value.fix
        assert isinstance(refused_write.value.__cause__, OperationalError)

        restartable_postgres.start()
        for minute in (5, 6):
            serve_more()
            scrape(minute)
        assert failed_after_restart == []  # the refused attempts already dropped the dead connections

        restartable_postgres.stop()  # a quick restart between two scrapes: no attempt while it was down
        restartable_postgres.start()
        for minute in (7, 8):
            serve_more()
            scrape(minute)

        with store._sessions() as session:
            samples = list(session.scalars(select(Sample).where(Sample.deployment == "chat").order_by(Sample.ts)))
            state = session.scalars(select(ScrapeState).where(ScrapeState.deployment == "chat")).one()
            rollups = list(session.scalars(select(HourlyRollup).where(HourlyRollup.deployment == "chat")))
    finally:
        endpoint.close()
        context.reset()

    # at most the one scrape right after the quick restart failed (a pooled connection the restart cut)
    assert len(failed_after_restart) <= 1
    for error in failed_after_restart:
        assert "terminating connection due to administrator command" in str(error)
        assert isinstance(error.__cause__, OperationalError)
    # the refused attempts left nothing: one sample per successful scrape, at exactly those times
    assert [s.ts for s in samples] == scraped_at
    assert [s.interval_start for s in samples] == [scraped_at[0]] + scraped_at[:-1]  # no gap, no overlap
    assert samples[3].interval_start == START + 3 * MINUTE  # the interval after the outage spans it
    assert not any(s.reset for s in samples)
    for s in samples:
        assert min(s.drafts, s.draft_tokens, s.accepted, *s.accepted_per_position) >= 0, s

    last, first = served_counters(step), served_counters(1)
    booked = (
        sum(s.drafts for s in samples),
        sum(s.accepted for s in samples),
        sum(s.accepted_per_position[0] for s in samples),
        sum(s.draft_tokens for s in samples),
    )
    assert booked == (last["drafts"], last["accepted"], last["first"], 2 * last["drafts"])
    since_first = (sum(s.drafts for s in samples[1:]), sum(s.accepted for s in samples[1:]))
    assert since_first == (last["drafts"] - first["drafts"], last["accepted"] - first["accepted"])
    assert state.ts == scraped_at[-1] and state.counters["drafts"] == last["drafts"]
    assert sum(r.intervals for r in rollups) == len(samples)
    assert (sum(r.drafts for r in rollups), sum(r.accepted for r in rollups)) == (last["drafts"], last["accepted"])


def test_the_first_scrape_after_a_quick_postgres_restart_succeeds(restartable_postgres, monkeypatch):
    """Postgres restarted between two scrapes: the next scrape should reconnect, not fail once."""
    from draftsync.monitors.metrics import SpecDecodeCounters
    from draftsync.monitors.store import Store
    from draftsync.monitors.tables import ServedPair

    store = Store(restartable_postgres.create_database("monitor"))
    try:
        pair = ServedPair(target_name="t", target_version=1, drafter_version=1, gamma=2)
        store.acceptance.record_scrape(
            "chat", START, SpecDecodeCounters(drafts=10, draft_tokens=20, accepted=15), pair, count_first=True
        )
        restartable_postgres.stop()
        restartable_postgres.start()
        store.acceptance.record_scrape(
            "chat", START + MINUTE, SpecDecodeCounters(drafts=30, draft_tokens=60, accepted=45), pair
        )
        assert [s.drafts for s in store.acceptance.samples("chat", START - MINUTE, START + 2 * MINUTE)] == [10, 20]
    finally:
        store.close()


# --- SMTP refusing the login, then accepting it -------------------------------------------------
class SwitchableLogin:
    """An aiosmtpd authenticator that answers 535 to every login until the test lets it accept the right one."""

    def __init__(self):
        self.accepting = False
        self.attempts: list[bool] = []

    def __call__(self, server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult

        ok = self.accepting and auth_data.login == b"reporter" and auth_data.password == PASSWORD.encode()
        self.attempts.append(ok)
        return AuthResult(success=ok, handled=False)  # handled=False: the server answers 535 itself


def test_smtp_refusing_the_login_keeps_the_mail_pending_and_a_retry_delivers_it_once(
    tmp_path, smtp_server_factory, caplog
):
    """The first attempt gets 535; the mail stays pending with the reason. Once the server accepts the login,
    the retry delivers it and later retries send nothing more. The password is in no log line and no outbox row."""
    from draftsync.monitors.mailer import Mailer
    from draftsync.monitors.store import Store
    from draftsync.settings import Settings

    login = SwitchableLogin()
    server = smtp_server_factory(authenticator=login, auth_require_tls=False)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(
        workdir=tmp_path,
        smtp_host=server.host,
        smtp_port=server.port,
        smtp_user="reporter",
        smtp_password=PASSWORD,
        alert_to="ml-platform@example.org",
    )
    mailer = Mailer(tmp_path / "outbox", store.outbox, settings)
    caplog.set_level(logging.DEBUG)
    message = EmailMessage()
    message["Subject"] = "draftsync weekly acceptance report"
    message.set_content("acceptance held this week")

    entry = mailer.send(message, now=START)
    assert login.attempts and not any(login.attempts)  # smtplib tries each mechanism the server offers
    refused_logins = len(login.attempts)
    assert (entry.status, entry.attempts) == ("pending", 1)
    assert "SMTPAuthenticationError" in entry.last_error and "535" in entry.last_error, entry.last_error
    assert server.messages == []
    assert Path(entry.eml_path).exists()
    assert "not sent (attempt 1, now pending)" in caplog.text

    login.accepting = True
    delivered = mailer.retry_pending(START + timedelta(hours=1))
    assert [e.id for e in delivered] == [entry.id]
    assert mailer.retry_pending(START + timedelta(hours=2)) == []
    assert login.attempts[refused_logins:] == [True]  # one login for the retry, none for the empty one after
    assert len(server.messages) == 1
    assert server.messages[0]["Subject"] == "draftsync weekly acceptance report"
    assert server.envelopes == [("draftsync@localhost", ["ml-platform@example.org"])]
    final = store.outbox.entry(entry.id)
    assert (final.status, final.attempts, final.last_error, final.sent_at) == (
        "sent",
        2,
        None,
        START + timedelta(hours=1),
    )

    assert PASSWORD not in caplog.text
    for row in store.outbox.entries():
        assert PASSWORD not in repr({k: v for k, v in vars(row).items() if not k.startswith("_")})
