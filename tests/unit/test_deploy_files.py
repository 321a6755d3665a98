"""Work pools and Kubernetes files give flow runs and the serving service their settings from one declared place.

Each deployment of prefect.yaml, rendered by Prefect's own job-configuration code against each pool type's base job
template (deploy/work-pools/*.json), gets DRAFTSYNC_ENV_FILE, the read-only /etc/draftsync and a persistent work dir;
a process pool (the compose stack) gets none of them. No job variable, template or manifest holds a secret value.
deploy/kubernetes/serving.yaml runs the serving service with its token from a Secret.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = ROOT / "prefect.yaml"
WORK_POOLS_DIR = ROOT / "deploy" / "work-pools"
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"
SERVING_YAML = KUBERNETES_DIR / "serving.yaml"
PRODUCTION_DOC = ROOT / "docs" / "PRODUCTION.md"

ENV_FILE = "/etc/draftsync/draftsync.env"
SETTINGS_DIR = "/etc/draftsync"
WORK_DIR = "/var/lib/draftsync"
POOL_TYPES = ("docker", "kubernetes")
POOLS = {"draftsync-cpu": "cpu", "draftsync-gpu": "gpu"}
# A key that names a secret: its value must never be a literal in a job variable, template or manifest.
SECRET_NAME = re.compile(r"(^|[_.-])(PASSWORD|PASSWD|TOKEN|SECRET|KEY|AUTH_STRING|CREDENTIALS?)($|[_.-])", re.I)
# Keys whose literal value names a Kubernetes object or one of its keys, never the secret itself.
REFERENCE_KEYS = {"key", "env_secret"}


# --- reading and rendering ------------------------------------------------------------------------------------
def _deployments() -> dict[str, dict]:
    return {d["name"]: d for d in yaml.safe_load(PREFECT_YAML.read_text())["deployments"]}


def _template(pool_type: str, pool: str) -> dict:
    return json.loads((WORK_POOLS_DIR / f"{pool_type}-{POOLS[pool]}.json").read_text())


def _run_job_variables(deployment: dict) -> list[dict]:
    """The job variables of each way a run of this deployment starts: by hand (the deployment's), and from each
    trigger (its job variables over the deployment's, key by key, as Prefect merges them)."""
    base = deployment["work_pool"].get("job_variables") or {}
    return [base] + [{**base, **(t.get("job_variables") or {})} for t in deployment.get("triggers") or []]


def _render(template: dict, job_variables: dict) -> dict:
    """The job configuration a worker builds for a run: Prefect's own from_template_and_values (env merged, variable
    defaults applied, placeholders rendered); every key the pool type's configuration has is kept."""
    from prefect.utilities.schema_tools import validate
    from prefect.workers.base import BaseJobConfiguration
    from pydantic import ConfigDict

    class Rendered(BaseJobConfiguration):
        model_config = ConfigDict(extra="allow")

    errors = validate(job_variables, template["variables"], ignore_required=True, raise_on_error=False)
    assert not errors, f"the pool's schema refuses {job_variables}: {[e.message for e in errors]}"
    # no block or Prefect variable is referenced, so the client is never asked
    configuration = asyncio.run(Rendered.from_template_and_values(template, job_variables, client=AsyncMock()))
    return {**configuration.model_dump(exclude_unset=False), **(configuration.model_extra or {})}


def _pod(configuration: dict) -> dict:
    return configuration["job_manifest"]["spec"]["template"]["spec"]


def _secret_literals(node: Any, path: str = "") -> list[str]:
    """Where `node` holds a secret-looking name with a literal value: a mapping's key (an env dict, a job variable,
    a variable's default), a Kubernetes env entry ({name, value}) or a `NAME=value` string."""
    found = []
    if isinstance(node, dict):
        if isinstance(node.get("name"), str) and "value" in node and SECRET_NAME.search(node["name"]):
            if _literal(node["value"]):
                found.append(f"{path}: {node['name']} has the value {node['value']!r}")
        for key, value in node.items():
            where = f"{path}.{key}"
            if isinstance(key, str) and SECRET_NAME.search(key) and key not in REFERENCE_KEYS:
                if _literal(value):
                    found.append(f"{where}: {value!r}")
                if isinstance(value, dict) and _literal(value.get("default")):
                    found.append(f"{where}.default: {value['default']!r}")
            found += _secret_literals(value, where)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += _secret_literals(item, f"{path}[{index}]")
    elif isinstance(node, str):
        match = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)=(.+)$", node)
        if match and SECRET_NAME.search(match[1]) and _literal(match[2]):
            found.append(f"{path}: {node!r}")
    return found


def _literal(value: Any) -> bool:
    """A value written out, not a placeholder Prefect fills in ({{ name }}) and not empty."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and bool(value.strip()) and not re.fullmatch(r"\s*\{\{[^}]*\}\}\s*", value)


def _serving_documents() -> dict[str, dict]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(SERVING_YAML.read_text()) if d}


def _section(text: str, title: str) -> str:
    match = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^##+ |\Z)", text, re.S | re.M)
    assert match, f"docs/PRODUCTION.md has no '### {title}' section"
    return match[1]


# --- every pool's runs: the env file, /etc/draftsync and the work dir ----------------------------------------------
def test_every_deployment_names_the_env_file_and_mounts_in_its_job_variables():
    for name, deployment in _deployments().items():
        variables = deployment["work_pool"]["job_variables"]
        assert variables.get("env_file") == ENV_FILE, f"{name}: env_file is {variables.get('env_file')!r}"
        assert f"{SETTINGS_DIR}:{SETTINGS_DIR}:ro" in variables.get("volumes", []), (
            f"{name}: no read-only /etc/draftsync"
        )
        assert f"draftsync-work:{WORK_DIR}" in variables.get("volumes", []), f"{name}: no named volume for the work dir"
        assert variables.get("env_secret") == "draftsync-env", name
        assert variables.get("deployments_config_map") == "draftsync-deployments", name
        assert variables.get("work_claim") == "draftsync-work", name


@pytest.mark.parametrize("pool_type", POOL_TYPES)
def test_pool_templates_declare_the_env_file_with_its_default(pool_type):
    for pool in POOLS:
        template = _template(pool_type, pool)
        assert template["job_configuration"]["env"] == {"DRAFTSYNC_ENV_FILE": "{{ env_file }}"}, pool
        assert template["variables"]["properties"]["env_file"]["default"] == ENV_FILE, pool
        if pool_type == "kubernetes":
            defaults = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
            assert defaults["env_secret"] == "draftsync-env"
            assert defaults["deployments_config_map"] == "draftsync-deployments"
            assert defaults["work_claim"] == "draftsync-work"


def test_docker_runs_get_the_env_file_the_settings_folder_and_the_work_volume():
    for name, deployment in _deployments().items():
        pool = deployment["work_pool"]["name"]
        for job_variables in _run_job_variables(deployment):
            for extra_env in ({}, {"env": {"DRAFTSYNC_DEBUG": "1"}}):  # a run's own `env` keeps the env file
                job = _render(_template("docker", pool), {**job_variables, **extra_env})
                assert job["env"]["DRAFTSYNC_ENV_FILE"] == ENV_FILE, f"{name} on {pool}: {job['env']}"
                assert job["env"].get("DRAFTSYNC_DEBUG") == extra_env.get("env", {}).get("DRAFTSYNC_DEBUG")
                assert f"{SETTINGS_DIR}:{SETTINGS_DIR}:ro" in job["volumes"], f"{name}: {job['volumes']}"
                assert f"draftsync-work:{WORK_DIR}" in job["volumes"], f"{name}: {job['volumes']}"
                requests = (job.get("container_create_kwargs") or {}).get("device_requests") or []
                assert bool(requests) == (pool == "draftsync-gpu"), f"{name} on {pool}: GPUs {requests}"


def test_kubernetes_runs_mount_the_secret_the_config_map_and_the_claim():
    for name, deployment in _deployments().items():
        pool = deployment["work_pool"]["name"]
        for job_variables in _run_job_variables(deployment):
            job = _render(_template("kubernetes", pool), {**job_variables, "env": {"DRAFTSYNC_DEBUG": "1"}})
            assert job["env"] == {"DRAFTSYNC_ENV_FILE": ENV_FILE, "DRAFTSYNC_DEBUG": "1"}, name
            pod = _pod(job)
            container = pod["containers"][0]
            volumes = {volume["name"]: volume for volume in pod["volumes"]}
            mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
            settings = mounts[SETTINGS_DIR]
            assert settings.get("readOnly") is True, f"{name}: /etc/draftsync must be read-only"
            sources = volumes[settings["name"]]["projected"]["sources"]
            secrets = [s["secret"] for s in sources if "secret" in s]
            config_maps = [s["configMap"] for s in sources if "configMap" in s]
            assert secrets == [
                {"name": "draftsync-env", "items": [{"key": "draftsync.env", "path": "draftsync.env"}]}
            ], name
            assert [c["name"] for c in config_maps] == ["draftsync-deployments"], name
            assert volumes[mounts[WORK_DIR]["name"]]["persistentVolumeClaim"] == {"claimName": "draftsync-work"}
            limits = container["resources"]["limits"]
            if pool == "draftsync-gpu":
                assert limits["nvidia.com/gpu"] == job_variables["gpu_limit"], name
                assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
            else:
                assert "nvidia.com/gpu" not in limits and "/dev/shm" not in mounts, f"{name} on the CPU pool"


def test_process_pool_runs_keep_their_workers_environment():
    """The compose stack's process pools declare none of these variables: a run there gets no DRAFTSYNC_ENV_FILE
    (its worker has no /etc/draftsync/draftsync.env, and a named but missing env file fails the run)."""
    from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    for name, deployment in _deployments().items():
        for job_variables in _run_job_variables(deployment):
            configuration = asyncio.run(
                ProcessJobConfiguration.from_template_and_values(template, job_variables, client=AsyncMock())
            )
            assert "DRAFTSYNC_ENV_FILE" not in configuration.env, f"{name}: a process run would read {ENV_FILE}"


# --- no secret values ------------------------------------------------------------------------------------------
def test_no_job_variable_template_or_manifest_holds_a_secret_value():
    found = []
    for name, deployment in _deployments().items():
        found += _secret_literals(deployment["work_pool"].get("job_variables"), f"prefect.yaml {name}")
        for trigger in deployment.get("triggers") or []:
            found += _secret_literals(trigger.get("job_variables"), f"prefect.yaml {name} {trigger['name']}")
    found += _secret_literals(yaml.safe_load(PREFECT_YAML.read_text()).get("definitions"), "prefect.yaml definitions")
    for path in sorted(WORK_POOLS_DIR.glob("*.json")):
        found += _secret_literals(json.loads(path.read_text()), path.name)
    for path in sorted(KUBERNETES_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found += _secret_literals(document, path.name)
            assert (document or {}).get("kind") != "Secret", f"{path.name} ships a Secret: create it from a file"
    assert not found, "secret values where the Prefect UI, argv or a manifest shows them:\n" + "\n".join(found)


def test_the_secret_check_finds_literal_secrets_and_passes_references():
    leaks = [
        {"env": {"MLFLOW_TRACKING_PASSWORD": "hunter2"}},
        {"env": {"DRAFTSYNC_SERVING_TOKEN": "abc"}},
        {"token": "abc"},
        {"variables": {"properties": {"api_key": {"type": "string", "default": "abc"}}}},
        {"containers": [{"env": [{"name": "PREFECT_API_AUTH_STRING", "value": "admin:pw"}]}]},
        {"args": ["DRAFTSYNC_SMTP_PASSWORD=pw"]},
    ]
    for leak in leaks:
        assert _secret_literals(leak), f"not caught: {leak}"
    fine = [
        {"env": {"DRAFTSYNC_ENV_FILE": "/etc/draftsync/draftsync.env", "DRAFTSYNC_SERVING_TOKEN": "{{ token }}"}},
        {"env_secret": "draftsync-env", "items": [{"key": "draftsync.env", "path": "draftsync.env"}]},
        {"name": "DRAFTSYNC_SERVING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "T"}}},
        {"env": {"MLFLOW_TRACKING_PASSWORD": ""}},
    ]
    for node in fine:
        assert not _secret_literals(node), f"flagged: {node}"


# --- the rollout runs on the CPU pool --------------------------------------------------------------------------
def test_rollout_is_on_the_cpu_pool_without_gpu_job_variables():
    from draftsync.flows.prefect_deployments import WORK_POOLS

    rollout = _deployments()["rollout"]
    assert rollout["work_pool"]["name"] == "draftsync-cpu"
    assert WORK_POOLS["rollout"] == "draftsync-cpu"
    assert "draftsync-cpu" in rollout["tags"] and "draftsync-gpu" not in rollout["tags"]
    for job_variables in _run_job_variables(rollout):
        assert not {"gpu_limit", "container_create_kwargs", "shm_size"} & set(job_variables)
        assert job_variables["image"] == "draftsync:latest"


# --- deploy/kubernetes/serving.yaml -------------------------------------------------------------------------------
def test_serving_deployment_runs_the_serving_service_with_its_token_from_a_secret():
    documents = _serving_documents()
    deployment = documents["Deployment/serving"]
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["draftsync", "serving", "run", "--host", "0.0.0.0", "--port", "8100"]
    assert container["image"] == "draftsync-gpu:latest"
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", 8100)
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1

    env = {entry["name"]: entry for entry in container["env"]}
    for name in (
        "DRAFTSYNC_SERVING_TOKEN",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    ):
        assert "value" not in env[name], f"{name} is written into the manifest"
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert (reference["name"], reference["key"]) == ("draftsync-serving", name)
    assert not env["DRAFTSYNC_SERVING_TOKEN"]["valueFrom"]["secretKeyRef"].get("optional"), "the token is required"
    assert env["DRAFTSYNC_DEPLOYMENTS_FILE"]["value"] == "/etc/draftsync/deployments.yaml"

    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: volumes[mount["name"]] for mount in container["volumeMounts"]}
    assert mounts[SETTINGS_DIR]["configMap"]["name"] == "draftsync-deployments"
    assert {"key": "deployments.yaml", "path": "deployments.yaml"} in mounts[SETTINGS_DIR]["configMap"]["items"]
    claim = mounts[WORK_DIR]["persistentVolumeClaim"]["claimName"]
    assert f"PersistentVolumeClaim/{claim}" in documents, f"serving.yaml does not declare the claim {claim}"
    assert mounts["/dev/shm"]["emptyDir"]["medium"] == "Memory"


def test_serving_service_exposes_the_admin_api_and_every_router_port():
    documents = _serving_documents()
    service = documents["Service/serving"]
    pod_labels = documents["Deployment/serving"]["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = documents["Deployment/serving"]["spec"]["template"]["spec"]["containers"][0]
    named = {port["name"]: port["containerPort"] for port in container["ports"]}
    exposed = {port["port"]: named.get(port["targetPort"], port["targetPort"]) for port in service["spec"]["ports"]}
    routers = {d["port"] for d in yaml.safe_load((ROOT / "deploy" / "deployments.yaml").read_text())["deployments"]}
    for port in {8100} | routers:
        assert exposed.get(port) == port, f"the Service does not reach port {port} of the pod: {exposed}"


def test_kubernetes_readme_creates_the_objects_from_files():
    text = (KUBERNETES_DIR / "README.md").read_text()
    commands = [line.strip() for line in text.splitlines() if line.strip().startswith("kubectl create")]
    assert not [c for c in commands if "--from-literal" in c], "a value in kubectl's argv"
    created = {re.match(r"kubectl create (?:secret generic|configmap) (\S+)", c)[1] for c in commands}  # type: ignore[index]
    assert {"draftsync-env", "draftsync-serving", "draftsync-deployments"} <= created
    assert all("--from-file" in c or "--from-env-file" in c for c in commands), commands


# --- docs/PRODUCTION.md ------------------------------------------------------------------------------------------
def test_production_doc_creates_both_pools_and_starts_a_worker_for_each():
    section = _section(PRODUCTION_DOC.read_text(), "Work pools without compose")
    for pool_type in POOL_TYPES:
        for pool, kind in POOLS.items():
            template = f"deploy/work-pools/{pool_type}-{kind}.json"
            assert (ROOT / template).exists()
            assert f"prefect work-pool create {pool} --type {pool_type} --base-job-template {template}" in section
            assert f"prefect worker start --pool {pool} --type {pool_type}" in section
    for variable in (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "PREFECT_API_URL",
        "PREFECT_API_AUTH_STRING",
        "DRAFTSYNC_MONITOR_DB_URL",
        "DRAFTSYNC_SERVING_URL",
        "DRAFTSYNC_SERVING_TOKEN",
        "DRAFTSYNC_SMTP_HOST",
        "DRAFTSYNC_PREFECT_UI_URL",
        "DRAFTSYNC_MLFLOW_UI_URL",
        ENV_FILE,
    ):
        assert variable in section, f"the section does not say {variable} goes into the env file"
