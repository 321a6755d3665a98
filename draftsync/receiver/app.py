"""The MLflow webhook receiver: a small ASGI app that turns signed registry deliveries into sync requests.

POST /mlflow/webhook, in this order, each step refusing before the next one runs:
  size     at most `max_body_bytes` are read (Content-Length checked first)      -> 413 too_large
           within `read_timeout_s`                                                -> 408 read_timeout
                                                                                  (400 client_disconnected)
  verify   signature (HMAC, constant-time) and headers                            -> 401 missing_header,
                                                                                     bad_signature_format, bad_signature
           delivery id and timestamp format, timestamp within +-max_age_s        -> 400 bad_delivery_id, bad_timestamp,
                                                                                     stale_timestamp, future_timestamp
  replay   `remember_delivery(id, now)` is False for an id already accepted       -> 409 replayed
           (it raised: 503 delivery_memory_unavailable, which MLflow retries)
  parse    MLflow's JSON payload                                                  -> 400 bad_body
  act      `on_change(change, delivery_id)` in a worker thread (it may block)     -> 200 with its dict as JSON
Events draftsync does not act on answer 200 {"ignored": "<entity.action>"}. Every accepted delivery answers
200, never 202: `on_change` has run (it records the sync request) before the answer goes out; a change it will
not act on (a version MLflow does not hold, a model that is no target) answers 200 {"action": "ignored: <why>"}.
No input answers 5xx: a failing `on_change` (MLflow or the ledger down) answers 500 {"error": "handler_failed"}
and forgets the delivery id, so MLflow's retry is handled; the registry poll, the reconciler, is the backstop.
Each refusal is one log line with the reason code, the delivery id and the client address; the secret,
the signature and the body are never logged. GET /healthz answers 200 for load balancers and compose.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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
    check_webhook_secret,
    delivery_id_of,
    parse_delivery,
    verify_delivery,
)

if TYPE_CHECKING:
    from draftsync.settings import Settings

WEBHOOK_PATH = "/mlflow/webhook"
HEALTH_PATH = "/healthz"
DEFAULT_MAX_AGE_SECONDS = 300
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_READ_TIMEOUT_SECONDS = 10.0  # MLflow sends its whole body at once; a body still coming after this never ends

TOO_LARGE = "too_large"
BAD_CONTENT_LENGTH = "bad_content_length"
READ_TIMEOUT = "read_timeout"
REPLAYED = "replayed"
CLIENT_DISCONNECTED = "client_disconnected"
MEMORY_UNAVAILABLE = "delivery_memory_unavailable"
HANDLER_FAILED = "handler_failed"

REFUSAL_STATUS = {
    MISSING_HEADER: 401,
    BAD_SIGNATURE_FORMAT: 401,
    BAD_SIGNATURE: 401,
    BAD_DELIVERY_ID: 400,
    BAD_TIMESTAMP: 400,
    STALE_TIMESTAMP: 400,
    FUTURE_TIMESTAMP: 400,
    BAD_BODY: 400,
    BAD_CONTENT_LENGTH: 400,
    CLIENT_DISCONNECTED: 400,
    TOO_LARGE: 413,
    READ_TIMEOUT: 408,
    REPLAYED: 409,
}
REFUSAL_MESSAGE = {REPLAYED: "replayed delivery", TOO_LARGE: "body too large", READ_TIMEOUT: "body not sent in time"}

logger = logging.getLogger("draftsync.webhooks")

OnChange = Callable[[RegistryChange, str], dict]
RememberDelivery = Callable[[str, datetime], bool]


class _Refused(Exception):
    """A refusal decided while reading the request, before verification."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def create_app(
    secret: str,
    on_change: OnChange,
    remember_delivery: RememberDelivery,
    *,
    max_age_s: int = DEFAULT_MAX_AGE_SECONDS,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_SECONDS,
    clock: Callable[[], float] = time.time,
    forget_delivery: Callable[[str], None] | None = None,
) -> Starlette:
    """The receiver app; `remember_delivery` must be atomic across replicas (the sync ledger's table is).

    `forget_delivery` undoes the memory of a delivery whose handling failed, so MLflow's retry of it is
    handled instead of refused as a replay.
    Long: the app's routes are closures over the secret, the delivery memory and the handler it is built with."""
    if not secret:
        raise DraftsyncError(
            "the webhook receiver has no secret, and one is required: it acts only on deliveries signed with it",
            "set DRAFTSYNC_WEBHOOK_SECRET (or DRAFTSYNC_WEBHOOK_SECRET_BLOCK) to a long random string",
        )
    check_webhook_secret(secret)
    if max_body_bytes < 1 or max_age_s < 1 or not read_timeout_s > 0:
        raise DraftsyncError(
            f"webhook limits max_body_bytes={max_body_bytes}, max_age_s={max_age_s}, read_timeout_s={read_timeout_s} "
            "are not all positive",
            "set DRAFTSYNC_WEBHOOK_MAX_BODY_BYTES and DRAFTSYNC_WEBHOOK_MAX_AGE_SECONDS above 0",
        )

    async def receive_webhook(request: Request) -> Response:
        delivery_id = delivery_id_of(request.headers)
        client = f"{request.client.host}:{request.client.port}" if request.client else "unknown"
        try:
            body = await _read_limited(request, max_body_bytes, read_timeout_s)
            now = clock()
            verify_delivery(secret, request.headers, body, now=now, max_age_s=max_age_s)
        except (_Refused, WebhookRejected) as refusal:
            return _refuse(refusal.reason, delivery_id, client)
        assert delivery_id is not None, "verify_delivery refuses a delivery without its id"
        try:
            first_time = await run_in_threadpool(remember_delivery, delivery_id, datetime.fromtimestamp(now, UTC))
        except Exception as error:  # 503: MLflow retries it, and the id was not recorded, so the retry is no replay
            logger.error(
                "webhook delivery memory failed: reason=%s delivery=%s client=%s error=%s",
                MEMORY_UNAVAILABLE,
                delivery_id,
                client,
                type(error).__name__,
            )
            return JSONResponse({"error": MEMORY_UNAVAILABLE, "reason": MEMORY_UNAVAILABLE}, status_code=503)
        if not first_time:
            return _refuse(REPLAYED, delivery_id, client)
        try:
            parsed = parse_delivery(body)
        except WebhookRejected as refusal:
            return _refuse(refusal.reason, delivery_id, client)
        if parsed.change is None:
            logger.info("webhook ignored: event=%s delivery=%s client=%s", parsed.event, delivery_id, client)
            return JSONResponse({"ignored": parsed.event})
        try:
            result = await run_in_threadpool(on_change, parsed.change, delivery_id)
        except Exception as error:  # the sender sees a 500 and retries; the registry poll is the backstop
            logger.error(
                "webhook handler failed: reason=%s delivery=%s client=%s error=%s",
                HANDLER_FAILED,
                delivery_id,
                client,
                type(error).__name__,
            )
            if forget_delivery is not None:
                await run_in_threadpool(forget_delivery, delivery_id)
            return JSONResponse({"error": HANDLER_FAILED, "delivery_id": delivery_id}, status_code=500)
        logger.info(
            "webhook accepted: event=%s model=%s version=%s delivery=%s client=%s",
            parsed.event,
            ascii(parsed.change.model_name),
            parsed.change.version,
            delivery_id,
            client,
        )
        return Response(json.dumps(result if result is not None else {}, default=str), media_type="application/json")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route(WEBHOOK_PATH, receive_webhook, methods=["POST"]),
            Route(HEALTH_PATH, health, methods=["GET"]),
        ]
    )


async def _read_limited(request: Request, max_body_bytes: int, read_timeout_s: float) -> bytes:
    """The body, or a refusal as soon as it is known to exceed the size limit or the time limit (the rest is never
    read): a sender that trickles or never finishes its body holds no connection longer than `read_timeout_s`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.strip().isascii() and declared.strip().isdigit()):
            raise _Refused(BAD_CONTENT_LENGTH)
        if int(declared) > max_body_bytes:
            raise _Refused(TOO_LARGE)
    body = bytearray()
    try:
        async with asyncio.timeout(read_timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_body_bytes:
                    raise _Refused(TOO_LARGE)
    except TimeoutError:
        raise _Refused(READ_TIMEOUT) from None
    except ClientDisconnect as disconnect:  # the sender gave up mid-body; nobody reads the answer
        raise _Refused(CLIENT_DISCONNECTED) from disconnect
    return bytes(body)


def _refuse(reason: str, delivery_id: str | None, client: str) -> Response:
    """One log line per refusal: reason, delivery id (quoted, it is untrusted), client; never secrets or body."""
    logger.warning("webhook refused: reason=%s delivery=%s client=%s", reason, _loggable(delivery_id), client)
    status = REFUSAL_STATUS.get(reason, 400)
    return JSONResponse(
        {"error": REFUSAL_MESSAGE.get(reason, reason.replace("_", " ")), "reason": reason}, status_code=status
    )


def _loggable(delivery_id: str | None) -> str:
    """An untrusted header, quoted and cut short so it cannot forge or flood log lines."""
    if delivery_id is None:
        return "-"
    return ascii(delivery_id[:80])


def resolve_webhook_secret(settings: Settings) -> str:
    """DRAFTSYNC_WEBHOOK_SECRET, else the Prefect Secret block named by DRAFTSYNC_WEBHOOK_SECRET_BLOCK; one of them is
    required by both `webhooks serve` and `webhooks register` (an unsigned delivery could be forged by anyone)."""
    if settings.webhook_secret is not None and settings.webhook_secret.get_secret_value():
        return settings.webhook_secret.get_secret_value()
    if settings.webhook_secret_block:
        from draftsync.tasks.secrets import secret_block_value

        return secret_block_value(settings.webhook_secret_block, "webhook secret", "DRAFTSYNC_WEBHOOK_SECRET_BLOCK")
    raise DraftsyncError(
        "the webhook secret is required and not set: MLflow signs every delivery with it, and the receiver acts only "
        "on signed ones",
        "set DRAFTSYNC_WEBHOOK_SECRET to a long random string (e.g. `openssl rand -hex 32`), or "
        "DRAFTSYNC_WEBHOOK_SECRET_BLOCK to the name of a Prefect Secret block holding it",
    )


def app_from_settings() -> Starlette:
    """The receiver as `draftsync webhooks serve` runs it: settings' secret and limits, the sync ledger's
    delivery memory, and sync requests for the changes."""
    from draftsync.tasks import context
    from draftsync.tasks.sync_requests import handle_registry_change

    settings = context.settings()
    return create_app(
        resolve_webhook_secret(settings),
        on_change=handle_registry_change,
        remember_delivery=lambda delivery_id, now: context.sync_ledger().remember_delivery(delivery_id, now),
        forget_delivery=lambda delivery_id: context.sync_ledger().forget_delivery(delivery_id),
        max_age_s=settings.webhook_max_age_seconds,
        max_body_bytes=settings.webhook_max_body_bytes,
    )
