"""What every `draftsync` command shares: the `--json` option, the one JSON writer behind it (and behind the
JSON a command prints), and the registry check that fails fast before Prefect starts.

The app and each command group import this module and never each other, so the CLI has no import cycle.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from draftsync.errors import DraftsyncError


def command_group(help_text: str) -> typer.Typer:
    """A typer app (the root or a command group) with the CLI's help settings."""
    return typer.Typer(
        add_completion=False,
        no_args_is_help=True,
        rich_markup_mode="markdown",  # docstrings' line breaks join into paragraphs: help reads in sentences
        help=help_text,
    )


ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        help="Sync profile: 'production' (GPU worker), 'demo' (2-core CPU), 'test' (smaller) or a YAML/JSON file.",
    ),
]


def _writable_json_path(path: Path | None) -> Path | None:
    """`--json` is checked before the command works: a path it could not write at the end (a folder, a parent that
    is a file) failed after a target was registered or a sync ran."""
    from draftsync.errors import DraftsyncError
    from draftsync.user_files import check_output_file

    if path is not None:
        try:
            check_output_file(path, "--json")
        except DraftsyncError as error:
            raise typer.BadParameter(f"{error.what}; {error.fix}") from None
    return path


JsonOption = Annotated[
    Path | None,
    typer.Option("--json", callback=_writable_json_path, help="Also write the result as JSON to this path."),
]


def json_text(result: Any) -> str:
    """A command's result as the JSON it prints and writes: indented, anything not JSON (dates, paths) as text."""
    return json.dumps(result, indent=2, default=str)


def echo_json(result: Any) -> None:
    typer.echo(json_text(result))


def write_json(result: Any, json_path: Path | None) -> None:
    """Write `result` to `json_path` (its folder made as needed); nothing when no path was given. The path was checked
    before the work (`check_output_file`); a write that fails even so (a full disk) is one error saying the work is
    done."""
    if json_path is None:
        return
    try:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json_text(result))
    except OSError as error:
        raise DraftsyncError(
            f"--json {json_path} could not be written ({error.strerror}); the command's work is done and recorded",
            "free space or pick another path; `draftsync status` shows what was done",
        ) from None


def check_registry(*, long_running: bool = False) -> None:
    """Fail fast, before Prefect starts, when MLflow cannot be reached; every command that runs flows calls this
    first, so it also sets how their errors reach the terminal (`expected_errors_in_one_line`)."""
    from draftsync.tasks import context

    expected_errors_in_one_line(said_at_exit=not long_running)
    context.registry().ping()


def expected_errors_in_one_line(said_at_exit: bool = True) -> None:
    """Prefect logs a failed flow or task run, and the state it ends in, with the error and its traceback. A
    DraftsyncError already names the problem and the fix: a command that ends by printing it (`said_at_exit`) keeps
    Prefect's lines about it off the terminal, and a long-running one (`draftsync serve`) shows each in one line.
    `--debug` shows everything; the run's logs in the Prefect UI keep it whole. Any other error is a bug's, and its
    traceback stays."""
    from prefect.logging.handlers import PrefectConsoleHandler

    from draftsync.settings import debug_requested

    if debug_requested():
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not isinstance(handler.formatter, _ExpectedErrorsInOneLine):
            handler.setFormatter(_ExpectedErrorsInOneLine(handler.formatter))
            if said_at_exit:
                handler.addFilter(_said_at_exit)


def _said_at_exit(record: logging.LogRecord) -> bool:
    """False for a run's log line about a DraftsyncError: its exception, or the failed state naming it."""
    from draftsync.errors import DraftsyncError

    if record.exc_info and isinstance(record.exc_info[1], DraftsyncError):
        return False
    return not (
        record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and "DraftsyncError" in record.getMessage()
    )


class _ExpectedErrorsInOneLine(logging.Formatter):
    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from draftsync.errors import DraftsyncError

        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, DraftsyncError):
            # a copy: the other handlers (Prefect's API log) still get the traceback
            message = record.getMessage()
            if error.what not in message:
                message = f"{message} {type(error).__name__}: {error}"
            fields = {**record.__dict__, "msg": message, "args": None, "exc_info": None, "exc_text": None}
            record = logging.makeLogRecord(fields)
        return self.inner.format(record)


def check_listen_address(what: str, host: str, port: int) -> None:
    """An address this machine does not have, or a port in use, is one error before a server starts (uvicorn logs
    its own error and exits 3)."""
    import socket

    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as error:
        raise DraftsyncError(
            f"{what} cannot listen on {host}:{port} ({error.strerror})",
            "give --host an address of this machine (0.0.0.0 for all of them) and --port a free port",
        ) from None


def serve_until_stopped(app: Any, host: str, port: int, cleanup: Callable[[], object]) -> None:
    """Run the ASGI app under uvicorn until stopped, then `cleanup`, on SIGTERM too.

    uvicorn shuts down gracefully on SIGTERM, then raises the signal again for the handler it found: with the default
    one the process dies on the spot and `cleanup` never runs."""
    import signal

    import uvicorn

    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)
    finally:
        cleanup()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
