"""The production files agree with each other and with the code: docker-compose.yml, prefect.yaml, deploy/.

Static checks (no Docker): the compose file parses and its services, volumes, ports, URLs and commands fit
together; prefect.yaml's entrypoints are flows, its trigger templates render to parameters the server accepts,
and its deployments match `build_deployments()` (what `draftsync serve` registers). One check runs a real
server: the Postgres init script against Postgres 15. The compose `setup` script against a real Prefect server is
tests/e2e/system/test_production_files.py's (make test-system).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import yaml

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
PREFECT_YAML = ROOT / "prefect.yaml"
DEPLOY = ROOT / "deploy"
ENV_EXAMPLE = DEPLOY / "draftsync.env.example"
# The secret env files, one per need (DRAFTSYNC_ENV_DIR, default deploy/): which services read each.
SECRET_FILES = {
    "postgres.env": {"postgres"},
    "mlflow.env": {"mlflow"},
    "prefect.env": {"prefect"},
    "draftsync.env": {
        "setup",
        "webhooks",
        "worker-cpu",
        "worker-gpu",
        "worker-gpu-on-cpu",
        "serving-gpu",
        "serving-cpu",
    },
    "webhook.env": {"setup", "webhooks"},
    "serving.env": {"worker-cpu", "worker-gpu", "worker-gpu-on-cpu", "serving-gpu", "serving-cpu"},
}
# The only variables compose takes from the host shell, each with its default (docker-compose.yml's header).
COMPOSE_VARIABLES = {
    "DRAFTSYNC_ENV_DIR": "./deploy",
    "DRAFTSYNC_DEPLOYMENTS_FILE": "./deploy/deployments.yaml",
    "DRAFTSYNC_BIND_ADDRESS": "127.0.0.1",
    "DRAFTSYNC_MLFLOW_PORT": "5000",
    "DRAFTSYNC_PREFECT_PORT": "4200",
    "DRAFTSYNC_MAILPIT_PORT": "8025",
    "DRAFTSYNC_WEBHOOKS_PORT": "8765",
    "DRAFTSYNC_SERVING_PORT": "8100",
    "DRAFTSYNC_ROUTER_PORT": "8000",
}
STACK_ENV = DEPLOY / "stack.env"
ENTRYPOINT_SCRIPT = DEPLOY / "docker-entrypoint.sh"

SERVICES = {
    "postgres",
    "mlflow",
    "prefect",
    "setup",
    "webhooks",
    "worker-cpu",
    "worker-gpu",
    "worker-gpu-on-cpu",
    "serving-gpu",
    "serving-cpu",
    "mailpit",
}
# Where the other services reach each service: service -> port.
REACHED_AT = {"mlflow": 5000, "prefect": 4200, "postgres": 5432, "webhooks": 8765, "mailpit": 1025, "serving": 8100}
# Ports an image listens on without being told (postgres's default); everything else must be explicit.
IMAGE_DEFAULT_PORTS = {"postgres": {5432}}
WORKER_HEALTHCHECK_PORT = 8080  # `prefect worker start --with-healthcheck` (PREFECT_WORKER_WEBSERVER_PORT)


# --- reading the files ------------------------------------------------------------------------------------
def _defaults(text: str) -> str:
    """The text with each compose variable replaced by its default and each `$$` by `$`, as compose reads it with
    none set."""
    return re.sub(r"(?<!\$)\$\{(\w+):-([^}]*)\}", lambda m: m[2], text).replace("$$", "$")


def _compose() -> dict:
    return yaml.safe_load(_defaults(COMPOSE.read_text()))


def _prefect_yaml() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _prefect_deployments() -> dict[str, dict]:
    return {d["name"]: d for d in _prefect_yaml()["deployments"]}


def _env_file(path: Path, include_commented: bool = False) -> dict[str, str]:
    """KEY=VALUE lines of an env file; with include_commented also `# KEY=VALUE` examples."""
    pattern = re.compile(r"^\s*(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$")
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        match = pattern.match(line)
        if match and (include_commented or not match[1]):
            found[match[2]] = match[3].strip()
    return found


def _unescape(text: str) -> str:
    """What a container sees: compose turns `$$` into `$`."""
    return text.replace("$$", "$")


def _command(service: dict) -> list[str]:
    command = service.get("command", [])
    return [_unescape(part) for part in (shlex.split(command) if isinstance(command, str) else command)]


def _command_text(service: dict) -> str:
    return " ".join(_command(service))


def _scripts(service: dict) -> list[str]:
    """The shell scripts a service runs (`sh -c SCRIPT` and the like), or its argv as one line."""
    argv = _command(service)
    if len(argv) >= 3 and argv[0] in ("sh", "bash") and argv[1].startswith("-") and "c" in argv[1]:
        return [argv[2]]
    return [shlex.join(argv)] if argv else []


def _strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in _strings(key) + _strings(value)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return []


def _production_readme_section() -> str:
    """What a user reads to run draftsync in production: the README's section and docs/PRODUCTION.md."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## Run it in production\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, "README.md has no '## Run it in production' section"
    return match[1] + (ROOT / "docs" / "PRODUCTION.md").read_text()


# --- the compose file ---------------------------------------------------------------------------------------
def test_compose_parses_and_each_service_reads_only_the_secret_files_it_needs():
    compose = _compose()
    assert set(compose["services"]) == SERVICES
    assert STACK_ENV.exists()
    for name, service in compose["services"].items():
        paths = [entry["path"] if isinstance(entry, dict) else entry for entry in service.get("env_file", [])]
        wanted = [f"./deploy/{file}" for file, readers in SECRET_FILES.items() if name in readers]
        if "draftsync.env" in " ".join(wanted):  # the draftsync images: the stack's wiring first
            wanted = ["deploy/stack.env", *wanted]
        assert paths == wanted, f"{name} reads {paths}, not {wanted}"
        for entry in service.get("env_file", []):
            assert not isinstance(entry, dict) or entry.get("required", True), f"{name}: {entry} must be required"
    for file in SECRET_FILES:
        example = DEPLOY / f"{file}.example"
        assert example.exists(), f"{example.name} documents {file}"


def test_compose_takes_from_the_host_shell_only_its_declared_variables_each_with_its_default():
    """Every other `$` is escaped (`$$`): settings and secrets come from the env files, never from the shell."""
    header = COMPOSE.read_text().split("\nname:", 1)[0]
    for number, line in enumerate(COMPOSE.read_text().splitlines(), start=1):
        code = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        code = code.replace("$$", "")
        for name, default in re.findall(r"\$\{(\w+):-([^}]*)\}", code):
            assert COMPOSE_VARIABLES.get(name) == default, f"docker-compose.yml:{number}: ${{{name}:-{default}}}"
            assert name in header, f"docker-compose.yml's header does not list {name}"
        code = re.sub(r"\$\{\w+:-[^}]*\}", "", code)
        assert not re.search(r"\$(?!\$)", code), f"docker-compose.yml:{number} interpolates: {line}"


def test_depends_on_names_services_with_conditions_that_exist():
    services = _compose()["services"]
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in services.items():
        depends = service.get("depends_on", {})
        entries = depends.items() if isinstance(depends, dict) else ((d, {}) for d in depends)
        for other, spec in entries:
            assert other in services, f"{name} depends on {other!r}, which is no service"
            condition = spec.get("condition", "service_started")
            assert condition in conditions, f"{name} waits for {other} to be {condition!r}"
            if condition == "service_healthy":
                assert "healthcheck" in services[other], f"{name} waits for {other} to be healthy; it has none"
            if condition == "service_completed_successfully":
                assert services[other].get("restart") == "no", f"{other} is awaited to finish but restarts"


def test_services_that_others_need_have_healthchecks_and_waits_are_in_order():
    services = _compose()["services"]
    for name in ("postgres", "mlflow", "prefect", "webhooks"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    healthy = {
        name: {o for o, s in services[name].get("depends_on", {}).items() if s.get("condition") == "service_healthy"}
        for name in services
    }
    assert {"postgres"} <= healthy["mlflow"] and {"postgres"} <= healthy["prefect"]
    assert {"prefect", "mlflow"} <= healthy["setup"]
    for worker in ("worker-cpu", "worker-gpu"):
        assert services[worker]["depends_on"]["setup"]["condition"] == "service_completed_successfully"


def test_every_named_volume_is_declared_and_every_bind_mount_exists():
    compose = _compose()
    declared = set(compose.get("volumes") or {})
    used = set()
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source")
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"
            else:
                assert source in declared, f"{name} uses volume {source!r}, not declared under volumes:"
                used.add(source)
    assert used == declared, f"declared but unused volumes: {declared - used}"


def _listening_ports(name: str, service: dict) -> set[int]:
    """The ports a service listens on, as its command, environment and image say."""
    text = _command_text(service)
    ports = {int(p) for p in re.findall(r"--port[ =](\d+)", text)}
    if "--with-healthcheck" in text:
        ports.add(WORKER_HEALTHCHECK_PORT)
    for key, value in (service.get("environment") or {}).items():
        if key.endswith("_BIND_ADDR"):
            ports.add(int(str(value).rsplit(":", 1)[1]))
    image = str(service.get("image", "")).split(":", 1)[0]
    ports |= IMAGE_DEFAULT_PORTS.get(image, set())
    # A deployment's router listens in the serving service: on all its interfaces, or on its name or an alias.
    from draftsync.serving.deployment import load_deployments

    if "serving run" in text:
        aliases = (service.get("networks") or {}).get("default", {}).get("aliases", [])
        hosts = {"0.0.0.0", name, *aliases}
        ports |= {d.port for d in load_deployments(DEPLOY / "deployments.yaml") if d.host in hosts}
    return ports


def test_published_ports_are_unique_on_loopback_and_listened_on():
    published: dict[int, str] = {}
    for name, service in _compose()["services"].items():
        for mapping in service.get("ports", []):
            address, host, container = str(mapping).split(":")
            host, container = int(host), int(container)
            assert address == "127.0.0.1", f"{name} publishes {mapping} beyond this machine"
            other = published.get(host)
            # the two serving services are in different profiles: one of them runs
            assert other is None or {other, name} == {"serving-gpu", "serving-cpu"}, (
                f"host port {host} published by both {other} and {name}"
            )
            published[host] = name
            assert container in _listening_ports(name, service), (
                f"{name} publishes {mapping} but listens on {_listening_ports(name, service)}"
            )
    assert {5000, 4200, 8025} <= set(published), "the MLflow, Prefect and Mailpit UIs must be reachable from the host"


def test_services_are_reached_where_they_listen():
    """Every service:port in a URL, env file or deployments file is a port that service listens on."""
    services = _compose()["services"]
    texts = [s for service in services.values() for s in _strings(service.get("environment") or {})]
    texts += [_command_text(service) for service in services.values()]
    texts += [line for path in (STACK_ENV, ENV_EXAMPLE) for line in path.read_text().splitlines()]
    reached: set[tuple[str, int]] = set()
    # a network alias names a service too (`serving`: serving-gpu or serving-cpu, whichever profile runs)
    alias_of = {
        alias: [
            name
            for name, s in services.items()
            if alias in (s.get("networks") or {}).get("default", {}).get("aliases", [])
        ]
        for service in services.values()
        for alias in (service.get("networks") or {}).get("default", {}).get("aliases", [])
    }
    for text in texts:
        for host, port in re.findall(r"(?<![\w.-])([a-z][a-z0-9-]*):(\d{2,5})\b", _unescape(text)):
            if host in services or host in alias_of:
                reached.add((host, int(port)))
    stack = _env_file(STACK_ENV)
    reached.add((stack["DRAFTSYNC_SMTP_HOST"], int(stack["DRAFTSYNC_SMTP_PORT"])))
    assert set(REACHED_AT.items()) <= reached, f"not reached by URL: {set(REACHED_AT.items()) - reached}"
    for host, port in sorted(reached):
        for name in alias_of.get(host, [host]):
            assert port in _listening_ports(name, services[name]), (
                f"{host}:{port} is used, but {name} listens on {_listening_ports(name, services[name])}"
            )
    for name, service in services.items():  # healthchecks ask the service itself
        for port in re.findall(r"localhost:(\d+)", " ".join(_strings(service.get("healthcheck", {})))):
            assert int(port) in _listening_ports(name, service), f"{name}'s healthcheck asks port {port}"


def test_mlflow_can_deliver_webhooks_inside_the_stack_and_accepts_its_clients():
    """The MLflow variable names are MLflow's own; the server accepts the Host header workers send."""
    from mlflow.environment_variables import (
        _MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS,
        _MLFLOW_WEBHOOK_ALLOWED_SCHEMES,
        MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY,
    )
    from mlflow.server.security_utils import is_allowed_host_header

    mlflow = _compose()["services"]["mlflow"]
    environment = mlflow["environment"]
    assert environment[_MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS.name] == "true"
    assert "http" in environment[_MLFLOW_WEBHOOK_ALLOWED_SCHEMES.name].split(",")
    text = _command_text(mlflow)
    example = _env_file(DEPLOY / "mlflow.env.example", include_commented=True)
    for name in (
        MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY.name,
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
    ):
        assert name in text and name in example  # refuses to start without each
    assert "--serve-artifacts" in text and "--artifacts-destination /mlartifacts" in text
    assert "--app-name basic-auth" in text
    # the database URL (its password) comes from mlflow server's own variable, never from an argument
    assert "--backend-store-uri" not in text and "postgresql" not in text
    assert "MLFLOW_BACKEND_STORE_URI" in text
    assert example["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert example["MLFLOW_BACKEND_STORE_URI"].endswith("@postgres:5432/mlflow")
    allowed = re.search(r'--allowed-hosts "([^"]+)"', text)[1].split(",")
    for host in ("mlflow:5000", "localhost:5000", "127.0.0.1:5000"):
        assert is_allowed_host_header(allowed, host), f"MLflow would refuse requests with Host {host}"


def test_gpu_worker_reserves_nvidia_gpus_on_vllms_image():
    worker = _compose()["services"]["worker-gpu"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    dockerfile = (ROOT / worker["build"]["dockerfile"]).read_text()
    image = re.search(r"^ARG VLLM_IMAGE=(\S+)$", dockerfile, re.M)[1]
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", image), f"vLLM image {image} is not pinned to a release"
    assert "FROM ${VLLM_IMAGE}" in dockerfile
    # draftsync within the tested versions, the image's own (torch, vLLM) winning; the build fails on a broken set
    assert "requirements/draftsync-tested.txt" in dockerfile and "-c /tmp/keep-from-vllm.txt" in dockerfile
    assert "python3 -m pip check" in dockerfile and 'python3 -c "import vllm, draftsync.cli.app' in dockerfile
    assert worker.get("profiles") == ["gpu"], "hosts without NVIDIA GPUs run the stack without the GPU worker"


def _ignored_by_build(context: Path, dockerfile: Path, relative: str) -> bool:
    """Whether a path of the build context stays out of it (BuildKit: <Dockerfile>.dockerignore, else .dockerignore).

    Reads the allowlist form these files use: `*`, then `!path` re-includes."""
    candidates = [dockerfile.parent / f"{dockerfile.name}.dockerignore", context / ".dockerignore"]
    ignore_file = next((path for path in candidates if path.exists()), None)
    if ignore_file is None:
        return False
    ignored = False
    for line in ignore_file.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate, pattern = pattern.startswith("!"), pattern.lstrip("!").rstrip("/")
        if pattern in ("*", "**") or relative == pattern or relative.startswith(pattern + "/"):
            ignored = not negate
    return ignored


def test_secrets_and_virtual_environments_stay_out_of_every_build_context():
    """deploy/draftsync.env holds secrets and .venv gigabytes: no image build sends them to the builder."""
    for name, service in _compose()["services"].items():
        build = service.get("build")
        if not build:
            continue
        context = (ROOT / build["context"]).resolve()
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.exists(), f"{name} builds from {dockerfile}, which does not exist"
        for secret in ("deploy/draftsync.env", ".venv", ".draftsync"):
            path = ROOT / secret
            if context in path.parents:
                relative = str(path.relative_to(context))
                assert _ignored_by_build(context, dockerfile, relative), (
                    f"{name}: {secret} goes into the build context of {dockerfile.relative_to(ROOT)}"
                )


def test_the_filled_in_env_file_stays_out_of_version_control():
    from fnmatch import fnmatch

    patterns = [
        line.strip().lstrip("/")
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    listed = any(fnmatch("deploy/draftsync.env", p) or ("/" not in p and fnmatch("draftsync.env", p)) for p in patterns)
    assert listed, ".gitignore must list deploy/draftsync.env (it holds the webhook secret and passwords)"


def test_work_pools_match_between_setup_workers_and_prefect_yaml():
    from draftsync.flows.prefect_deployments import WORK_POOLS

    services = _compose()["services"]
    script = _scripts(services["setup"])[0]
    created = set(re.search(r"for pool in ([^;]+); do", script)[1].split())
    polled = {_command(services[w])[_command(services[w]).index("--pool") + 1] for w in ("worker-cpu", "worker-gpu")}
    used = {d["work_pool"]["name"] for d in _prefect_deployments().values()}
    assert created == polled == used == {"draftsync-cpu", "draftsync-gpu"}
    assert "prefect deploy --all" in script
    for worker, pool in (("worker-cpu", "draftsync-cpu"), ("worker-gpu", "draftsync-gpu")):
        assert "process" in _command(services[worker]), f"{worker} is a process worker on {pool}"
    assert set(_prefect_deployments()) == set(WORK_POOLS)


# --- commands point at real entry points ----------------------------------------------------------------------
def _draftsync_invocations(script: str) -> list[list[str]]:
    """argv lists of the `draftsync ...` commands in a shell script (or a line of a README code block)."""
    invocations = []
    for line in script.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        for index, token in enumerate(tokens):
            if token != "draftsync" or (index and tokens[index - 1].startswith("-")):
                continue
            argv = [token]
            for rest in tokens[index + 1 :]:
                if rest in (";", "&&", "||", "|", ")", "then", "fi"):
                    break
                argv.append(rest)
            if len(argv) > 1:  # the bare word is a name (prefect.yaml's project, a tag), not a command
                invocations.append(argv)
    return invocations


def _check_cli(argv: list[str]) -> None:
    """Walk the typer app like the shell would: every word a (sub)command, every --option one it takes."""
    import typer
    from draftsync.cli.app import app

    command = typer.main.get_command(app)  # typer's click: a group is a command with subcommands
    args = list(argv[1:])
    path = ["draftsync"]
    while hasattr(command, "commands"):
        group_options = {opt: p for p in command.params for opt in p.opts + p.secondary_opts}
        while args and args[0].split("=")[0] in group_options:  # e.g. draftsync --workdir DIR serve
            takes_value = not group_options[args[0].split("=")[0]].is_flag
            args = args[2:] if takes_value and "=" not in args[0] else args[1:]
        assert args and not args[0].startswith("-"), f"`{shlex.join(argv)}`: {' '.join(path)} needs a subcommand"
        name = args.pop(0)
        assert name in command.commands, (
            f"`{shlex.join(argv)}`: {' '.join(path)} has no command {name!r} (it has {sorted(command.commands)})"
        )
        command, path = command.commands[name], path + [name]
    options = {opt for p in command.params for opt in p.opts + p.secondary_opts} | {"--help"}
    for arg in args:
        if arg.startswith("--"):
            assert arg.split("=")[0] in options, f"`{shlex.join(argv)}`: {' '.join(path)} has no option {arg}"


def _all_draftsync_invocations() -> list[list[str]]:
    found = []
    for service in _compose()["services"].values():
        for script in _scripts(service):
            found += _draftsync_invocations(script)
        found += [argv for text in _strings(service.get("healthcheck", {})) for argv in _draftsync_invocations(text)]
    for text in _strings(_prefect_yaml()):
        found += _draftsync_invocations(text)
    section = _production_readme_section()
    for block in re.findall(r"```(?:sh|bash|console)?\n(.*?)```", section, re.S):
        found += _draftsync_invocations(block)
    for span in re.findall(r"`(draftsync [^`]+)`", section):
        found += _draftsync_invocations(span)
    return found


def test_every_draftsync_command_is_a_real_cli_command():
    invocations = _all_draftsync_invocations()
    commands = {" ".join(argv[:3]) for argv in invocations}
    assert {"draftsync webhooks serve", "draftsync webhooks register"} <= commands
    assert any(argv[:2] == ["draftsync", "serve"] for argv in invocations), "the README shows `draftsync serve`"
    for argv in invocations:
        _check_cli(argv)


def test_images_start_through_the_entrypoint_that_builds_the_monitor_store_url(tmp_path):
    env = {"PATH": os.environ["PATH"], "POSTGRES_PASSWORD": "s3cret"}
    shown = subprocess.run(
        ["sh", str(ENTRYPOINT_SCRIPT), "sh", "-c", 'echo "$DRAFTSYNC_MONITOR_DB_URL"'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert shown == "postgresql+psycopg://draftsync:s3cret@postgres:5432/draftsync"
    env["DRAFTSYNC_MONITOR_DB_URL"] = "sqlite:////tmp/monitor.db"
    kept = subprocess.run(
        ["sh", str(ENTRYPOINT_SCRIPT), "sh", "-c", 'echo "$DRAFTSYNC_MONITOR_DB_URL"'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert kept == "sqlite:////tmp/monitor.db"
    for dockerfile in (ROOT / "Dockerfile", DEPLOY / "gpu.Dockerfile"):
        text = dockerfile.read_text()
        assert "COPY --chmod=755 deploy/docker-entrypoint.sh /usr/local/bin/draftsync-entrypoint" in text
        assert 'ENTRYPOINT ["draftsync-entrypoint"]' in text
        assert "WORKDIR /opt/draftsync" in text and "prefect.yaml" in text
    # the GPU image's vLLM loads draftsync's hidden-states connector by module path: the plugin is copied, admitted
    # by the build context and installed, and the build fails unless it imports
    gpu, admitted = (DEPLOY / "gpu.Dockerfile").read_text(), (DEPLOY / "gpu.Dockerfile.dockerignore").read_text()
    plugin = sorted(p.name for p in (DEPLOY / "vllm-cpu-plugin").iterdir() if p.suffix in (".py", ".toml"))
    assert plugin == ["draftsync_hidden_states.py", "draftsync_vllm_cpu.py", "pyproject.toml"]
    for name in plugin:
        assert f"deploy/vllm-cpu-plugin/{name}" in gpu and f"!deploy/vllm-cpu-plugin/{name}" in admitted.splitlines()
    assert "pip install --no-cache-dir --no-deps ./deploy/vllm-cpu-plugin" in gpu
    assert "import vllm, draftsync.cli.app, draftsync_hidden_states" in gpu


# --- prefect.yaml --------------------------------------------------------------------------------------------
def _load_flow(entrypoint: str):
    from prefect.flows import Flow, load_flow_from_entrypoint

    cwd = os.getcwd()
    os.chdir(ROOT)  # entrypoints are relative to the folder flow runs start in (the pull step's directory)
    try:
        flow = load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False)
    finally:
        os.chdir(cwd)
    assert isinstance(flow, Flow), f"{entrypoint} is a {type(flow).__name__}, not a Prefect flow"
    return flow


def _flow_parameters(flow) -> set[str]:
    import inspect

    return set(inspect.signature(flow.fn).parameters)


def test_pull_step_starts_flow_runs_where_the_images_install_draftsync():
    pull = _prefect_yaml()["pull"]
    assert pull == [{"prefect.deployments.steps.set_working_directory": {"directory": "/opt/draftsync"}}]


def test_entrypoints_are_flows_and_every_parameter_is_theirs():
    for name, deployment in _prefect_deployments().items():
        flow = _load_flow(deployment["entrypoint"])
        accepted = _flow_parameters(flow)
        given = set(deployment.get("parameters") or {})
        for schedule in deployment.get("schedules") or []:
            given |= set(schedule.get("parameters") or {})
        for trigger in deployment.get("triggers") or []:
            given |= set(trigger.get("parameters") or {})
        assert given <= accepted, f"{name}: {sorted(given - accepted)} are not parameters of {deployment['entrypoint']}"


def test_triggers_and_schedules_are_valid_prefect_objects():
    from prefect.client.schemas.objects import ConcurrencyLimitStrategy
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    for name, deployment in _prefect_deployments().items():
        for spec in deployment.get("triggers") or []:
            trigger = DeploymentEventTrigger.model_validate(spec)
            assert spec["type"] == "event" and trigger.expect, f"{name}: a trigger that expects no event"
        for schedule in _rendered_schedules(deployment):
            assert schedule is not None
        limit = deployment.get("concurrency_limit")
        if limit is not None:
            ConcurrencyLimitStrategy(limit["collision_strategy"])
    assert _prefect_deployments()["drafter-sync"]["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}


def _rendered_schedules(deployment: dict, timezone: str = "UTC") -> list:
    """The deployment's schedules as `prefect deploy` builds them, with DRAFTSYNC_REPORT_TIMEZONE set."""
    from datetime import timedelta

    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
    from prefect.utilities.templating import apply_values

    schedules = []
    for raw in deployment.get("schedules") or []:
        with patch.dict(os.environ, {"DRAFTSYNC_REPORT_TIMEZONE": timezone}):
            spec = apply_values(dict(raw), os.environ, remove_notset=False)  # as `prefect deploy` fills {{ $VAR }}
        if "cron" in spec:
            schedules.append(CronSchedule(cron=spec["cron"], timezone=spec.get("timezone")))
        else:
            schedules.append(IntervalSchedule(interval=timedelta(seconds=spec["interval"])))
    return schedules


def _schedule_key(schedule) -> tuple:
    if hasattr(schedule, "cron"):
        return ("cron", schedule.cron, schedule.timezone)
    return ("interval", schedule.interval.total_seconds())


def test_report_time_zone_comes_from_the_environment_prefect_deploy_runs_in():
    report = _prefect_deployments()["weekly-acceptance-report"]
    assert [_schedule_key(s) for s in _rendered_schedules(report, "Europe/Berlin")] == [
        ("cron", "0 9 * * 1", "Europe/Berlin")
    ]
    assert "DRAFTSYNC_REPORT_TIMEZONE" in _env_file(ENV_EXAMPLE, include_commented=True)


def _event(name: str, **labels: str):
    """An event as draftsync emits it (draftsync.tasks.events), received by the Prefect server."""
    from draftsync.tasks.events import target_resource
    from prefect.server.events.schemas.events import ReceivedEvent

    now = datetime.now(UTC)
    return ReceivedEvent(
        occurred=now,
        received=now,
        event=name,
        id=uuid.uuid4(),
        resource=target_resource("llama-chat", 7, **labels),
        payload={"reason": "a new version"},
    )


def _render(parameters: dict, event) -> dict:
    """Trigger parameters rendered as the server's RunDeployment action renders them."""
    import copy

    from prefect.server.events.actions import RunDeployment
    from prefect.utilities.schema_tools.hydration import HydrationContext, hydrate

    templated = copy.deepcopy(parameters)
    RunDeployment._upgrade_v1_templates(templated)
    return hydrate(templated, HydrationContext(raise_on_error=True, render_jinja=True, jinja_context={"event": event}))


def _check_rendered(deployment_name: str, flow, defaults: dict, trigger_parameters: dict, event_name: str) -> dict:
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import validate

    rendered = _render(trigger_parameters, _event(event_name, alias="production"))
    parameters = {**defaults, **rendered}
    # What the server checks before it creates the run (enforce_parameter_schema is on by default).
    errors = validate(parameters, parameter_schema(flow).model_dump_for_openapi(), raise_on_error=False)
    assert not errors, f"{deployment_name} on {event_name}: {parameters} is refused: {[e.message for e in errors]}"
    return parameters


def test_trigger_templates_render_to_parameters_the_server_accepts():
    for name, deployment in _prefect_deployments().items():
        flow = _load_flow(deployment["entrypoint"])
        for trigger in deployment.get("triggers") or []:
            for event_name in trigger["expect"]:
                parameters = _check_rendered(
                    name, flow, deployment.get("parameters") or {}, trigger["parameters"], event_name
                )
                assert parameters["target_name"] == "llama-chat"
                if "target_version" in parameters:
                    assert parameters["target_version"] == 7


# --- prefect.yaml and `draftsync serve` cannot drift apart ----------------------------------------------------------
def _trigger_key(expect, parameters, match, job_variables) -> tuple:
    """A trigger as both files must agree on: its events, its parameters' names, the labels it matches (the GPU
    count) and the job variables it gives its run."""
    return (
        tuple(sorted(expect)),
        tuple(sorted(parameters or {})),
        json.dumps(match or {}, sort_keys=True),
        json.dumps(job_variables or {}, sort_keys=True),
    )


def _shape(name: str, schedules: list, triggers: list[tuple], concurrency) -> dict:
    return {
        "deployment": name,
        "schedules": sorted(_schedule_key(s) for s in schedules),
        "triggers": sorted(triggers),
        "concurrency": concurrency,
    }


def _yaml_shapes() -> dict[str, dict]:
    shapes = {}
    for name, deployment in _prefect_deployments().items():
        triggers = [
            _trigger_key(t["expect"], t.get("parameters"), t.get("match"), t.get("job_variables"))
            for t in deployment.get("triggers") or []
        ]
        limit = deployment.get("concurrency_limit")
        concurrency = (limit["limit"], limit["collision_strategy"]) if limit else None
        shapes[name] = _shape(name, _rendered_schedules(deployment), triggers, concurrency)
    return shapes


def _served_deployments() -> list:
    from draftsync.flows.prefect_deployments import build_deployments

    return build_deployments()


def _served_shapes() -> dict[str, dict]:
    shapes = {}
    for deployment in _served_deployments():
        triggers = [
            _trigger_key(t.expect, t.parameters, t.match.model_dump(), t.job_variables)
            for t in deployment.triggers or []
        ]
        options = getattr(deployment, "concurrency_options", None)
        strategy = getattr(getattr(options, "collision_strategy", None), "value", None)
        concurrency = (deployment.concurrency_limit, strategy) if deployment.concurrency_limit else None
        shapes[deployment.name] = _shape(
            deployment.name, [s.schedule for s in deployment.schedules or []], triggers, concurrency
        )
    return shapes


def test_deployment_names_are_the_served_ones():
    from draftsync.flows.prefect_deployments import WORK_POOLS

    assert [d["name"] for d in _prefect_yaml()["deployments"]] == list(WORK_POOLS)
    assert [d.name for d in _served_deployments()] == list(WORK_POOLS)


def test_prefect_yaml_and_draftsync_serve_register_the_same_schedules_triggers_and_limits():
    served = _served_shapes()
    for name, shape in _yaml_shapes().items():
        assert shape == served[name], f"prefect.yaml and build_deployments() differ on {name}"


def test_served_flows_are_the_entrypoints_flows():
    for deployment in _served_deployments():
        declared = _prefect_deployments()[deployment.name]["entrypoint"]
        assert _load_flow(declared).name == deployment.flow_name, f"{deployment.name}: {declared} is another flow"


def test_work_pools_are_the_ones_the_code_routes_to():
    from draftsync.flows.prefect_deployments import WORK_POOLS

    assert {name: d["work_pool"]["name"] for name, d in _prefect_deployments().items()} == dict(WORK_POOLS)


def test_served_trigger_templates_render_to_parameters_the_server_accepts():
    """`draftsync serve` registers these triggers: a template the server would refuse never starts a run."""
    for deployment in _served_deployments():
        flow = _load_flow(_prefect_deployments()[deployment.name]["entrypoint"])
        for trigger in deployment.triggers or []:
            for event_name in sorted(trigger.expect):
                _check_rendered(
                    deployment.name, flow, deployment.parameters or {}, trigger.parameters or {}, event_name
                )


# --- GPU job variables for docker and kubernetes pools --------------------------------------------------------
def _gpu_job_variables() -> dict:
    variables = {d["work_pool"].get("job_variables") is not None for d in _prefect_deployments().values()}
    assert variables == {True}
    return _prefect_deployments()["drafter-sync"]["work_pool"]["job_variables"]


def test_gpu_deployments_share_the_gpu_job_variables():
    deployments = _prefect_deployments()
    gpu = [d for d in deployments.values() if d["work_pool"]["name"] == "draftsync-gpu"]
    assert {d["name"] for d in gpu} == {"drafter-sync"}
    assert all(d["work_pool"]["job_variables"] == _gpu_job_variables() for d in gpu)


def test_docker_pool_job_variables_request_nvidia_gpus():

    from docker.types import DeviceRequest
    from prefect.utilities.schema_tools import validate
    from prefect.utilities.templating import apply_values

    job_variables = _gpu_job_variables()
    requests = [DeviceRequest(**r) for r in job_variables["container_create_kwargs"]["device_requests"]]
    assert [(r.driver, r.count, r.capabilities) for r in requests] == [("nvidia", -1, [["gpu"]])]
    template = json.loads((DEPLOY / "work-pools" / "docker-gpu.json").read_text())
    assert not validate(job_variables, template["variables"], ignore_required=True)
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    configuration = apply_values(template["job_configuration"], {**defaults, **job_variables})
    assert configuration["container_create_kwargs"] == job_variables["container_create_kwargs"]
    assert configuration["image"] == "draftsync-gpu:latest"


def test_kubernetes_pool_job_variables_limit_nvidia_gpus():

    from prefect.utilities.schema_tools import validate
    from prefect.utilities.templating import apply_values

    job_variables = _gpu_job_variables()
    template = json.loads((DEPLOY / "work-pools" / "kubernetes-gpu.json").read_text())
    assert not validate(job_variables, template["variables"], ignore_required=True)
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    configuration = apply_values(template["job_configuration"], {**defaults, **job_variables})
    pod = configuration["job_manifest"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"] == "draftsync-gpu:latest"
    # torchrun's ranks talk over NCCL's shared memory: /dev/shm is a memory volume of the given size, not 64 MiB
    (shm,) = [volume for volume in pod["volumes"] if volume["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert "cpu" not in container["resources"]["limits"], "unset variables drop out of the manifest"


def _rendered_pool_job(pool_file: str, job_variables: dict) -> dict:
    """A work pool's job configuration as its worker builds it for a run with these variables."""
    from prefect.utilities.schema_tools import validate
    from prefect.utilities.templating import apply_values

    template = json.loads((DEPLOY / "work-pools" / pool_file).read_text())
    assert not validate(job_variables, template["variables"], ignore_required=True)
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    return apply_values(template["job_configuration"], {**defaults, **job_variables})


def test_each_sync_trigger_gives_its_run_the_gpus_its_event_asks_for():
    """A sync event's draftsync.gpus label picks one trigger, whose job variables (over the deployment's, key by key,
    as Prefect merges a run's) give a docker or kubernetes run that many NVIDIA GPUs."""
    from draftsync.settings import GPU_COUNTS
    from draftsync.tasks import events
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
    from prefect.server.events.schemas.events import Resource

    deployment = _prefect_deployments()["drafter-sync"]
    triggers = [DeploymentEventTrigger.model_validate(spec) for spec in deployment["triggers"]]
    for count in GPU_COUNTS:
        resource = Resource.model_validate(events.target_resource("llama-chat", 7, gpus=str(count)))
        (chosen,) = [t for t in triggers if t.match.matches(resource)]
        job_variables = {**deployment["work_pool"]["job_variables"], **(chosen.job_variables or {})}
        pod = _rendered_pool_job("kubernetes-gpu.json", job_variables)["job_manifest"]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == count
        docker = _rendered_pool_job("docker-gpu.json", job_variables)["container_create_kwargs"]
        assert [(r["driver"], r["count"]) for r in docker["device_requests"]] == [("nvidia", count)]
        assert docker["shm_size"] == "16g"
    unlabelled = Resource.model_validate(events.target_resource("llama-chat", 7))
    assert not [t.name for t in triggers if t.match.matches(unlabelled)], "an event without a GPU count starts nothing"


# --- the env example ----------------------------------------------------------------------------------------
def _settings_variables() -> set[str]:
    from draftsync.settings import Settings

    return {f"DRAFTSYNC_{name.upper()}" for name in Settings.model_fields}


def test_env_example_lists_every_draftsync_variable_the_stack_uses():
    used = set(re.findall(r"\b(DRAFTSYNC_[A-Z0-9_]+)\b", COMPOSE.read_text()))
    used |= {key for key in _env_file(STACK_ENV) if key.startswith("DRAFTSYNC_")}
    used |= set(re.findall(r"\b(DRAFTSYNC_[A-Z0-9_]+)\b", ENTRYPOINT_SCRIPT.read_text()))
    used -= set(COMPOSE_VARIABLES)  # compose's own, from the host shell (docker-compose.yml's header)
    listed = set()
    for file in SECRET_FILES:
        listed |= set(_env_file(DEPLOY / f"{file}.example", include_commented=True))
    assert used - listed == set(), f"no deploy/*.env.example lists {sorted(used - listed)}"
    assert "POSTGRES_PASSWORD" in _env_file(DEPLOY / "postgres.env.example")
    assert "DRAFTSYNC_WEBHOOK_SECRET" in _env_file(DEPLOY / "webhook.env.example")
    assert "DRAFTSYNC_SERVING_TOKEN" in _env_file(DEPLOY / "serving.env.example")


def test_every_draftsync_variable_in_the_env_files_is_a_setting():
    known = _settings_variables()
    for path in (ENV_EXAMPLE, STACK_ENV):
        named = {key for key in _env_file(path, include_commented=True) if key.startswith("DRAFTSYNC_")}
        assert named - known == set(), f"{path.name} names {sorted(named - known)}, which draftsync does not read"


def test_webhook_secret_is_never_shipped_in_the_env_files():
    for path in (ENV_EXAMPLE, STACK_ENV):
        values = _env_file(path)
        for key in ("DRAFTSYNC_WEBHOOK_SECRET", "MLFLOW_WEBHOOK_SECRET_ENCRYPTION_KEY", "DRAFTSYNC_SMTP_PASSWORD"):
            assert not values.get(key), f"{path.name} sets {key}: secrets are generated per installation"


# --- against real servers --------------------------------------------------------------------------------------
def test_postgres_init_script_creates_the_three_databases_and_can_run_again(postgres_server):
    import psycopg

    psql = Path(os.environ.get("DRAFTSYNC_PG_BIN", "")) / "psql"
    psql_command = str(psql) if psql.is_file() else "psql"
    arguments = [
        psql_command,
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        postgres_server.host,
        "-p",
        str(postgres_server.port),
        "-U",
        postgres_server.user,
        "-d",
        "postgres",
        "-f",
        str(DEPLOY / "postgres-init.sql"),
    ]
    for _ in range(2):  # as the image runs it on a fresh volume, then once more: nothing fails
        subprocess.run(arguments, check=True, capture_output=True, text=True, timeout=60)
    with psycopg.connect(
        host=postgres_server.host, port=postgres_server.port, user=postgres_server.user, dbname="postgres"
    ) as connection:
        names = {row[0] for row in connection.execute("SELECT datname FROM pg_database")}
    assert {"mlflow", "prefect", "draftsync"} <= names
