"""`draftsync webhooks ...`: run the MLflow webhook receiver and register it with MLflow.

Mounted on the main CLI as `app.add_typer(webhooks_app, name="webhooks")`. Heavy imports (uvicorn,
mlflow, prefect) happen inside the commands, after the work dir's environment is set.
"""

from __future__ import annotations

from typing import Annotated

import typer

from draftsync.cli.common import JsonOption, check_listen_address, command_group, serve_until_stopped, write_json
from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_url

webhooks_app = command_group(
    "Receive MLflow registry webhooks (new target versions, alias moves) and register them with MLflow."
)


@webhooks_app.command()
def serve(
    host: Annotated[
        str, typer.Option("--host", help="Interface to listen on (0.0.0.0 inside a container).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8765,
) -> None:
    """Run the receiver: POST /mlflow/webhook (signed MLflow deliveries), GET /healthz. Requires the secret
    (DRAFTSYNC_WEBHOOK_SECRET or DRAFTSYNC_WEBHOOK_SECRET_BLOCK)."""
    from draftsync.receiver.app import HEALTH_PATH, WEBHOOK_PATH, app_from_settings
    from draftsync.tasks.context import stop_ephemeral_prefect

    check_listen_address("the webhook receiver", host, port)
    app = app_from_settings()
    typer.echo(f"receiving MLflow webhooks at http://{host}:{port}{WEBHOOK_PATH} (health: {HEALTH_PATH})", err=True)
    # the Prefect API child an emitted event started goes with the receiver
    serve_until_stopped(app, host, port, stop_ephemeral_prefect)


@webhooks_app.command()
def register(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The receiver's URL as MLflow reaches it, ending in /mlflow/webhook (default DRAFTSYNC_WEBHOOK_URL).",
        ),
    ] = None,
    name: Annotated[
        str, typer.Option("--name", help="Webhook name; an existing webhook of this name is updated.")
    ] = "draftsync",
    json_path: JsonOption = None,
) -> None:
    """Create (or update) the MLflow webhook that sends version and alias events, signed with the secret
    (required: DRAFTSYNC_WEBHOOK_SECRET or DRAFTSYNC_WEBHOOK_SECRET_BLOCK). An http or loopback URL needs an
    `mlflow server` started with MLFLOW_WEBHOOK_ALLOWED_SCHEMES=http,https and MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS=true."""
    from draftsync.receiver.app import resolve_webhook_secret
    from draftsync.registry.webhooks import SUBSCRIBED_EVENTS, create_or_update_webhook
    from draftsync.tasks import context

    settings = context.settings()
    url = url or settings.webhook_url
    if not url:
        raise DraftsyncError(
            "no webhook URL to register",
            "give --url http://HOST:8765/mlflow/webhook (the receiver as MLflow reaches it), or DRAFTSYNC_WEBHOOK_URL",
        )
    tracking_uri = settings.mlflow_tracking_uri
    webhook_id = create_or_update_webhook(tracking_uri, name, url, resolve_webhook_secret(settings))
    typer.echo(webhook_id)
    typer.echo(
        f"MLflow at {masked_url(tracking_uri)} sends {', '.join(SUBSCRIBED_EVENTS)} to {url} (webhook {name!r})",
        err=True,
    )
    write_json(
        {
            "webhook_id": webhook_id,
            "name": name,
            "url": url,
            "tracking_uri": tracking_uri,
            "events": list(SUBSCRIBED_EVENTS),
        },
        json_path,
    )
