"""Shared fixtures: a session-wide Prefect test harness and a fresh work dir with a real MLflow (SQLite) per test,
a throwaway Postgres 15 cluster and a real SMTP server (aiosmtpd), both on loopback, and the built test targets."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path

import pytest
from draftsync.serving.process import free_port

# Offline and quiet, whatever the shell exported: no telemetry, no hub lookups (as `make test` sets them).
for _key, _value in {
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}.items():
    os.environ.setdefault(_key, _value)


# --- model roots --------------------------------------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def model_roots_for_tests(tmp_path_factory) -> Iterator[None]:
    """Tests build checkpoints under pytest's temp folder, beside each test's work dir rather than in it: that
    folder is a model root (DRAFTSYNC_MODEL_ROOTS) for the whole session, servers started by tests included.
    Tests of the confinement itself set the variable to their own roots."""
    saved = os.environ.get("DRAFTSYNC_MODEL_ROOTS")
    os.environ["DRAFTSYNC_MODEL_ROOTS"] = str(tmp_path_factory.getbasetemp())
    yield
    if saved is None:
        os.environ.pop("DRAFTSYNC_MODEL_ROOTS", None)
    else:
        os.environ["DRAFTSYNC_MODEL_ROOTS"] = saved


# --- Prefect and the work dir --------------------------------------------------------------------
@pytest.fixture(scope="session")
def prefect_harness():
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.testing.utilities import prefect_test_harness

    # Prefect's console handler binds the sys.stderr of the moment it is set up: set it up now, not inside a
    # CliRunner invocation whose stderr is closed when the command returns.
    ensure_logging_setup()
    from draftsync.tasks.context import flows_without_heartbeats

    with prefect_test_harness(server_startup_timeout=120), flows_without_heartbeats():
        yield


@pytest.fixture()
def workdir(tmp_path, monkeypatch, prefect_harness) -> Path:
    """A fresh draftsync work dir; tasks see it through the environment, as a worker would."""
    from draftsync.tasks import context

    # an earlier test's (its folder gone by now) would otherwise reach the processes this one starts
    for key in ("MLFLOW_TRACKING_URI", "DRAFTSYNC_MONITOR_DB_URL", "PREFECT_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    context.reset()
    yield tmp_path / "work"
    from draftsync.tasks.serving import stop_all

    stop_all()
    context.reset()


# --- Postgres -----------------------------------------------------------------------------------
def _postgres_bin() -> Path | None:
    candidates = [os.environ.get("DRAFTSYNC_PG_BIN", "")] + sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class PostgresServer:
    host: str
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            host=self.host, port=self.port, user=self.user, dbname="postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def cluster_home(prefix_name: str) -> tuple[Path, Path, list[str]]:
    """Server binaries, an empty folder for a throwaway cluster, and the command prefix to run its commands.

    initdb refuses to run as root, so under root the folder belongs to the `postgres` user (or `nobody`)
    and the prefix runs each server command through `runuser`. Skips the test when that cannot be done."""
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("Postgres server binaries (initdb, pg_ctl) not found; set DRAFTSYNC_PG_BIN to their folder")
    root = Path(tempfile.mkdtemp(prefix=prefix_name))
    prefix: list[str] = []
    if os.geteuid() == 0:
        owner = next((u for u in ("postgres", "nobody") if _user_exists(u)), None)
        if owner is None or shutil.which("runuser") is None:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip("running as root without a `postgres`/`nobody` user and runuser: cannot run initdb")
        record = pwd.getpwnam(owner)
        os.chown(root, record.pw_uid, record.pw_gid)
        prefix = ["runuser", "-u", owner, "--"]
    return bin_dir, root, prefix


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A Postgres cluster in a temp dir (trust auth, loopback only), stopped and removed at the end.

    initdb refuses to run as root, so under root the cluster belongs to the `postgres` user
    (or `nobody`) and every server command runs through `runuser`.
    """
    bin_dir, root, prefix = cluster_home("draftsync-pg-")
    data, log = root / "data", root / "server.log"
    port = free_port()

    def run(*args: str) -> None:
        subprocess.run(prefix + list(args), check=True, capture_output=True, text=True, timeout=120)

    try:
        run(
            str(bin_dir / "initdb"),
            "-D",
            str(data),
            "-U",
            "draftsync",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "-t", "60", "start")
    except subprocess.CalledProcessError as exc:
        detail = exc.stderr + (log.read_text() if log.exists() else "")
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"throwaway Postgres did not start: {detail}") from exc
    try:
        yield PostgresServer(host="127.0.0.1", port=port, user="draftsync")
    finally:
        subprocess.run(
            prefix + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(root, ignore_errors=True)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """SQLAlchemy URL of a fresh database on the session's Postgres cluster."""
    return postgres_server.create_database()


# --- SMTP ---------------------------------------------------------------------------------------
@dataclass
class SmtpServer:
    """A running aiosmtpd server that keeps every message it receives."""

    host: str
    port: int
    messages: list[EmailMessage] = field(default_factory=list)
    envelopes: list[tuple[str, list[str]]] = field(default_factory=list)
    controller: object = None

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


class _Collector:
    def __init__(self, server: SmtpServer):
        self.server = server

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.server.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        self.server.messages.append(message_from_bytes(envelope.original_content, policy=default_policy))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_server_factory() -> Iterator[Callable[..., SmtpServer]]:
    """Start SMTP servers on loopback: `factory(port=None, **controller_kwargs)`; all stopped at the end.

    Extra keyword arguments go to aiosmtpd's Controller (tls_context, require_starttls,
    ssl_context, authenticator, auth_require_tls, ...).
    """
    from aiosmtpd.controller import Controller

    started: list[SmtpServer] = []

    def start(port: int | None = None, **kwargs) -> SmtpServer:
        server = SmtpServer(host="127.0.0.1", port=port or free_port())
        controller = Controller(_Collector(server), hostname=server.host, port=server.port, **kwargs)
        controller.start()
        server.controller = controller
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def smtp_server(smtp_server_factory) -> SmtpServer:
    """A plain SMTP server (no TLS, no auth) collecting messages."""
    return smtp_server_factory()


@pytest.fixture(scope="session")
def built_targets(tmp_path_factory) -> dict[int, Path]:
    """The built-in test-size targets v1 and v2, copied into this session's temp folder (a model root).

    They are trained once per recipe into DRAFTSYNC_TEST_CACHE (default .draftsync/test-cache in the checkout),
    cached by the recipe's hash as the demo caches its targets, so `make test`, `make test-story`, `make
    test-system` and `make test-vllm` train them once between them."""
    return _built_family(tmp_path_factory, "llama")


@pytest.fixture(scope="session")
def built_mimo_targets(tmp_path_factory) -> dict[int, Path]:
    """The built-in MiMo targets v1 and v2, each shipping its own MTP head (v2 fine-tuned, its head left stale),
    cached and copied as `built_targets` are."""
    return _built_family(tmp_path_factory, "mimo")


def _built_family(tmp_path_factory, family: str) -> dict[int, Path]:
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe

    cache = Path(
        os.environ.get("DRAFTSYNC_TEST_CACHE", Path(__file__).resolve().parents[1] / ".draftsync" / "test-cache")
    )
    copies = tmp_path_factory.mktemp(f"{family}-target-cache")
    built = {}
    for version in (1, 2):
        cached = build_target(builtin_recipe(version, "test", family), cache)
        built[version] = Path(shutil.copytree(cached, copies / cached.name))
    return built


# --- vLLM ---------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def vllm_engine():
    """The engine `make vllm` installs. Missing, it fails the test with the fix, except where vLLM has no CPU
    build (other than x86-64 Linux): there the test is skipped. Each engine gets a 1 GiB KV cache."""
    import platform
    import sys

    from draftsync.errors import DraftsyncError
    from draftsync.serving.vllm_engine import find_vllm_engine

    os.environ.setdefault("DRAFTSYNC_VLLM_CPU_KVCACHE_GB", "1")
    try:
        return find_vllm_engine()
    except DraftsyncError as error:
        if sys.platform != "linux" or platform.machine() != "x86_64":
            pytest.skip(f"vLLM's CPU build is for x86-64 Linux only: {error.what}")
        pytest.fail(str(error))


# --- tiers --------------------------------------------------------------------------------------
E2E_TIERS = ("story", "system", "vllm", "stack")


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "stack: the compose stack built and run with podman (make test-stack, in make test-all)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """A test under tests/e2e/<tier>/ carries its tier's marker (story, system, vllm or stack) whether or not it marks
    itself, so that `make test` (-m "not story and not system and not vllm") never runs an end-to-end test. Tiers are
    markers first: tests/integration/flows/test_rollout.py runs each rollout test on the reference engine (make test)
    and on vLLM (marked vllm), one test function for both. The stack tier needs images built first (make test-stack):
    it runs only when a -m expression names it."""
    e2e = Path(__file__).parent / "e2e"
    stack_selected = "stack" in (config.getoption("markexpr", "") or "")
    for item in items:
        parts = Path(item.path).relative_to(e2e).parts if e2e in Path(item.path).parents else ()
        if parts and parts[0] in E2E_TIERS:
            item.add_marker(parts[0])
        if parts and parts[0] == "stack" and not stack_selected:
            item.add_marker(pytest.mark.skip(reason="the compose stack tier: make test-stack (-m stack)"))
