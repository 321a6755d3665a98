"""Webhook verification and parsing against MLflow's own signer and example payloads (no server needed)."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from datetime import UTC, datetime

import pytest
from draftsync.errors import DraftsyncError
from draftsync.registry.webhooks import (
    BAD_BODY,
    BAD_DELIVERY_ID,
    BAD_SIGNATURE,
    BAD_SIGNATURE_FORMAT,
    BAD_TIMESTAMP,
    FUTURE_TIMESTAMP,
    MISSING_HEADER,
    STALE_TIMESTAMP,
    RegistryChange,
    WebhookRejected,
    create_or_update_webhook,
    parse_delivery,
    sign_delivery,
    verify_delivery,
)
from mlflow.entities.webhook import WebhookEvent
from mlflow.webhooks.delivery import _generate_hmac_signature
from mlflow.webhooks.types import get_example_payload_for_event

SECRET = "s3cret-" + "k" * 24
MAX_AGE = 300


def mlflow_body(event: str, data: dict | None = None) -> bytes:
    """A body exactly as MLflow's delivery code builds it (json.dumps of the envelope)."""
    payload = data if data is not None else get_example_payload_for_event(WebhookEvent.from_str(event))
    entity, action = event.split(".")
    envelope = {"entity": entity, "action": action, "timestamp": datetime.now(UTC).isoformat(), "data": payload}
    return json.dumps(envelope).encode("utf-8")


def mlflow_headers(
    body: bytes, secret: str = SECRET, timestamp: int | None = None, delivery_id: str | None = None
) -> dict[str, str]:
    """Headers signed by MLflow's own implementation, so the test does not share our code's assumptions."""
    delivery_id = delivery_id or str(uuid.uuid4())
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        "X-MLflow-Delivery-Id": delivery_id,
        "X-MLflow-Timestamp": str(timestamp),
        "X-MLflow-Signature": _generate_hmac_signature(secret, delivery_id, str(timestamp), body.decode("utf-8")),
    }


def rejection(headers: dict[str, str], body: bytes, now: float | None = None, secret: str = SECRET) -> str:
    with pytest.raises(WebhookRejected) as caught:
        verify_delivery(secret, headers, body, now=time.time() if now is None else now, max_age_s=MAX_AGE)
    assert caught.value.fix  # every refusal says what to do
    return caught.value.reason


# --- verification -------------------------------------------------------------------------------
def test_delivery_signed_by_mlflow_passes():
    body = mlflow_body("model_version.created")
    verify_delivery(SECRET, mlflow_headers(body), body, now=time.time(), max_age_s=MAX_AGE)


def test_header_names_are_case_insensitive():
    body = mlflow_body("model_version.created")
    lowered = {key.lower(): value for key, value in mlflow_headers(body).items()}
    verify_delivery(SECRET, lowered, body, now=time.time(), max_age_s=MAX_AGE)


def test_our_signer_matches_mlflows():
    body = mlflow_body("model_version_alias.created")
    expected = mlflow_headers(body, timestamp=1_700_000_000, delivery_id="d-1")
    ours = sign_delivery(SECRET, "d-1", 1_700_000_000, body)
    assert ours["X-MLflow-Signature"] == expected["X-MLflow-Signature"]


def test_forged_signature_is_refused():
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    headers["X-MLflow-Signature"] = "v1," + base64.b64encode(os.urandom(32)).decode()
    assert rejection(headers, body) == BAD_SIGNATURE


def test_wrong_secret_is_refused():
    body = mlflow_body("model_version.created")
    assert rejection(mlflow_headers(body, secret="another-secret"), body) == BAD_SIGNATURE


def test_tampered_body_is_refused():
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    tampered = body.replace(b'"example_model"', b'"other_model"')
    assert tampered != body
    assert rejection(headers, tampered) == BAD_SIGNATURE


def test_tampered_timestamp_or_delivery_id_is_refused():
    """Both are signed: moving the timestamp forward or reusing a signature under a new id fails."""
    body = mlflow_body("model_version.created")
    now = int(time.time())
    headers = mlflow_headers(body, timestamp=now - 1000)
    headers["X-MLflow-Timestamp"] = str(now)
    assert rejection(headers, body) == BAD_SIGNATURE
    headers = mlflow_headers(body)
    headers["X-MLflow-Delivery-Id"] = str(uuid.uuid4())
    assert rejection(headers, body) == BAD_SIGNATURE


@pytest.mark.parametrize("header", ["X-MLflow-Signature", "X-MLflow-Timestamp", "X-MLflow-Delivery-Id"])
def test_missing_header_is_refused(header):
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    del headers[header]
    assert rejection(headers, body) == MISSING_HEADER
    headers[header] = "  "
    assert rejection(headers, body) == MISSING_HEADER


@pytest.mark.parametrize(
    "signature",
    ["v2,abc=", "v1,not base64!", "v1,", "v1", "sha256=abcdef", "v1," + base64.b64encode(b"short").decode()],
)
def test_malformed_signature_is_refused(signature):
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    headers["X-MLflow-Signature"] = signature
    assert rejection(headers, body) == BAD_SIGNATURE_FORMAT


def test_one_valid_signature_among_several_passes():
    """Standard Webhooks lists several signatures during secret rotation."""
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    old = "v1," + base64.b64encode(os.urandom(32)).decode()
    headers["X-MLflow-Signature"] = f"{old} {headers['X-MLflow-Signature']}"
    verify_delivery(SECRET, headers, body, now=time.time(), max_age_s=MAX_AGE)


@pytest.mark.parametrize("timestamp", ["abc", "1.5", "+1700000000", "1_700_000_000", "-5", "1e9"])
def test_timestamp_that_is_not_an_int_is_refused(timestamp):
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    headers["X-MLflow-Timestamp"] = timestamp
    assert rejection(headers, body) == BAD_TIMESTAMP


def test_old_and_future_timestamps_are_refused_at_the_window_edge():
    body = mlflow_body("model_version.created")
    signed_at = 1_700_000_000
    headers = mlflow_headers(body, timestamp=signed_at)
    verify_delivery(SECRET, headers, body, now=signed_at + MAX_AGE, max_age_s=MAX_AGE)
    verify_delivery(SECRET, headers, body, now=signed_at - MAX_AGE, max_age_s=MAX_AGE)
    assert rejection(headers, body, now=signed_at + MAX_AGE + 1) == STALE_TIMESTAMP
    assert rejection(headers, body, now=signed_at - MAX_AGE - 1) == FUTURE_TIMESTAMP
    assert rejection(headers, body, now=signed_at + 86_400) == STALE_TIMESTAMP


@pytest.mark.parametrize("delivery_id", ["abc\nwebhook accepted: forged", "a" * 201, "id with spaces", "ünïcode"])
def test_delivery_id_that_could_forge_logs_is_refused(delivery_id):
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body)
    headers["X-MLflow-Delivery-Id"] = delivery_id
    assert rejection(headers, body) == BAD_DELIVERY_ID


def test_empty_secret_is_a_configuration_error_not_a_pass():
    body = mlflow_body("model_version.created")
    headers = mlflow_headers(body, secret="")
    with pytest.raises(DraftsyncError) as caught:
        verify_delivery("", headers, body, now=time.time(), max_age_s=MAX_AGE)
    assert not isinstance(caught.value, WebhookRejected)
    assert "DRAFTSYNC_WEBHOOK_SECRET" in caught.value.fix


# --- parsing ------------------------------------------------------------------------------------
def test_version_created_payload_becomes_a_change():
    data = {
        "name": "tiny-llama",
        "version": "3",
        "source": "s3://b/m",
        "run_id": None,
        "tags": {"draftsync.kind": "target"},
        "description": None,
    }
    change = parse_delivery(mlflow_body("model_version.created", data)).change
    assert change == RegistryChange(
        kind="version_created", model_name="tiny-llama", version=3, alias=None, tags={"draftsync.kind": "target"}
    )


def test_alias_created_payload_becomes_an_alias_move():
    change = parse_delivery(mlflow_body("model_version_alias.created")).change
    assert change == RegistryChange(
        kind="alias_moved", model_name="example_model", version=1, alias="example_alias", tags={}
    )


@pytest.mark.parametrize(
    "event",
    ["model_version_tag.set", "model_version_alias.deleted", "registered_model.created", "prompt_version.created"],
)
def test_other_events_are_ignored(event):
    parsed = parse_delivery(mlflow_body(event))
    assert parsed.event == event
    assert parsed.change is None


def _envelope(data) -> bytes:
    return json.dumps({"entity": "model_version", "action": "created", "timestamp": "t", "data": data}).encode()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe\x00",
        b"",
        b"[1, 2]",
        b'"model_version.created"',
        b'{"entity": "model_version"}',
        b'{"entity": "model_version", "action": "created"}',
        b'{"entity": 1, "action": "created", "data": {}}',
        _envelope([]),
        _envelope({"version": "1"}),
        _envelope({"name": "", "version": "1"}),
        _envelope({"name": "m"}),
        _envelope({"name": "m", "version": "one"}),
        _envelope({"name": "m", "version": "0"}),
        _envelope({"name": "m", "version": True}),
        _envelope({"name": "m", "version": "²"}),
        _envelope({"name": "m", "version": "1", "tags": ["draftsync.kind"]}),
        _envelope({"name": "m", "version": "1", "tags": {"draftsync.kind": 1}}),
        json.dumps(
            {"entity": "model_version_alias", "action": "created", "data": {"name": "m", "version": "1"}}
        ).encode(),
    ],
)
def test_bodies_of_the_wrong_shape_are_refused(body):
    with pytest.raises(WebhookRejected) as caught:
        parse_delivery(body)
    assert caught.value.reason == BAD_BODY


def test_version_as_int_and_missing_tags_are_accepted():
    change = parse_delivery(_envelope({"name": "m", "version": 7})).change
    assert (change.version, change.tags) == (7, {})


# --- registration input checks (the real MLflow server round trip is in tests/integration/flows) --------------
@pytest.mark.parametrize(
    "name, url, secret, fragment",
    [
        ("draftsync", "ftp://host/hook", SECRET, "http(s)"),
        ("draftsync", "http://127.0.0.1:1/mlflow/webhook", "", "secret"),
        ("draftsync", "http://127.0.0.1:1/mlflow/webhook", "x", "1 characters, fewer than the 16"),
        ("draftsync", "http://127.0.0.1:1/mlflow/webhook", "short-secret", "12 characters"),
        ("", "http://127.0.0.1:1/mlflow/webhook", SECRET, "name"),
    ],
)
def test_registration_refuses_bad_input_before_calling_mlflow(name, url, secret, fragment):
    with pytest.raises(DraftsyncError) as caught:
        create_or_update_webhook("http://127.0.0.1:1", name, url, secret)
    assert fragment in caught.value.what
    assert SECRET not in str(caught.value)
