"""`draftsync webhooks register` against real `mlflow server` processes: a default server refuses the one-machine
receiver URL (http, loopback) and the error names the two variables the server needs; a server started with them
takes it. And the secret is required by both webhook commands, before anything starts."""

from __future__ import annotations

import os

import pytest
from draftsync.cli.webhooks import webhooks_app
from draftsync.errors import DraftsyncError
from draftsync.registry.webhooks import MLFLOW_SERVER_WEBHOOK_ENV
from typer.testing import CliRunner

from tests.support.servers import mlflow_server

SECRET = "registration-secret-" + "y" * 24
RECEIVER = "127.0.0.1:8765/mlflow/webhook"
# MLflow 3's own defaults, spelled out: tests/support/servers.py starts every server with webhooks allowed otherwise.
MLFLOW_DEFAULTS = {"MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "https", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "false"}
BOTH_VARIABLES = "MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https and MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true"


@pytest.fixture
def command_environment(tmp_path):
    """The CLI applies work-dir defaults to os.environ; put everything back afterwards."""
    from draftsync.tasks import context

    saved = dict(os.environ)
    for key in ("DRAFTSYNC_WEBHOOK_SECRET", "DRAFTSYNC_WEBHOOK_SECRET_BLOCK", "DRAFTSYNC_ENV_FILE"):
        os.environ.pop(key, None)
    os.environ["DRAFTSYNC_WORKDIR"] = str(tmp_path / "work")
    context.reset()
    yield tmp_path
    context.reset()
    os.environ.clear()
    os.environ.update(saved)


def register(tracking_uri: str, url: str):
    from draftsync.tasks import context

    os.environ.update({"MLFLOW_TRACKING_URI": tracking_uri, "DRAFTSYNC_WEBHOOK_SECRET": SECRET})
    context.reset()
    return CliRunner().invoke(webhooks_app, ["register", "--url", url, "--name", "one-machine"])


@pytest.mark.slow
def test_a_default_mlflow_server_refuses_the_receiver_and_the_error_names_what_it_needs(command_environment):
    with mlflow_server(command_environment, env=MLFLOW_DEFAULTS) as server:
        plain = register(server.url, f"http://{RECEIVER}")
        loopback = register(server.url, f"https://{RECEIVER}")
    assert isinstance(plain.exception, DraftsyncError), plain.output
    assert f"refuses webhook URL http://{RECEIVER}: it allows only https" in plain.exception.what
    assert "MLFLOW_WEBHOOK_ALLOWED_SCHEMES" in plain.exception.what
    assert isinstance(loopback.exception, DraftsyncError), loopback.output
    assert "resolves to a private or loopback address" in loopback.exception.what
    assert "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true" in loopback.exception.what
    for refused in (plain, loopback):
        assert BOTH_VARIABLES in refused.exception.fix and "`mlflow server`" in refused.exception.fix
        assert SECRET not in str(refused.exception)


@pytest.mark.slow
def test_an_mlflow_server_started_with_the_two_variables_takes_the_receiver(command_environment):
    assert MLFLOW_SERVER_WEBHOOK_ENV == dict(v.split("=") for v in BOTH_VARIABLES.split(" and "))
    with mlflow_server(command_environment, env={**MLFLOW_DEFAULTS, **MLFLOW_SERVER_WEBHOOK_ENV}) as server:
        taken = register(server.url, f"http://{RECEIVER}")
        assert taken.exit_code == 0, taken.output
        from mlflow import MlflowClient

        (webhook,) = [w for w in MlflowClient(tracking_uri=server.url).list_webhooks() if w.name == "one-machine"]
    assert webhook.url == f"http://{RECEIVER}" and webhook.webhook_id == taken.stdout.strip()


@pytest.mark.parametrize("command", ["register", "serve"])
def test_both_webhook_commands_require_the_secret(command_environment, command):
    """Nothing is registered or served unsigned: the error names both ways to give the secret."""
    from draftsync.serving.process import free_port

    os.environ["MLFLOW_TRACKING_URI"] = "http://127.0.0.1:1"  # never reached: the secret is checked first
    options = ["--url", f"http://{RECEIVER}"] if command == "register" else ["--port", str(free_port())]
    result = CliRunner().invoke(webhooks_app, [command, *options])
    assert isinstance(result.exception, DraftsyncError), result.output
    assert "webhook secret" in result.exception.what and "required" in result.exception.what
    assert "DRAFTSYNC_WEBHOOK_SECRET" in result.exception.fix
    assert "DRAFTSYNC_WEBHOOK_SECRET_BLOCK" in result.exception.fix
