"""MLflow registry webhooks: verify a delivery, read the registry change it reports, register the webhook.

MLflow signs each delivery Standard-Webhooks style: `X-MLflow-Signature: v1,<base64 HMAC-SHA256>` over
`"{delivery_id}.{timestamp}.{body}"`, with the delivery id and the Unix timestamp in their own headers.
The signature proves the sender knows the secret; the timestamp window bounds how long a captured
delivery stays usable, and the receiver's delivery-id memory refuses it inside that window.
Pure functions of their inputs (no Prefect, no server), so the receiver and its tests share them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypeGuard

from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_text, masked_url

if TYPE_CHECKING:
    from mlflow.entities.webhook import WebhookEventStr

SIGNATURE_HEADER = "X-MLflow-Signature"
TIMESTAMP_HEADER = "X-MLflow-Timestamp"
DELIVERY_ID_HEADER = "X-MLflow-Delivery-Id"
SIGNATURE_VERSION = "v1"

MODEL_VERSION_CREATED: Final = "model_version.created"
MODEL_VERSION_ALIAS_CREATED: Final = "model_version_alias.created"
SUBSCRIBED_EVENTS: tuple[WebhookEventStr, ...] = (MODEL_VERSION_CREATED, MODEL_VERSION_ALIAS_CREATED)

# Why a delivery was refused; the receiver maps each code to an HTTP status and logs it.
MISSING_HEADER = "missing_header"
BAD_DELIVERY_ID = "bad_delivery_id"
BAD_SIGNATURE_FORMAT = "bad_signature_format"
BAD_SIGNATURE = "bad_signature"
BAD_TIMESTAMP = "bad_timestamp"
STALE_TIMESTAMP = "stale_timestamp"
FUTURE_TIMESTAMP = "future_timestamp"
BAD_BODY = "bad_body"

# What `mlflow server` needs in its environment to deliver to an http:// receiver or a private or loopback address:
# by default it takes only https URLs of public addresses.
MLFLOW_SERVER_WEBHOOK_ENV = {"MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https", "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true"}

MIN_SECRET_LENGTH = 16  # a shorter shared secret can be guessed offline from one captured delivery
MAX_DELIVERY_ID_LENGTH = 200  # the sync ledger keeps at most this many characters of an id
_DELIVERY_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]+$")  # MLflow sends a UUID; nothing that could forge a log line
_TIMESTAMP_PATTERN = re.compile(r"^[0-9]{1,12}$")  # int() would also take "+1", " 1" and "1_0"
_VERSION_PATTERN = re.compile(r"^[0-9]{1,9}$")
_SIGNATURE_BYTES = hashlib.sha256().digest_size


class WebhookRejected(DraftsyncError):
    """A delivery that must not be acted on; `reason` is a stable code for logs, metrics and HTTP statuses."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message, _FIXES.get(reason, "check the sender's webhook configuration"))


_FIXES = {
    MISSING_HEADER: f"send deliveries from an MLflow webhook with a secret ({SIGNATURE_HEADER}, {TIMESTAMP_HEADER}, "
    f"{DELIVERY_ID_HEADER})",
    BAD_DELIVERY_ID: f"send a UUID-like {DELIVERY_ID_HEADER} (letters, digits, '.', '_', ':', '-')",
    BAD_SIGNATURE_FORMAT: f"send {SIGNATURE_HEADER} as 'v1,<base64 HMAC-SHA256>'",
    BAD_SIGNATURE: "give the MLflow webhook the same secret as DRAFTSYNC_WEBHOOK_SECRET "
    "(`draftsync webhooks register` sets it)",
    BAD_TIMESTAMP: f"send {TIMESTAMP_HEADER} as whole Unix seconds",
    STALE_TIMESTAMP: "check the clocks of the MLflow server and the receiver (NTP); old deliveries are refused "
    "on purpose, the registry poll picks up what they carried",
    FUTURE_TIMESTAMP: "check the clocks of the MLflow server and the receiver (NTP)",
    BAD_BODY: "send MLflow's webhook payload: a JSON object with entity, action, timestamp and data",
}


@dataclass(frozen=True)
class RegistryChange:
    """What a registry webhook reported: a new version of a model, or an alias pointed at a version."""

    kind: Literal["version_created", "alias_moved"]
    model_name: str
    version: int
    alias: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedDelivery:
    """The event name of a verified delivery (`entity.action`) and its change; `change` is None when ignored."""

    event: str
    change: RegistryChange | None


def check_webhook_secret(secret: str) -> None:
    """Refuse a secret too short to sign with, before a receiver starts or MLflow stores it."""
    if len(secret) < MIN_SECRET_LENGTH:
        raise DraftsyncError(
            f"the webhook secret has {len(secret)} characters, fewer than the {MIN_SECRET_LENGTH} a signing key needs",
            "set DRAFTSYNC_WEBHOOK_SECRET to a long random string, e.g. "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        )


def verify_delivery(secret: str, headers: Mapping[str, str], body: bytes, now: float, max_age_s: int) -> None:
    """Raise WebhookRejected unless the delivery carries a valid MLflow signature and a fresh timestamp.

    The signature is checked before the timestamp's age: the timestamp is part of what is signed, so a
    forged or altered one fails as `bad_signature` and only genuine old deliveries read as stale.
    """
    if not secret:
        raise DraftsyncError("the webhook secret is empty", "set DRAFTSYNC_WEBHOOK_SECRET to a long random string")
    lowered = {str(key).lower(): value for key, value in headers.items()}
    signature_header = _required_header(lowered, SIGNATURE_HEADER)
    timestamp = _required_header(lowered, TIMESTAMP_HEADER).strip()
    delivery_id = _required_header(lowered, DELIVERY_ID_HEADER).strip()
    if len(delivery_id) > MAX_DELIVERY_ID_LENGTH or not _DELIVERY_ID_PATTERN.match(delivery_id):
        raise WebhookRejected(BAD_DELIVERY_ID, f"{DELIVERY_ID_HEADER} is not a plain identifier")
    signatures = _signatures(signature_header)
    if not _TIMESTAMP_PATTERN.match(timestamp):
        raise WebhookRejected(BAD_TIMESTAMP, f"{TIMESTAMP_HEADER} is not whole Unix seconds")
    signed_content = f"{delivery_id}.{timestamp}.".encode() + bytes(body)
    expected = hmac.new(secret.encode("utf-8"), signed_content, hashlib.sha256).digest()
    matched = False
    for candidate in signatures:  # every candidate is compared, so timing does not tell which one matched
        matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise WebhookRejected(BAD_SIGNATURE, f"{SIGNATURE_HEADER} does not match the body and the secret")
    age = now - int(timestamp)
    if age > max_age_s:
        raise WebhookRejected(
            STALE_TIMESTAMP, f"the delivery was signed {age:.0f} s ago (at most {max_age_s} s allowed)"
        )
    if -age > max_age_s:
        raise WebhookRejected(
            FUTURE_TIMESTAMP, f"the delivery is dated {-age:.0f} s in the future (at most {max_age_s} s allowed)"
        )


def delivery_id_of(headers: Mapping[str, str]) -> str | None:
    """The delivery id header, looked up case-insensitively (None when absent)."""
    for key, value in headers.items():
        if str(key).lower() == DELIVERY_ID_HEADER.lower():
            return value.strip()
    return None


def sign_delivery(secret: str, delivery_id: str, timestamp: int | str, body: bytes) -> dict[str, str]:
    """The headers MLflow would send with `body`: what a test or a replay tool needs to act as MLflow."""
    content = f"{delivery_id}.{timestamp}.".encode() + bytes(body)
    digest = hmac.new(secret.encode("utf-8"), content, hashlib.sha256).digest()
    return {
        SIGNATURE_HEADER: f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode('ascii')}",
        TIMESTAMP_HEADER: str(timestamp),
        DELIVERY_ID_HEADER: delivery_id,
        "Content-Type": "application/json",
    }


def parse_delivery(body: bytes) -> ParsedDelivery:
    """Read MLflow's payload {"entity", "action", "timestamp", "data"}; events draftsync does not act on
    come back with `change=None`. Raises WebhookRejected("bad_body") for anything else."""
    try:
        payload = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise WebhookRejected(BAD_BODY, f"the webhook body is not UTF-8 JSON ({type(error).__name__})") from error
    except RecursionError:  # nesting deeper than the parser's stack; MLflow never sends it
        raise WebhookRejected(BAD_BODY, "the webhook body's JSON is nested too deeply") from None
    if not isinstance(payload, dict):
        raise WebhookRejected(BAD_BODY, "the webhook body is not a JSON object")
    entity, action, data = payload.get("entity"), payload.get("action"), payload.get("data")
    if not _is_name(entity) or not _is_name(action):
        raise WebhookRejected(BAD_BODY, "the webhook body lacks the strings 'entity' and 'action'")
    if not isinstance(data, dict):
        raise WebhookRejected(BAD_BODY, "the webhook body's 'data' is not an object")
    event = f"{entity}.{action}"
    if event == MODEL_VERSION_CREATED:
        change = RegistryChange(
            kind="version_created",
            model_name=_model_name(data),
            version=_version(data),
            alias=None,
            tags=_tags(data),
        )
    elif event == MODEL_VERSION_ALIAS_CREATED:
        alias = data.get("alias")
        if not _is_name(alias):
            raise WebhookRejected(BAD_BODY, f"{event} data has no 'alias' string")
        change = RegistryChange(kind="alias_moved", model_name=_model_name(data), version=_version(data), alias=alias)
    else:
        change = None
    return ParsedDelivery(event=event, change=change)


def create_or_update_webhook(tracking_uri: str, name: str, url: str, secret: str) -> str:
    """Make MLflow deliver version-created and alias-created events to `url`, signed with `secret`.

    Idempotent by name: a webhook called `name` is updated in place (URL, events, secret, ACTIVE),
    so running `draftsync webhooks register` again never makes MLflow deliver every event twice.
    Returns the webhook id.
    """
    if not _is_name(name):
        raise DraftsyncError("the webhook name is empty", "pass --name, e.g. --name draftsync")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise DraftsyncError(
            f"webhook URL {url!r} is not an http(s) URL",
            "pass the receiver's public URL, e.g. https://draftsync.example.com/mlflow/webhook",
        )
    if not secret:
        raise DraftsyncError(
            "the webhook secret is empty",
            "set DRAFTSYNC_WEBHOOK_SECRET (or DRAFTSYNC_WEBHOOK_SECRET_BLOCK) before registering",
        )
    check_webhook_secret(secret)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    description = "draftsync: new target versions and alias moves start drafter syncs"
    try:
        existing = _find_webhook(client, name)
        if existing is not None:
            updated = client.update_webhook(
                existing.webhook_id,
                url=url,
                events=list(SUBSCRIBED_EVENTS),
                description=description,
                secret=secret,
                status="ACTIVE",
            )
            return updated.webhook_id
        created = client.create_webhook(
            name=name, url=url, events=list(SUBSCRIBED_EVENTS), description=description, secret=secret
        )
        return created.webhook_id
    except MlflowException as error:
        raise _refusal(tracking_uri, name, url, error) from error


def _refusal(tracking_uri: str, name: str, url: str, error: BaseException) -> DraftsyncError:
    """MLflow's refusal of a webhook URL as what the MLflow server needs: by default it takes only https URLs of
    public addresses, and says so in words of its own (mlflow/utils/validation.py, _validate_webhook_url)."""
    server, said = masked_url(tracking_uri), masked_text(_first_line(error), tracking_uri)
    allow = " and ".join(f"{key}={value}" for key, value in MLFLOW_SERVER_WEBHOOK_ENV.items())
    fix = (
        f"start the MLflow server (`mlflow server`) with {allow} in its environment to deliver to a receiver over "
        f"http on this machine or network, or register an https URL of a public address"
    )
    if "webhook url scheme" in said.lower():
        what = (
            f"MLflow at {server} refuses webhook URL {url}: it allows only https unless its "
            f"MLFLOW_WEBHOOK_ALLOWED_SCHEMES says otherwise ({said})"
        )
    elif "non-public ip address" in said.lower():
        what = (
            f"MLflow at {server} refuses webhook URL {url}: it resolves to a private or loopback address, refused "
            f"unless its MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true ({said})"
        )
    elif "cannot resolve" in said.lower():
        what = f"MLflow at {server} cannot resolve the host of webhook URL {url} ({said})"
        fix = (
            "give --url the receiver's address as the MLflow server reaches it (a name its DNS knows, or an IP address)"
        )
    else:
        what = f"MLflow at {server} refused webhook {name!r} for {url} ({said})"
        fix = f"webhooks need an MLflow tracking server with a database backend (`mlflow server`); {fix}"
    return DraftsyncError(what, fix)


def _find_webhook(client: Any, name: str) -> Any | None:
    """The first webhook called `name` (MLflow does not keep names unique), across all pages."""
    page_token = None
    while True:
        page = client.list_webhooks(max_results=100, page_token=page_token)
        for webhook in page:
            if webhook.name == name:
                return webhook
        page_token = page.token
        if not page_token:
            return None


def _required_header(lowered: Mapping[str, str], header: str) -> str:
    value = lowered.get(header.lower())
    if value is None or not str(value).strip():
        raise WebhookRejected(MISSING_HEADER, f"the delivery has no {header} header")
    return str(value)


def _signatures(header: str) -> list[bytes]:
    """The v1 signatures in the header (Standard Webhooks allows several, space-separated, for key rotation)."""
    signatures = []
    for entry in header.split():
        version, _, encoded = entry.partition(",")
        if version != SIGNATURE_VERSION:
            continue
        try:
            decoded = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(decoded) == _SIGNATURE_BYTES:
            signatures.append(decoded)
    if not signatures:
        raise WebhookRejected(BAD_SIGNATURE_FORMAT, f"{SIGNATURE_HEADER} holds no 'v1,<base64 HMAC-SHA256>' entry")
    return signatures


def _is_name(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


def _model_name(data: Mapping[str, Any]) -> str:
    name = data.get("name")
    if not _is_name(name):
        raise WebhookRejected(BAD_BODY, "the webhook data has no model 'name' string")
    return name


def _version(data: Mapping[str, Any]) -> int:
    """MLflow sends versions as decimal strings; accept an int too, refuse anything else."""
    raw = data.get("version")
    if isinstance(raw, bool):
        raw = None
    if isinstance(raw, int):
        version = raw
    elif isinstance(raw, str) and _VERSION_PATTERN.match(raw.strip()):
        version = int(raw.strip())
    else:
        raise WebhookRejected(BAD_BODY, "the webhook data has no numeric 'version'")
    if version < 1:
        raise WebhookRejected(BAD_BODY, f"the webhook data's version {version} is not a registered version number")
    return version


def _tags(data: Mapping[str, Any]) -> dict[str, str]:
    tags = data.get("tags")
    if tags is None:
        return {}
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise WebhookRejected(BAD_BODY, "the webhook data's 'tags' is not an object of strings")
    return dict(tags)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:300] if lines else type(error).__name__
