"""The webhook receiver under abuse, over real HTTP, with the real handler, the real registry (MLflow on SQLite) and
the real sync ledger: every answer is a 4xx MLflow does not retry or a 200 "ignored" with its reason, and nothing is
recorded."""

from __future__ import annotations

import json
import socket
import time
import uuid
from urllib.parse import urlsplit

import httpx
import pytest
from draftsync.receiver.app import WEBHOOK_PATH, create_app
from draftsync.registry.webhooks import sign_delivery

from tests.support.servers import serve_asgi_in_thread

pytestmark = pytest.mark.slow

SECRET = "abuse-secret-" + "y" * 24
TARGET = "abuse-llm"


@pytest.fixture
def receiver(workdir, built_targets):
    """The receiver as `draftsync webhooks serve` builds it, over a registry holding version 1 of a target."""
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.sync_requests import handle_registry_change

    publish_target(TARGET, str(built_targets[1]), {"code": 1.0})
    ledger = context.sync_ledger()
    app = create_app(
        SECRET,
        on_change=handle_registry_change,
        remember_delivery=ledger.remember_delivery,
        forget_delivery=ledger.forget_delivery,
        read_timeout_s=1.0,
    )
    with serve_asgi_in_thread(app) as url:
        yield url + WEBHOOK_PATH


def _envelope(data: dict, entity: str = "model_version", action: str = "created") -> bytes:
    return json.dumps({"entity": entity, "action": action, "timestamp": "2026-12-05T00:00:00Z", "data": data}).encode()


def _deliver(url: str, body: bytes) -> httpx.Response:
    return httpx.post(url, content=body, headers=sign_delivery(SECRET, str(uuid.uuid4()), int(time.time()), body))


def _nothing_recorded() -> None:
    from draftsync.tasks import context

    assert context.sync_ledger().jobs() == []


FORGED_TAGS = {"draftsync.kind": "target"}
IGNORED = {
    "a version MLflow does not hold": {"name": TARGET, "version": "999999999", "tags": FORGED_TAGS},
    "a version beyond any store (10**30)": {"name": TARGET, "version": 10**30, "tags": FORGED_TAGS},
    "a model MLflow does not hold": {"name": "never-registered", "version": "1", "tags": FORGED_TAGS},
    "a name with '/'": {"name": "acme/llm", "version": "1", "tags": FORGED_TAGS},
    "a name of 10,000 characters": {"name": "m" * 10_000, "version": "1", "tags": FORGED_TAGS},
    "a name with a NUL": {"name": "abuse\x00llm", "version": "1", "tags": FORGED_TAGS},
    "a name that is a path": {"name": "../abuse-llm", "version": "1", "tags": FORGED_TAGS},
    "a name ending in a newline": {"name": TARGET + "\n", "version": "1", "tags": FORGED_TAGS},
    "a name longer than the ledger holds": {"name": "m" * 201, "version": "1", "tags": FORGED_TAGS},
}


@pytest.mark.parametrize("data", IGNORED.values(), ids=IGNORED.keys())
def test_a_signed_delivery_naming_what_mlflow_does_not_hold_is_ignored_with_its_reason(receiver, data):
    answer = _deliver(receiver, _envelope(data))
    assert answer.status_code == 200
    assert answer.json()["action"].startswith("ignored: ")
    assert len(answer.text) < 1000  # the answer does not echo a huge name back
    _nothing_recorded()


def test_an_alias_moved_to_a_missing_version_is_ignored(receiver):
    body = _envelope({"name": TARGET, "version": "42", "alias": "production"}, entity="model_version_alias")
    answer = _deliver(receiver, body)
    assert (answer.status_code, answer.json()["action"]) == (200, f"ignored: MLflow holds no version 42 of {TARGET}")
    _nothing_recorded()


REFUSED = {
    "JSON nested 3,000 deep": b"[" * 3000 + b"]" * 3000,
    "nesting inside the data": _envelope({"name": TARGET, "version": "1"})[:-2] + b', "x": ' + b"{" * 3000,
    "a version of 1e308": _envelope({"name": TARGET, "version": 1e308}),
    "a version of 10**30 as text": _envelope({"name": TARGET, "version": str(10**30)}),
    "a version of -1": _envelope({"name": TARGET, "version": -1}),
    "a version of true": _envelope({"name": TARGET, "version": True}),
    "tags that are not strings": _envelope({"name": TARGET, "version": "1", "tags": {"draftsync.kind": ["target"]}}),
}


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_a_malformed_signed_body_is_a_bad_request(receiver, body):
    answer = _deliver(receiver, body)
    assert (answer.status_code, answer.json()["reason"]) == (400, "bad_body")
    _nothing_recorded()


def test_a_body_that_never_finishes_is_refused_when_its_time_is_up(receiver):
    """A sender that promises 1,000 bytes and sends 10 holds the connection for the read timeout, not for ever."""
    body = _envelope({"name": TARGET, "version": "1"})
    headers = sign_delivery(SECRET, str(uuid.uuid4()), int(time.time()), body)
    head = f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in headers.items()) + "\r\n"
    parts = urlsplit(receiver)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(head.encode() + body[:10])
        started = time.monotonic()
        answer = connection.recv(65536)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408")
    assert waited < 20  # the read timeout is 1 s; without one recv() times out at 30 s
    _nothing_recorded()


def test_the_same_delivery_for_a_real_version_is_acted_on(receiver):
    """The control: the receiver built this way does record a real target version's sync."""
    from draftsync.tasks import context

    answer = _deliver(receiver, _envelope({"name": TARGET, "version": "1"}))
    assert (answer.status_code, answer.json()["action"]) == (200, "sync requested")
    assert [(job.target_name, job.target_version) for job in context.sync_ledger().jobs()] == [(TARGET, 1)]
