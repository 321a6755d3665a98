"""`draftsync serving run`: the serving service, which owns the deployments' servers and routers so that serving
outlives a flow run; flows on any work pool steer it through its admin API."""

from __future__ import annotations

from typing import Annotated

import typer

from draftsync.cli.common import check_listen_address, command_group, serve_until_stopped

serving_app = command_group("The serving service: it runs each deployment's servers and router; flows steer it.")


@serving_app.command()
def run(
    host: Annotated[
        str, typer.Option("--host", help="Interface the admin API and the routers listen on (0.0.0.0 in a container).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port of the admin API.")] = 8100,
) -> None:
    """Serve the admin API (PUT /draftsync/deployments/NAME/pair, GET /draftsync/deployments, GET /healthz) until
    stopped; the servers and routers it started stop with it."""
    from draftsync.serving.servers import ServerBook
    from draftsync.serving_service.app import DEPLOYMENTS_PATH, HEALTH_PATH, app_from_settings
    from draftsync.tasks import context

    check_listen_address("the serving service", host, port)
    app = app_from_settings()
    typer.echo(f"serving service at http://{host}:{port}{DEPLOYMENTS_PATH} (health: {HEALTH_PATH})", err=True)
    # its servers and routers are its children
    serve_until_stopped(app, host, port, ServerBook(context.settings().root / "serving").stop_all)
