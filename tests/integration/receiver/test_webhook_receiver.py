"""The webhook receiver over real HTTP (uvicorn on loopback), and end to end from a real `mlflow server`."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import pytest
from draftsync.cli.webhooks import webhooks_app
from draftsync.errors import DraftsyncError
from draftsync.receiver.app import HEALTH_PATH, WEBHOOK_PATH, create_app, resolve_webhook_secret
from draftsync.registry.webhooks import RegistryChange, create_or_update_webhook
from mlflow.webhooks.delivery import _generate_hmac_signature
from typer.testing import CliRunner

from tests.support.servers import mlflow_server, serve_asgi_in_thread

SECRET = "receiver-secret-" + "x" * 24
SMALL_BODY_LIMIT = 4096
DELIVERY_WAIT_SECONDS = 30


@dataclass
class DeliveryMemory:
    """An in-memory stand-in for the sync ledger's delivery table (same contract: False for a seen id)."""

    seen: dict[str, datetime] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unavailable: bool = False

    def __call__(self, delivery_id: str, now: datetime) -> bool:
        if self.unavailable:
            raise ConnectionError("database is down")
        with self.lock:
            if delivery_id in self.seen:
                return False
            self.seen[delivery_id] = now
            return True


@dataclass
class ChangeRecorder:
    """Records every change the receiver acts on; answers like a sync request would."""

    changes: list[tuple[RegistryChange, str]] = field(default_factory=list)
    fail: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, change: RegistryChange, delivery_id: str) -> dict:
        if self.fail:
            raise RuntimeError(f"store unavailable (secret is {SECRET})")
        with self.lock:
            self.changes.append((change, delivery_id))
        return {
            "sync_requested": True,
            "target_name": change.model_name,
            "target_version": change.version,
            "at": datetime(2026, 1, 1, tzinfo=UTC),
        }


@dataclass
class Receiver:
    url: str
    memory: DeliveryMemory
    recorder: ChangeRecorder

    @property
    def webhook_url(self) -> str:
        return self.url + WEBHOOK_PATH


@pytest.fixture
def receiver():
    memory, recorder = DeliveryMemory(), ChangeRecorder()
    app = create_app(SECRET, on_change=recorder, remember_delivery=memory, max_body_bytes=SMALL_BODY_LIMIT)
    with serve_asgi_in_thread(app) as url:
        yield Receiver(url, memory, recorder)


def version_created_body(name: str = "tiny-llama", version: str = "2") -> bytes:
    """The body MLflow sends for a new model version (same envelope and json.dumps as its delivery code)."""
    envelope = {
        "entity": "model_version",
        "action": "created",
        "timestamp": datetime.now(UTC).isoformat(),
        "data": {
            "name": name,
            "version": version,
            "source": "s3://models/tiny-llama/2",
            "run_id": None,
            "tags": {"draftsync.kind": "target"},
            "description": None,
        },
    }
    return json.dumps(envelope).encode("utf-8")


def signed(body: bytes, secret: str = SECRET, timestamp: int | None = None, delivery_id: str | None = None) -> dict:
    """Headers as MLflow signs them (its own signer)."""
    delivery_id = delivery_id or str(uuid.uuid4())
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        "X-MLflow-Delivery-Id": delivery_id,
        "X-MLflow-Timestamp": str(timestamp),
        "X-MLflow-Signature": _generate_hmac_signature(secret, delivery_id, str(timestamp), body.decode()),
    }


def post(receiver: Receiver, body: bytes, headers: dict) -> httpx.Response:
    return httpx.post(receiver.webhook_url, content=body, headers=headers, timeout=30)


def raw_exchange(url: str, head: bytes, first_body_bytes: bytes = b"") -> bytes:
    """Send request headers (and maybe part of a body) on a raw socket, then read the answer.

    The body is never finished: an answer proves the server decided without waiting for the rest.
    """
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(head + first_body_bytes)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer


# --- the receiver over HTTP -----------------------------------------------------------------------
def test_health(receiver):
    answer = httpx.get(receiver.url + HEALTH_PATH, timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}


def test_valid_delivery_sent_twice_acts_once(receiver):
    body = version_created_body()
    headers = signed(body)
    first = post(receiver, body, headers)
    assert first.status_code == 200, first.text
    assert first.json()["sync_requested"] is True
    assert first.json()["at"].startswith("2026-01-01")
    second = post(receiver, body, headers)
    assert second.status_code == 409
    assert second.json()["error"] == "replayed delivery"
    assert len(receiver.recorder.changes) == 1
    change, delivery_id = receiver.recorder.changes[0]
    assert change == RegistryChange("version_created", "tiny-llama", 2, None, {"draftsync.kind": "target"})
    assert delivery_id == headers["X-MLflow-Delivery-Id"]
    assert list(receiver.memory.seen) == [delivery_id]


def test_concurrent_copies_of_one_delivery_act_once(receiver):
    body = version_created_body()
    headers = signed(body)
    with httpx.Client(timeout=30) as client:
        statuses: list[int] = []

        def send() -> None:
            statuses.append(client.post(receiver.webhook_url, content=body, headers=headers).status_code)

        threads = [threading.Thread(target=send) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert sorted(statuses) == [200] + [409] * 7
    assert len(receiver.recorder.changes) == 1


def test_unavailable_delivery_memory_answers_503_and_the_retry_goes_through(receiver):
    """503 is a status MLflow retries; the id was not recorded, so the retry is not taken for a replay."""
    body = version_created_body()
    headers = signed(body)
    receiver.memory.unavailable = True
    answer = post(receiver, body, headers)
    assert (answer.status_code, answer.json()["reason"]) == (503, "delivery_memory_unavailable")
    assert receiver.recorder.changes == []
    receiver.memory.unavailable = False
    assert post(receiver, body, headers).status_code == 200
    assert len(receiver.recorder.changes) == 1


def test_forged_signature_is_unauthorized_and_not_remembered(receiver):
    body = version_created_body()
    forged = signed(body, secret="guessed-secret")
    answer = post(receiver, body, forged)
    assert answer.status_code == 401
    assert answer.json()["reason"] == "bad_signature"
    assert receiver.memory.seen == {}  # a forged delivery cannot burn a real delivery id
    assert receiver.recorder.changes == []
    genuine = post(receiver, body, signed(body, delivery_id=forged["X-MLflow-Delivery-Id"]))
    assert genuine.status_code == 200


def test_missing_signature_is_unauthorized(receiver):
    body = version_created_body()
    headers = signed(body)
    del headers["X-MLflow-Signature"]
    answer = post(receiver, body, headers)
    assert (answer.status_code, answer.json()["reason"]) == (401, "missing_header")


def test_old_and_future_timestamps_are_bad_requests(receiver):
    body = version_created_body()
    old = post(receiver, body, signed(body, timestamp=int(time.time()) - 3600))
    assert (old.status_code, old.json()["reason"]) == (400, "stale_timestamp")
    future = post(receiver, body, signed(body, timestamp=int(time.time()) + 3600))
    assert (future.status_code, future.json()["reason"]) == (400, "future_timestamp")
    assert receiver.recorder.changes == []


def test_body_that_is_not_json_is_a_bad_request(receiver):
    body = b"<xml>not json</xml>"
    answer = post(receiver, body, signed(body))
    assert (answer.status_code, answer.json()["reason"]) == (400, "bad_body")
    assert receiver.recorder.changes == []


def test_oversized_body_is_refused_by_content_length(receiver):
    body = b"{" + b" " * (SMALL_BODY_LIMIT * 4) + b"}"
    answer = post(receiver, body, signed(body))
    assert answer.status_code == 413
    assert receiver.memory.seen == {}


def test_oversized_streamed_body_is_refused_while_reading(receiver):
    """No Content-Length (chunked): the receiver counts as it reads."""
    body = b"{" + b" " * (SMALL_BODY_LIMIT * 4) + b"}"

    def chunks():
        for start in range(0, len(body), 1024):
            yield body[start : start + 1024]

    answer = httpx.post(receiver.webhook_url, content=chunks(), headers=signed(body), timeout=30)
    assert answer.status_code == 413


def test_oversized_body_is_refused_before_it_is_read(receiver):
    """Headers promising a huge body, none of it sent: the 413 comes anyway, so nothing waited for the body."""
    head = (
        f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {1 << 30}\r\n\r\n"
    ).encode()
    assert raw_exchange(receiver.url, head).startswith(b"HTTP/1.1 413")


def test_oversized_chunked_body_is_refused_before_it_ends(receiver):
    chunk = b" " * (SMALL_BODY_LIMIT + 1)
    head = (
        f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    first = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # the terminating 0-chunk never comes
    assert raw_exchange(receiver.url, head, first).startswith(b"HTTP/1.1 413")


def test_default_limit_is_one_mebibyte():
    app = create_app(SECRET, on_change=ChangeRecorder(), remember_delivery=DeliveryMemory())
    with serve_asgi_in_thread(app) as url:

        def head(length: int) -> bytes:
            return f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: test\r\nContent-Length: {length}\r\n\r\n".encode()

        assert raw_exchange(url, head((1 << 20) + 1)).startswith(b"HTTP/1.1 413")
        body = b" " * (1 << 20)  # exactly the limit: read, then refused for its missing signature
        answer = httpx.post(url + WEBHOOK_PATH, content=body, timeout=30)
        assert answer.status_code == 401


def test_other_events_are_acknowledged_and_ignored(receiver):
    body = json.dumps(
        {
            "entity": "model_version_tag",
            "action": "set",
            "timestamp": "t",
            "data": {"name": "m", "version": "1", "key": "k", "value": "v"},
        }
    ).encode()
    answer = post(receiver, body, signed(body))
    assert answer.status_code == 200
    assert answer.json() == {"ignored": "model_version_tag.set"}
    assert receiver.recorder.changes == []


def test_failing_handler_answers_500_without_details(receiver, caplog):
    caplog.set_level(logging.INFO, logger="draftsync.webhooks")
    receiver.recorder.fail = True
    body = version_created_body()
    answer = post(receiver, body, signed(body))
    assert answer.status_code == 500
    assert answer.json()["error"] == "handler_failed"
    assert SECRET not in answer.text
    assert "handler_failed" in caplog.text
    assert SECRET not in caplog.text


def test_refusals_are_logged_with_reason_and_delivery_but_never_secrets(receiver, caplog):
    caplog.set_level(logging.INFO, logger="draftsync.webhooks")
    body = version_created_body(name="secret-free-model-name")
    forged = signed(body, secret="guessed-secret")
    old = signed(body, timestamp=int(time.time()) - 3600)
    valid = signed(body)
    post(receiver, body, forged)
    post(receiver, body, old)
    post(receiver, body, valid)
    post(receiver, body, valid)
    post(receiver, b"not json", signed(b"not json"))
    refusals = [r for r in caplog.records if r.name == "draftsync.webhooks" and "refused" in r.getMessage()]
    assert len(refusals) == 4
    text = "\n".join(record.getMessage() for record in refusals)
    for reason in ("bad_signature", "stale_timestamp", "replayed", "bad_body"):
        assert f"reason={reason}" in text
    assert forged["X-MLflow-Delivery-Id"] in text
    assert "client=127.0.0.1:" in text
    everything = caplog.text
    assert SECRET not in everything
    for headers in (forged, old, valid):
        signature = headers["X-MLflow-Signature"]
        assert signature not in everything and signature.split(",", 1)[1] not in everything
    assert "secret-free-model-name" not in text  # no body content in refusal lines


def test_the_app_needs_a_secret_and_sane_limits():
    with pytest.raises(DraftsyncError, match="no secret"):
        create_app("", on_change=ChangeRecorder(), remember_delivery=DeliveryMemory())
    with pytest.raises(DraftsyncError, match="1 characters, fewer than the 16"):
        create_app("x", on_change=ChangeRecorder(), remember_delivery=DeliveryMemory())
    for limits in ({"max_body_bytes": 0}, {"max_age_s": -1}, {"read_timeout_s": 0.0}, {"read_timeout_s": float("nan")}):
        with pytest.raises(DraftsyncError, match="not all positive"):
            create_app(SECRET, on_change=ChangeRecorder(), remember_delivery=DeliveryMemory(), **limits)


# --- the secret from settings ---------------------------------------------------------------------
def test_secret_comes_from_the_settings_environment(monkeypatch):
    from draftsync.settings import Settings

    monkeypatch.delenv("DRAFTSYNC_WEBHOOK_SECRET", raising=False)
    monkeypatch.delenv("DRAFTSYNC_WEBHOOK_SECRET_BLOCK", raising=False)
    with pytest.raises(DraftsyncError) as caught:
        resolve_webhook_secret(Settings())
    assert "DRAFTSYNC_WEBHOOK_SECRET" in caught.value.fix
    monkeypatch.setenv("DRAFTSYNC_WEBHOOK_SECRET", "from-env")
    assert resolve_webhook_secret(Settings()) == "from-env"
    assert "from-env" not in repr(Settings())  # a SecretStr: never printed with the settings


@pytest.mark.slow
def test_secret_from_a_prefect_secret_block(prefect_harness, monkeypatch):
    from draftsync.settings import Settings
    from prefect.blocks.system import Secret

    monkeypatch.delenv("DRAFTSYNC_WEBHOOK_SECRET", raising=False)
    block_name = f"webhook-secret-{uuid.uuid4().hex[:8]}"
    Secret(value="from-a-block").save(block_name)
    monkeypatch.setenv("DRAFTSYNC_WEBHOOK_SECRET_BLOCK", block_name)
    assert resolve_webhook_secret(Settings()) == "from-a-block"
    monkeypatch.setenv("DRAFTSYNC_WEBHOOK_SECRET_BLOCK", "no-such-block")
    with pytest.raises(DraftsyncError) as caught:
        resolve_webhook_secret(Settings())
    assert "no-such-block" in caught.value.what


# --- end to end from a real MLflow server ---------------------------------------------------------
@pytest.fixture(scope="module")
def mlflow(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server


def wait_for_changes(recorder: ChangeRecorder, count: int) -> list[RegistryChange]:
    """MLflow delivers from a thread pool after answering the API call: poll for the deliveries."""
    deadline = time.monotonic() + DELIVERY_WAIT_SECONDS
    while len(recorder.changes) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return [change for change, _ in recorder.changes]


@pytest.mark.slow
def test_mlflow_server_deliveries_start_exactly_one_change_each(mlflow, receiver):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow.url, registry_uri=mlflow.url)
    first_id = create_or_update_webhook(mlflow.url, "draftsync-e2e", receiver.url + "/moved-away", SECRET)
    second_id = create_or_update_webhook(mlflow.url, "draftsync-e2e", receiver.webhook_url, SECRET)
    assert second_id == first_id
    named = [webhook for webhook in client.list_webhooks() if webhook.name == "draftsync-e2e"]
    assert len(named) == 1
    assert named[0].url == receiver.webhook_url
    assert sorted(str(event) for event in named[0].events) == ["model_version.created", "model_version_alias.created"]

    client.create_registered_model("e2e-target")
    version = client.create_model_version(
        "e2e-target", "s3://draftsync-test/e2e-target/1", tags={"draftsync.kind": "target"}
    )
    client.set_registered_model_alias("e2e-target", "production", version.version)

    assert len(wait_for_changes(receiver.recorder, 2)) >= 2, f"MLflow delivered too little; log: {mlflow.log_path}"
    time.sleep(1.0)  # a duplicate delivery (a second webhook, a retry) would land within this second
    changes = [change for change, _ in receiver.recorder.changes]
    assert sorted(changes, key=lambda change: change.kind) == [
        RegistryChange("alias_moved", "e2e-target", int(version.version), "production", {}),
        RegistryChange("version_created", "e2e-target", int(version.version), None, {"draftsync.kind": "target"}),
    ], f"receiver saw {changes}; MLflow log: {mlflow.log_path}"
    assert len(receiver.memory.seen) == 2


@pytest.fixture
def isolated_environment(tmp_path):
    """The CLI applies work-dir defaults to os.environ; put everything back afterwards."""
    from draftsync.tasks import context

    saved = dict(os.environ)
    context.reset()
    yield tmp_path / "work"
    context.reset()
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.slow
def test_register_command_is_idempotent_and_never_prints_the_secret(mlflow, isolated_environment):
    os.environ.update(
        {
            "DRAFTSYNC_WORKDIR": str(isolated_environment),
            "MLFLOW_TRACKING_URI": mlflow.url,
            "DRAFTSYNC_WEBHOOK_SECRET": SECRET,
        }
    )
    os.environ.pop("DRAFTSYNC_WEBHOOK_SECRET_BLOCK", None)
    runner = CliRunner()
    url = "http://127.0.0.1:8765/mlflow/webhook"
    json_path = isolated_environment / "register.json"
    first = runner.invoke(webhooks_app, ["register", "--url", url, "--name", "draftsync-cli", "--json", str(json_path)])
    assert first.exit_code == 0, first.output
    second = runner.invoke(webhooks_app, ["register", "--url", url, "--name", "draftsync-cli"])
    assert second.exit_code == 0, second.output
    assert first.stdout.strip() == second.stdout.strip() == json.loads(json_path.read_text())["webhook_id"]
    assert SECRET not in first.output + second.output + json_path.read_text()
    from mlflow import MlflowClient

    named = [w for w in MlflowClient(tracking_uri=mlflow.url).list_webhooks() if w.name == "draftsync-cli"]
    assert [w.webhook_id for w in named] == [first.stdout.strip()]


def test_register_without_a_secret_says_how_to_set_one(isolated_environment):
    os.environ.update({"DRAFTSYNC_WORKDIR": str(isolated_environment), "MLFLOW_TRACKING_URI": "http://127.0.0.1:1"})
    for key in ("DRAFTSYNC_WEBHOOK_SECRET", "DRAFTSYNC_WEBHOOK_SECRET_BLOCK"):
        os.environ.pop(key, None)
    result = CliRunner().invoke(webhooks_app, ["register", "--url", "http://127.0.0.1:8765/mlflow/webhook"])
    assert result.exit_code != 0
    assert isinstance(result.exception, DraftsyncError)
    assert "DRAFTSYNC_WEBHOOK_SECRET" in result.exception.fix


@pytest.mark.parametrize("command", ["serve", "register"])
def test_commands_have_help(command):
    result = CliRunner().invoke(webhooks_app, [command, "--help"])
    assert result.exit_code == 0
    expected_option = "--port" if command == "serve" else "--url"
    assert expected_option in result.output


def test_serve_on_a_port_in_use_or_an_address_not_here_is_one_error(isolated_environment):
    """uvicorn logged its own error and exited 3; the check runs before the receiver or Prefect starts."""
    os.environ.update({"DRAFTSYNC_WORKDIR": str(isolated_environment), "DRAFTSYNC_WEBHOOK_SECRET": SECRET})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = CliRunner().invoke(webhooks_app, ["serve", "--port", str(port)])
    assert isinstance(in_use.exception, DraftsyncError), in_use.output
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in in_use.exception.what
    elsewhere = CliRunner().invoke(webhooks_app, ["serve", "--host", "203.0.113.7", "--port", "8765"])
    assert isinstance(elsewhere.exception, DraftsyncError), elsewhere.output
    assert "cannot listen on 203.0.113.7:8765" in elsewhere.exception.what and "--host" in elsewhere.exception.fix
