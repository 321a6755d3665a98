"""Security promises: secrets never reach MLflow (params, tags, the store's files) or the logs; model paths
reach child processes as single literal arguments, never through a shell; nothing in the package can run a
shell; a deployments file cannot make the YAML loader run code."""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

import httpx
import pytest
from draftsync.errors import DraftsyncError

PACKAGE = Path(__file__).resolve().parents[3] / "draftsync"
SECRET_NAME = re.compile(r"^DRAFTSYNC_.*(PASSWORD|SECRET)", re.IGNORECASE)
# Path names a shell would act on: command substitution, separators, pipes, globs, quotes, variables, spaces.
HOSTILE_NAMES = {
    "target": "target $(touch pwned-target) ; touch pwned-semicolon & echo 'q\"uote' | cat > pwned-pipe",
    "drafter": "drafter `touch pwned-backtick` && $HOME * ? ~ #",
}


# ---- secrets ------------------------------------------------------------------------------------------------
def secret_values() -> dict[str, str]:
    """Every DRAFTSYNC_*PASSWORD*/*SECRET* variable set now, long enough that a match cannot be chance."""
    return {name: value for name, value in os.environ.items() if SECRET_NAME.match(name) and len(value) >= 8}


def leaks(secrets: dict[str, str], texts: dict[str, str], root: Path | None = None) -> list[str]:
    """Where any secret value appears: in the named texts, or in the bytes of any file under `root`."""
    found = [f"{name} in {where}" for where, text in texts.items() for name, value in secrets.items() if value in text]
    if root is not None:
        for file in sorted(p for p in root.rglob("*") if p.is_file()):
            data = file.read_bytes()
            found += [f"{name} in {file}" for name, value in secrets.items() if value.encode() in data]
    return found


def mlflow_texts(client, model_names: list[str]) -> dict[str, str]:
    """Every param, tag and metric name of the draftsync runs, and every tag of the registered versions."""
    experiment = client.get_experiment_by_name("draftsync")
    texts = {}
    for run in client.search_runs([experiment.experiment_id], max_results=1000):
        texts[f"run {run.info.run_id} params"] = json.dumps(run.data.params)
        texts[f"run {run.info.run_id} tags"] = json.dumps(run.data.tags)
        texts[f"run {run.info.run_id} metrics"] = json.dumps(sorted(run.data.metrics))
    for name in model_names:
        model = client.get_registered_model(name)
        texts[f"model {name}"] = json.dumps({"tags": model.tags, "description": model.description})
        for version in client.search_model_versions(f"name='{name}'"):
            texts[f"model {name} v{version.version}"] = json.dumps(
                {"tags": version.tags, "description": version.description, "source": version.source}
            )
    return texts


def test_secrets_in_the_environment_never_reach_mlflow_or_the_logs(
    workdir, monkeypatch, caplog, tiny_target, tiny_drafter, tmp_path
):
    """Register a target and a drafter, record its validation and promote it, with secrets configured; then
    search MLflow's params and tags, every byte under the work dir (the SQLite store, the artifacts) and the logs."""
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target, register_drafter
    from draftsync.validation.data_checks import DataCheckReport, ExpectationOutcome
    from mlflow import MlflowClient

    from tests.unit.flows.test_sync_result import TRAINING

    planted = {
        "DRAFTSYNC_SMTP_PASSWORD": f"smtp-pw-{uuid.uuid4().hex}",
        "DRAFTSYNC_WEBHOOK_SECRET": f"hook-secret-{uuid.uuid4().hex}",
    }
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    context.reset()
    settings = context.settings()
    assert settings.smtp_password.get_secret_value() == planted["DRAFTSYNC_SMTP_PASSWORD"]
    assert settings.webhook_secret.get_secret_value() == planted["DRAFTSYNC_WEBHOOK_SECRET"]
    secrets = secret_values()
    assert set(planted) <= set(secrets)

    caplog.set_level(logging.DEBUG)
    history = tmp_path / "history.json"
    history.write_text(json.dumps({"train_loss": [[1, 2.0], [2, 1.5]]}))
    version = publish_target.fn("secret-llm", str(tiny_target), {"code": 0.5, "math": 0.5})
    drafter = register_drafter.fn(
        "secret-llm",
        version,
        str(tiny_drafter),
        target_dir=str(tiny_target),
        method="eagle3",
        gamma=2,
        training=TRAINING,
        history_path=str(history),
        data_checks=DataCheckReport(sequences=1, outcomes=[ExpectationOutcome("rows", "rows", 1, "1", True)]),
    )
    registry = context.registry()
    registry.record_validation(
        "secret-llm",
        drafter,
        passed=True,
        metrics={"acceptance_mean": 0.8},
        tags={"draftsync.validation.note": "ok"},
        gamma=2,
    )
    registry.promote("secret-llm", drafter)

    client = MlflowClient(tracking_uri=registry.tracking_uri, registry_uri=registry.tracking_uri)
    texts = mlflow_texts(client, ["secret-llm", "secret-llm-drafter"])
    assert any("draftsync.target.version" in text for text in texts.values())  # the search read the lineage
    texts["logs"] = caplog.text
    assert leaks(secrets, texts, root=workdir) == []

    # The search finds a secret where there is one: it can fail.
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "leak.txt").write_text(f"password={planted['DRAFTSYNC_SMTP_PASSWORD']}")
    assert leaks(secrets, {"a log line": f"secret {planted['DRAFTSYNC_WEBHOOK_SECRET']}"}, tmp_path / "planted") == [
        "DRAFTSYNC_WEBHOOK_SECRET in a log line",
        f"DRAFTSYNC_SMTP_PASSWORD in {tmp_path / 'planted' / 'leak.txt'}",
    ]


# ---- no shell -----------------------------------------------------------------------------------------------
def hostile_copies(tmp_path: Path, tiny_target: Path, tiny_drafter: Path) -> tuple[Path, Path]:
    models = tmp_path / "models"
    target, drafter = models / HOSTILE_NAMES["target"], models / HOSTILE_NAMES["drafter"]
    shutil.copytree(tiny_target, target)
    shutil.copytree(tiny_drafter, drafter)
    return target, drafter


def test_model_paths_with_shell_metacharacters_reach_the_server_as_literal_arguments(
    tiny_target, tiny_drafter, tmp_path, monkeypatch
):
    """The reference server loads the target and drafter from the literal paths; no shell ever sees them."""
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.reference_server import reference_server_command

    target, drafter = hostile_copies(tmp_path, tiny_target, tiny_drafter)
    monkeypatch.chdir(tmp_path)  # where a shell would have run `touch`
    port = free_port()
    argv = reference_server_command(target, drafter, 2, "127.0.0.1", port, "tiny")
    server = ServerProcess(argv, "127.0.0.1", port, tmp_path / "server.log", env={"DRAFTSYNC_TORCH_THREADS": "1"})
    with server:
        server.wait_healthy(timeout=180)
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        assert cmdline == argv  # one argument per path, exactly as given
        assert cmdline[cmdline.index("--target") + 1] == str(target)
        assert cmdline[cmdline.index("--drafter") + 1] == str(drafter)
        reply = httpx.post(
            f"{server.url}/v1/completions",
            timeout=60,
            json={"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0},
        )
        assert reply.status_code == 200, reply.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        drafts = re.search(r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
        assert drafts and float(drafts.group(1)) > 0  # the drafter at the hostile path drafted
    assert sorted(p.name for p in tmp_path.rglob("pwned*")) == []
    assert not list(Path.home().glob("pwned*"))


def test_vllm_launch_keeps_hostile_paths_as_single_arguments(tmp_path):
    """The vLLM argv carries the paths as they are (the drafter inside JSON)."""
    from draftsync.serving.deployment import ServingDeployment

    target, drafter = tmp_path / HOSTILE_NAMES["target"], tmp_path / HOSTILE_NAMES["drafter"]
    launch = ServingDeployment(name="chat", target_name="t", launch="vllm").vllm_launch(target, drafter, "eagle3", 3)
    assert launch.argv[:3] == ["vllm", "serve", str(target)]
    spec = json.loads(launch.argv[launch.argv.index("--speculative-config") + 1])
    assert spec["model"] == str(drafter)


SHELL_FUNCTIONS = {
    ("os", "system"),
    ("os", "popen"),
    ("subprocess", "getoutput"),
    ("subprocess", "getstatusoutput"),
    ("asyncio", "create_subprocess_shell"),
    ("pty", "spawn"),
}


def shell_uses(source: str, filename: str) -> list[str]:
    """Calls that hand a string to a shell: `shell=` anything but False, and the shell-running functions."""
    tree = ast.parse(source, filename)
    direct = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module, alias.name) in SHELL_FUNCTIONS
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        named = (
            isinstance(function, ast.Attribute)
            and isinstance(function.value, ast.Name)
            and (function.value.id, function.attr) in SHELL_FUNCTIONS
        ) or (isinstance(function, ast.Name) and function.id in direct)
        shell = any(
            k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in node.keywords
        )
        if named or shell:
            found.append((node.lineno, f"{filename}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_nothing_in_the_package_runs_a_shell():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    found = [use for file in files for use in shell_uses(file.read_text(), str(file.relative_to(PACKAGE.parent)))]
    assert found == []


def test_the_shell_search_finds_each_way_to_run_a_shell():
    source = """
import os, subprocess, asyncio
from os import system as run
subprocess.run("ls", shell=True)
subprocess.Popen(["ls"], shell=flag)
os.system("ls")
os.popen("ls")
run("ls")
subprocess.getoutput("ls")
asyncio.create_subprocess_shell("ls")
subprocess.run(["ls"], shell=False)
subprocess.run(["ls"])
"""
    assert [line.split(":")[1] for line in shell_uses(source, "example.py")] == [str(n) for n in range(4, 11)]


def test_webhook_signatures_are_compared_only_in_constant_time():
    """No timed assertion: the source must compare the signature with hmac.compare_digest and never with ==."""
    import inspect
    import textwrap

    from draftsync.registry.webhooks import verify_delivery

    tree = ast.parse(textwrap.dedent(inspect.getsource(verify_delivery)))
    digests = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "hmac.compare_digest"
    ]
    assert [sorted(ast.unparse(arg) for arg in call.args) for call in digests] == [["candidate", "expected"]]
    signature_names = {"expected", "candidate", "signatures"}
    plain = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & signature_names
    ]
    assert plain == []


def test_a_deployments_file_cannot_make_the_yaml_loader_run_code(tmp_path, monkeypatch):
    from draftsync.serving.deployment import load_deployments

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "deployments.yaml"
    path.write_text("deployments:\n  - name: chat\n    target_name: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(DraftsyncError) as error:
        load_deployments(path)
    assert f"deployments file {path} is not valid YAML at line 3" in error.value.what
    assert "python/object/apply:os.system" in error.value.what
    assert not (tmp_path / "pwned").exists()
