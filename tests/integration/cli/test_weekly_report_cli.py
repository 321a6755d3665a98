"""`draftsync report` end to end: a week whose acceptance falls from 0.8 to 0.45, a real MLflow registry, the
Prefect test harness, a deployments file, and an aiosmtpd server that wants the password kept in a Prefect
Secret block. SMTP is down on the first run and up on the next."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.tables import ServedPair
from typer.testing import CliRunner

from tests.support.prefect_events import target_events

PASSWORD = "block-kept-smtp-pw"
BLOCK = "draftsync-test-smtp-password"
HOUR = timedelta(hours=1)
STALE_EVENT = "draftsync.drafter.stale"


def password_check(seen: list):
    from aiosmtpd.smtp import AuthResult

    def authenticate(server, session, envelope, mechanism, auth_data):
        seen.append((auth_data.login, auth_data.password))
        return AuthResult(
            success=auth_data.login == b"reporter" and auth_data.password == PASSWORD.encode(), handled=False
        )

    return authenticate


def save_secret_block(name: str, value: str) -> None:
    from prefect.blocks.system import Secret

    Secret(value=value).save(name, overwrite=True)


def test_smtp_password_from_a_prefect_secret_block(prefect_harness, tmp_path, smtp_server_factory, caplog):
    from draftsync.monitors.mailer import Mailer
    from draftsync.monitors.store import Store
    from draftsync.settings import Settings
    from draftsync.tasks.secrets import smtp_password_block

    from tests.integration.monitors.test_monitor_report import END, build, check_report

    save_secret_block(BLOCK, PASSWORD)
    seen: list = []
    server = smtp_server_factory(authenticator=password_check(seen), auth_require_tls=False)
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    settings = Settings(
        workdir=tmp_path, smtp_host=server.host, smtp_port=server.port, smtp_user="reporter", smtp_password_block=BLOCK
    )
    assert PASSWORD not in repr(settings)
    caplog.set_level("DEBUG")
    entry = Mailer(tmp_path / "outbox", store.outbox, settings, secret_loader=smtp_password_block).send(
        build(), now=END
    )
    assert entry.status == "sent", entry.last_error
    assert seen == [(b"reporter", PASSWORD.encode())]
    check_report(server.messages[0])
    assert PASSWORD not in caplog.text

    missing = Settings(**{**settings.model_dump(), "smtp_password_block": "no-such-block"})
    pending = Mailer(tmp_path / "outbox", store.outbox, missing, secret_loader=smtp_password_block).send(
        build(), now=END
    )
    assert pending.status == "pending" and "'no-such-block'" in pending.last_error
    unread = Mailer(tmp_path / "outbox", store.outbox, settings).send(build(), now=END)  # no loader: said, not guessed
    assert unread.status == "pending" and "DRAFTSYNC_SMTP_PASSWORD" in unread.last_error
    assert len(server.messages) == 1


# --- the command line, end to end ---------------------------------------------------------------------------
def rate_at(fraction: float) -> float:
    """The week's acceptance: 0.80 at its start, 0.45 at its end, linearly."""
    return 0.80 + (0.45 - 0.80) * fraction


def record_week(store, deployment: str, pair, now: datetime) -> None:
    """168 hourly scrapes of cumulative counters ending a minute before `now` (gamma 3, 100 drafts an hour)."""
    from draftsync.monitors.metrics import SpecDecodeCounters

    totals = [0, 0, 0, (0, 0, 0)]
    first = now - timedelta(days=7) + timedelta(minutes=1)
    for hour in range(169):
        rate = rate_at(hour / 168)
        positions = tuple(round(100 * min(1.0, rate * f)) for f in (1.25, 1.0, 0.75))
        if hour:
            totals = [
                totals[0] + 100,
                totals[1] + 300,
                totals[2] + sum(positions),
                tuple(a + b for a, b in zip(totals[3], positions, strict=True)),
            ]
        counters = SpecDecodeCounters(totals[0], totals[1], totals[2], totals[3])
        store.acceptance.record_scrape(deployment, min(first + hour * HOUR, now - timedelta(minutes=1)), counters, pair)


def last_complete_iso_week(now: datetime) -> str:
    year, week, _ = (now - timedelta(days=7)).isocalendar()
    return f"{year}-W{week:02d}"


def serve_new_drafter(version: int, target_dir: Path, drafter_dir: Path) -> int:
    """A validated drafter of report-llm's `version`, registered and recorded as what deployment chat serves."""
    from draftsync.tasks import context

    from tests.support.tiny_models import build_tiny_drafter

    drafter = context.registry().register_drafter(
        "report-llm", version, build_tiny_drafter(target_dir, drafter_dir, 3), "eagle3", 3, {}, validation_passed=True
    )
    context.store().pairs.record(
        "chat",
        ServedPair(
            target_name="report-llm",
            target_version=version,
            drafter_version=drafter,
            gamma=3,
            drafter_name="report-llm-drafter",
        ),
        endpoint="http://127.0.0.1:9",
        state="serving",
    )
    return drafter


@pytest.fixture
def report_setup(workdir, tmp_path, monkeypatch):
    """A served pair (tiny target v1 + a drafter trained for it) declared as an external deployment."""
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    from tests.support.tiny_models import build_tiny_target

    target_dir = build_tiny_target(tmp_path / "target")
    version = publish_target("report-llm", str(target_dir), {"code": 0.5, "math": 0.5})
    drafter = serve_new_drafter(version, target_dir, tmp_path / "drafter")
    context.registry().promote("report-llm", drafter)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "deployments.yaml").write_text(
        "deployments:\n"
        "  - name: chat\n"
        "    target_name: report-llm\n"
        "    launch: external\n"
        "    endpoint: http://127.0.0.1:9\n"
        "    port: 8000\n"
    )
    store = context.store()
    record_week(store, "chat", ServedPair("report-llm", version, drafter, 3), datetime.now(UTC))
    save_secret_block(BLOCK, PASSWORD)
    return {"workdir": workdir, "target_version": version, "drafter_version": drafter}


def _alert_count() -> int:
    from draftsync.monitors.tables import Alert
    from draftsync.tasks import context
    from sqlalchemy import func, select

    with context.store().transaction() as session:
        return session.scalar(select(func.count()).select_from(Alert)) or 0


def run_report(monkeypatch, *args: str) -> tuple[int, dict | None, str, BaseException | None]:
    from draftsync.cli.app import app
    from draftsync.tasks import context

    context.reset()  # settings are read once per process: the test changes the environment between runs
    out = Path(context.settings().root) / f"report-{len(args)}-{'-'.join(a.strip('-') for a in args)[:40]}.json"
    result = CliRunner().invoke(app, ["report", *args, "--json", str(out)])
    data = json.loads(out.read_text()) if out.exists() else None
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, data, result.output, exception


@pytest.mark.slow
def test_report_command_stale_week_smtp_down_then_delivered(report_setup, monkeypatch, smtp_server_factory, caplog):
    from draftsync.serving.process import free_port
    from draftsync.tasks import context

    caplog.set_level("DEBUG")
    started = datetime.now(UTC) - timedelta(seconds=5)
    port = free_port()
    for key, value in {
        "SMTP_HOST": "127.0.0.1",
        "SMTP_PORT": str(port),
        "SMTP_USER": "reporter",
        "SMTP_PASSWORD_BLOCK": BLOCK,
        "ALERT_TO": "ml-platform@example.org",
    }.items():
        monkeypatch.setenv(f"DRAFTSYNC_{key}", value)
    monkeypatch.delenv("DRAFTSYNC_SMTP_PASSWORD", raising=False)

    # run 1: SMTP is down. The review still acts, and the e-mail waits in the outbox.
    code, first, output, error = run_report(monkeypatch, "--send")
    assert error is None and code == 1, output
    assert (first["sent"], first["status"]) == (False, "pending") and "retried next run" in first["delivery"]
    assert first["week"]["iso"] is None and first["acted"] is True
    (chat,) = first["deployments"]
    assert chat["name"] == "chat" and chat["status"] == "STALE"
    assert 0.55 < chat["acceptance_rate"] < 0.70 and chat["p5"] < 0.5 < 0.6 < chat["p50"] < 0.7
    assert chat["trend_per_day"] == pytest.approx((0.45 - 0.80) / 7, abs=0.004)
    assert [f["rule"] for f in chat["findings"]] == ["stale"]
    assert chat["actions"][:2] == ["fell back to plain decoding (speculation off)", "marked stale"]
    assert chat["actions"][2].startswith("retrain requested (event draftsync.drafter.stale for report-llm v1)")
    assert first["subject"].startswith("[draftsync] STALE: chat acceptance 0.4")
    pair = context.store().pairs.get("chat")
    assert (pair.state, pair.drafter_version) == ("stale", None)  # relaunched with speculation off
    launch = json.loads((report_setup["workdir"] / "serving" / "external" / "chat.json").read_text())
    assert launch["speculative_config"] is None and "--speculative-config" not in launch["argv"]
    (pending,) = context.store().outbox.entries("pending")
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:  # the report's table in the Prefect UI
        table = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["weekly-acceptance-report"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=1,
        )[0]
    (row,) = json.loads(table.data)
    assert (row["deployment"], row["status"], row["findings"]) == ("chat", "STALE", "stale")

    # run 2: SMTP is back; the waiting report goes out first, then this run's, and nothing is repeated.
    seen: list = []
    server = smtp_server_factory(port=port, authenticator=password_check(seen), auth_require_tls=False)
    code, second, output, error = run_report(monkeypatch, "--send")
    assert error is None and code == 0, output
    assert second["retried"] == [{"subject": first["subject"], "status": "sent"}]
    assert second["sent"] is True and second["delivery"] == "sent by SMTP to ml-platform@example.org"
    assert [m["Subject"] for m in server.messages] == [first["subject"], second["subject"]]
    assert set(seen) == {(b"reporter", PASSWORD.encode())}
    delivered = server.messages[0]
    text = delivered.get_body(preferencelist=("plain",)).get_content()
    assert "drafter stale" in text and "fell back to plain decoding" in text and "retrain requested" in text
    (chart,) = [p for p in delivered.walk() if p.get_content_type() == "image/png"]
    assert chart.get_content().startswith(b"\x89PNG")
    assert context.store().outbox.entry(pending.id).status == "sent"
    (chat,) = second["deployments"]
    assert chat["actions"] == ["marked stale", "retrain already requested this week for the same finding: not repeated"]
    assert PASSWORD not in caplog.text and PASSWORD not in output
    version = report_setup["target_version"]
    (event,) = target_events(
        STALE_EVENT, started, "report-llm", version, wanted=1
    )  # the sync trigger went out once, on run 1
    assert event.resource["draftsync.target.name"] == "report-llm"
    assert event.resource["draftsync.target.version"] == str(version)
    assert event.payload["retrain"] is True and event.payload["source"] == "weekly-review"
    job = context.sync_ledger().get("report-llm", version, event.payload["method"])
    assert (job.status, job.source) == ("requested", "weekly-review")

    # run 3: without --act or --send the report only reads, twice alike: no alert, no outbox row, no .eml, no event
    outbox = report_setup["workdir"] / "outbox"
    before = (_alert_count(), len(context.store().outbox.entries()), sorted(outbox.glob("*.eml")))
    for _ in range(2):
        code, third, output, error = run_report(monkeypatch)
        assert error is None and code == 0, output
        assert (third["status"], third["eml_path"], third["acted"]) == ("not written", None, False)
        assert (_alert_count(), len(context.store().outbox.entries()), sorted(outbox.glob("*.eml"))) == before
    (chat,) = third["deployments"]
    assert chat["serving_state"] == "stale" and chat["status"] == "STALE"  # the pair as it is, the week as it was
    assert "serving now" in output and "stale: report-llm" in output and "speculation off" in output
    assert "Lines: stale under 0.50" in output and not output.lstrip().startswith("{")  # a summary, not JSON
    assert Path(third["charts"]["chat"]).read_bytes().startswith(b"\x89PNG") and "chart" in output
    assert len(target_events(STALE_EVENT, started, "report-llm", version, wanted=1)) == 1

    # run 3b: --act writes the e-mail to the outbox folder only, and the JSON says so.
    code, acted, output, error = run_report(monkeypatch, "--act")
    assert error is None and code == 0, output
    assert (acted["sent"], acted["status"]) == (False, "not sent") and "outbox folder only" in acted["delivery"]
    assert Path(acted["eml_path"]).is_file() and Path(acted["eml_path"]).parent == outbox
    assert len(context.store().outbox.entries()) == before[1] and len(server.messages) == 2

    # run 4: a look back at the last complete ISO week takes no action.
    week = last_complete_iso_week(datetime.now(UTC))
    code, fourth, output, error = run_report(monkeypatch, "--week", week)
    assert error is None and code == 0, output
    start = datetime.fromisoformat(fourth["week"]["start"])
    assert fourth["week"]["iso"] == week and start.weekday() == 0 and (start.hour, start.minute) == (0, 0)
    assert datetime.fromisoformat(fourth["week"]["end"]) - start == timedelta(days=7)
    assert fourth["acted"] is False and fourth["deployments"][0]["actions"][0].startswith("none: a look back")


def test_report_command_refuses_bad_input_before_starting_anything(workdir, monkeypatch):
    monkeypatch.delenv("DRAFTSYNC_SMTP_HOST", raising=False)
    for week, expected in [
        ("2026-W54", "not an ISO week"),
        ("2026-45", "not an ISO week"),
        (last_complete_iso_week(datetime.now(UTC) + timedelta(days=14)), "has not ended yet"),
    ]:
        code, data, output, error = run_report(monkeypatch, "--week", week)
        assert isinstance(error, DraftsyncError) and expected in str(error) and data is None, (week, output)
    code, data, output, error = run_report(monkeypatch, "--send")
    assert isinstance(error, DraftsyncError) and "DRAFTSYNC_SMTP_HOST" in str(error)


def test_a_broken_deployments_file_is_reported_not_fatal(workdir, monkeypatch):
    """The e-mail is how the team hears of it: the review goes on and says what it could not do."""
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context

    monkeypatch.delenv("DRAFTSYNC_SMTP_HOST", raising=False)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "deployments.yaml").write_text("deployments:\n  - name: chat\n    target_name: [unclosed\n")
    store = context.store()
    store.pairs.record(
        "chat",
        ServedPair(target_name="report-llm", target_version=1, drafter_version=None, gamma=3, drafter_name=None),
        endpoint="http://127.0.0.1:9",
        state="serving",
    )
    record_week(store, "chat", ServedPair("report-llm", 1, 1, 3), datetime.now(UTC))
    code, report, output, error = run_report(monkeypatch, "--act")
    assert error is None and code == 0, output
    assert any("is not valid YAML" in note and "no deployment was relaunched" in note for note in report["notes"])
    (chat,) = report["deployments"]
    assert chat["status"] == "STALE"
    assert chat["actions"][0].startswith("fallback due, but chat is not in the deployments file")
    from email import message_from_bytes
    from email.policy import default as default_policy

    saved = message_from_bytes(Path(report["eml_path"]).read_bytes(), policy=default_policy)
    assert "is not valid YAML" in saved.get_body(preferencelist=("plain",)).get_content()


@pytest.mark.slow
def test_the_review_judges_the_pair_serving_now_apart_from_the_pair_it_replaced(report_setup, tmp_path):
    """A week that pooled a stale pair with the healthy one that replaced it read as a false alarm about the
    healthy one (the demo's end: 'MISMATCH: acceptance 0.18' beside v2 serving at 0.88)."""
    from draftsync.flows.weekly_report import weekly_report
    from draftsync.monitors.metrics import SpecDecodeCounters
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context

    from tests.support.tiny_models import build_tiny_target

    version, stale = report_setup["target_version"], report_setup["drafter_version"]
    later = datetime.now(UTC) + 6 * HOUR
    before = weekly_report(now=later, act=False, send=False)
    (judged,) = before["deployments"]
    assert any(f["severity"] != "info" for f in judged["findings"]), judged["findings"]  # the falling week alarms

    store = context.store()
    healthy = serve_new_drafter(version, build_tiny_target(tmp_path / "target-again"), tmp_path / "drafter-2")
    pair = ServedPair("report-llm", version, healthy, 3)
    start = later - 6 * HOUR
    for hour in range(6):  # a new server: counters from zero, 0.9 of the drafts accepted
        drafts = 100 * hour
        counters = SpecDecodeCounters(drafts, 3 * drafts, round(2.7 * drafts), (drafts, drafts, round(0.7 * drafts)))
        store.acceptance.record_scrape("chat", start + hour * HOUR, counters, pair)

    after = weekly_report(now=later, act=False, send=False)
    (row,) = after["deployments"]
    assert row["drafter_version"] == healthy and row["acceptance_rate"] == pytest.approx(0.9, abs=0.01)
    assert [f for f in row["findings"] if f["severity"] != "info"] == []
    (replaced,) = row["replaced_pairs"]
    assert (replaced["target_version"], replaced["drafter_version"]) == (version, stale)
    assert 0.45 < replaced["acceptance_rate"] < 0.8
    assert any(f"chat also served t{version} + d{stale} this week" in note for note in after["notes"])


def test_a_declared_deployment_that_served_nothing_is_named_not_skipped(report_setup, monkeypatch):
    """A deployment in the file with no serving record and no samples was left out of the review without a word."""
    workdir = report_setup["workdir"]
    declared = (workdir / "deployments.yaml").read_text()
    (workdir / "deployments.yaml").write_text(
        declared + "  - name: ghost\n    target_name: report-llm\n  - name: orphan\n    target_name: no-such-llm\n"
    )
    code, report, output, error = run_report(monkeypatch)
    assert error is None and code == 0, output
    assert [row["name"] for row in report["deployments"]] == ["chat"]
    (note,) = [note for note in report["notes"] if "ghost" in note]
    assert "served nothing draftsync recorded" in note and "draftsync rollout ghost" in note
    (note,) = [note for note in report["notes"] if "orphan" in note]  # a target MLflow does not hold is named as such
    assert "serves target 'no-such-llm', which MLflow does not hold" in note and "draftsync targets register" in note


def test_the_report_says_which_client_domain_drifted_from_the_captured_requests(report_setup, monkeypatch):
    from draftsync.serving.traffic_capture import TrafficCapture
    from draftsync.tasks.serving import capture_config, configured_deployments

    workdir = report_setup["workdir"]
    declared = (workdir / "deployments.yaml").read_text()
    (workdir / "deployments.yaml").write_text(declared + "    capture: {rate: 1.0}\n")
    hour_ago = datetime.now(UTC).timestamp() - 3600
    capture = TrafficCapture(capture_config(configured_deployments()["chat"]), clock=lambda: hour_ago)
    for index in range(10):
        domain, accepted = ("prose", 3 + index % 3) if index < 6 else ("code", 25 + index % 3)
        answer = json.dumps(
            {"metrics": {"speculative_decoding": {"num_draft_tokens": 30, "num_accepted_draft_tokens": accepted}}}
        ).encode()
        body = json.dumps({"model": "m", "prompt": f"request {index}"}).encode()
        capture.offer("/v1/completions", {"X-Draftsync-Domain": domain}, body, 200, answer)
    capture.flush()
    # the scrape books them into the monitor store, at its clock, to the pair serving then; the report reads them there
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import book_captured_requests

    config, pair = capture_config(configured_deployments()["chat"]), context.store().pairs.get("chat")
    assert book_captured_requests("chat", datetime.now(UTC) - timedelta(hours=1), config, pair) == 10
    assert book_captured_requests("chat", datetime.now(UTC) - timedelta(minutes=30), config, pair) == 0  # once
    code, report, output, error = run_report(monkeypatch)
    assert error is None and code == 0, output
    (row,) = report["deployments"]
    prose, code_domain = row["domains"]  # worst first
    assert (prose["domain"], prose["requests"], prose["share"]) == ("prose", 6, 0.6)
    assert prose["acceptance_rate"] == pytest.approx(24 / 180) and prose["p50"] == pytest.approx(4 / 30)
    assert (code_domain["domain"], code_domain["share"]) == ("code", 0.4) and code_domain["acceptance_rate"] > 0.8
    (note,) = [note for note in report["notes"] if "by client domain" in note]
    assert note.startswith("chat by client domain, over its captured requests: prose 0.13 (P5 0.10, P50 0.13) on 60%")
