"""Links people open: where draftsync reaches MLflow and Prefect by names only the stack resolves (http://mlflow:5000,
http://prefect:4200), the e-mails it sends link to DRAFTSYNC_MLFLOW_UI_URL and DRAFTSYNC_PREFECT_UI_URL. The weekly
report and an alert go through a real SMTP server (aiosmtpd) from real flow runs (Prefect's test harness)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tests.integration.cli.test_weekly_report_cli import record_week

MLFLOW_UI = "https://mlflow.example.org"
PREFECT_UI = "https://prefect.example.org"
INSIDE_THE_STACK = ("mlflow:5000", "prefect:4200")


@pytest.fixture
def stack_addresses(workdir, monkeypatch, smtp_server):
    """The compose stack's addresses for the services, the UI addresses people open, and SMTP on loopback."""
    from draftsync.tasks import context

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("PREFECT_UI_URL", "http://prefect:4200")  # what the stack's services are told
    monkeypatch.setenv("DRAFTSYNC_MLFLOW_UI_URL", MLFLOW_UI + "/")
    monkeypatch.setenv("DRAFTSYNC_PREFECT_UI_URL", PREFECT_UI)
    monkeypatch.setenv("DRAFTSYNC_SMTP_HOST", smtp_server.host)
    monkeypatch.setenv("DRAFTSYNC_SMTP_PORT", str(smtp_server.port))
    monkeypatch.setenv("DRAFTSYNC_ALERT_TO", "team@example.org")
    for key in ("DRAFTSYNC_SMTP_USER", "DRAFTSYNC_SMTP_PASSWORD", "DRAFTSYNC_SMTP_PASSWORD_BLOCK"):
        monkeypatch.delenv(key, raising=False)
    context.reset()
    return smtp_server


def bodies(message) -> tuple[str, str]:
    return (
        message.get_body(preferencelist=("plain",)).get_content(),
        message.get_body(preferencelist=("html",)).get_content() if message.is_multipart() else "",
    )


@pytest.mark.slow
def test_the_weekly_e_mail_links_to_the_ui_addresses(stack_addresses):
    from draftsync.flows.weekly_report import weekly_report
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context

    # speculation off: the review reads no drafter's lineage, so MLflow at its in-stack address is never called
    pair = ServedPair("report-llm", 1, None, 0)
    context.store().pairs.record("chat", pair, endpoint="http://127.0.0.1:9", state="fallback")
    record_week(context.store(), "chat", pair, datetime.now(UTC))
    result = weekly_report(act=False, send=True)  # written and sent, nothing acted on
    assert result["sent"] is True, result["delivery"]
    (message,) = stack_addresses.messages
    for body in bodies(message):
        assert f"{MLFLOW_UI}/#/models/report-llm-drafter?workflowType=machine_learning" in body
        assert f"{PREFECT_UI}/runs" in body
        assert not any(inside in body for inside in INSIDE_THE_STACK), body


@pytest.mark.slow
def test_an_alert_links_to_its_flow_run_in_the_prefect_ui(stack_addresses):
    """An alert's link to the run that raised it is that run's page in the Prefect UI people open."""
    from draftsync.tasks.alerts import send_alert
    from prefect import flow
    from prefect.runtime import flow_run

    @flow(name="alerting-flow")
    def alerting() -> str:
        send_alert("chat", "ui-links", "chat fell back", "chat fell back.")
        return flow_run.id

    run_id = alerting()
    (message,) = stack_addresses.messages
    text, _ = bodies(message)
    assert f"The flow run that sent this: {PREFECT_UI}/runs/flow-run/{run_id}" in text
    assert not any(inside in text for inside in INSIDE_THE_STACK), text


def test_without_ui_addresses_the_links_follow_the_tracking_server_and_prefect(workdir, monkeypatch):
    """Unset, the UI is the tracking server (never with the credentials its URI may hold) and Prefect's own UI URL."""
    from draftsync.tasks import context, links

    for key in ("DRAFTSYNC_MLFLOW_UI_URL", "DRAFTSYNC_PREFECT_UI_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://bot:s3cret@mlflow.internal:5443/?token=t0k")
    monkeypatch.setenv("PREFECT_UI_URL", "https://prefect.internal/")
    context.reset()
    assert (
        links.model_version_url("m", 2)
        == "https://mlflow.internal:5443/#/models/m/versions/2" + links.MODEL_TRAINING_VIEW
    )
    assert links.flow_run_url("abc") == "https://prefect.internal/runs/flow-run/abc"
    assert links.current_run_url() == "https://prefect.internal/runs"  # outside a run: the runs list
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlflow.db'}")
    context.reset()
    assert links.mlflow_ui() == links.LOCAL_MLFLOW_UI  # an embedded registry: `mlflow ui` on this machine
