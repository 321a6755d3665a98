"""The production compose stack, profile `cpu`, each service in its own container (make test-stack).

From the host, only through the published loopback ports: a tiny target version registered through MLflow's API
becomes a webhook delivery, a completed drafter-sync run (on the draftsync-gpu pool's CPU worker), a registered
drafter, a rollout on the serving service (its router answering /v1/completions), scrapes, then a forced acceptance
drop, the scrape's fallback (the serving service switches the deployment to plain) and the alert e-mail in the
mail sink. And the stack is closed: MLflow, Prefect and the serving service's admin API refuse calls without their
credentials, and every port is published on 127.0.0.1 only.

How the drop is forced: the stack's deployments file gives the deployment a fallback_threshold of 0.95 over a
1-minute window with fallback_min_draft_tokens 30, above what the tiny drafter (40 training steps) accepts on any
traffic. The first scrape that sees 30 drafted tokens in its window falls back: in the runs so far, the one after the
test's first completions, before the prose at temperature 1 the test sends until then was needed. So this shows the
guard's path through the stack (scrape on the CPU worker, switch at the serving service, alert), not a drift caught
by a realistic threshold; tests/integration/flows/test_rollout.py holds the guard's arithmetic.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

pytestmark = [pytest.mark.stack, pytest.mark.timeout(3600)]

PROSE = [
    "Once upon a time, in a quiet village by the sea,",
    "The history of the printing press begins",
    "Dear committee, I am writing to express",
    "She opened the old letter and read",
]


def wait_for(what: str, check: Callable, timeout: float, every: float = 3.0):
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            found = check()
        except httpx.HTTPError as error:  # a service restarting: ask again
            found, last_error = None, error
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last error: {last_error})")


def basic(user_password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(user_password.encode()).decode()}


def mlflow_auth(running) -> tuple[str, str]:
    return running.secrets["MLFLOW_TRACKING_USERNAME"], running.secrets["MLFLOW_TRACKING_PASSWORD"]


def prefect_post(running, path: str, body: dict) -> list | dict:
    answer = httpx.post(
        f"{running.url('prefect')}/api{path}",
        json=body,
        headers=basic(running.secrets["PREFECT_API_AUTH_STRING"]),
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def served(running) -> dict:
    answer = httpx.get(
        f"{running.url('serving')}/draftsync/deployments",
        headers={"Authorization": f"Bearer {running.secrets['DRAFTSYNC_SERVING_TOKEN']}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()["deployments"]


def completion(running, prompt: str, temperature: float = 0.0, max_tokens: int = 16) -> dict:
    answer = httpx.post(
        f"{running.url('router')}/v1/completions",
        json={"model": "chat", "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature},
        timeout=120,
    )
    answer.raise_for_status()
    return answer.json()


def runs_of(running, deployment: str) -> list[dict]:
    deployments = prefect_post(running, "/deployments/filter", {"deployments": {"name": {"any_": [deployment]}}})
    if not deployments:
        return []
    return prefect_post(
        running, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deployments[0]["id"]]}}}
    )


def test_ports_are_published_on_loopback_only(running_stack):
    stack = running_stack.stack
    published = {}
    for service, name in stack.containers().items():
        for line in stack.podman("port", name, check=False).stdout.splitlines():
            published.setdefault(service, []).append(line.split("->", 1)[1].strip())
    assert set(published) == {"mlflow", "prefect", "webhooks", "serving-cpu", "mailpit"}, published
    for service, addresses in published.items():
        assert all(address.startswith("127.0.0.1:") for address in addresses), (service, addresses)


def test_mlflow_and_prefect_refuse_calls_without_their_login(running_stack):
    mlflow, prefect = running_stack.url("mlflow"), running_stack.url("prefect")
    search = f"{mlflow}/api/2.0/mlflow/registered-models/search"
    user, password = mlflow_auth(running_stack)
    assert httpx.get(f"{mlflow}/health", timeout=30).status_code == 200  # health answers anyone
    assert httpx.get(search, timeout=30).status_code == 401
    assert httpx.get(search, auth=(user, password + "x"), timeout=30).status_code == 401
    assert httpx.get(search, auth=(user, password), timeout=30).status_code == 200

    assert httpx.get(f"{prefect}/api/health", timeout=30).status_code == 200
    assert httpx.post(f"{prefect}/api/flows/filter", json={}, timeout=30).status_code == 401
    wrong = basic(running_stack.secrets["PREFECT_API_AUTH_STRING"] + "x")
    assert httpx.post(f"{prefect}/api/flows/filter", json={}, headers=wrong, timeout=30).status_code == 401
    assert isinstance(prefect_post(running_stack, "/flows/filter", {}), list)


def test_a_registered_target_is_synced_served_guarded_and_alerted_through_the_stack(
    running_stack, tmp_path, monkeypatch
):
    from draftsync.registry.model_registry import Registry
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.targets import describe_target
    from draftsync.tasks.traffic import spec_decode_counts

    running = running_stack
    mark = running.stack.mark
    user, password = mlflow_auth(running)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", user)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    target_dir = build_target(builtin_recipe(1, "test"), tmp_path / "target-cache")

    # A model team registers a target version through MLflow's API, from the host, and points `production` at it.
    mark("test start")
    registry = Registry(running.url("mlflow"))
    facts = {**describe_target(target_dir), "task_mix": {"code": 0.5, "math": 0.5}}
    version = registry.register_target("stack-llm", target_dir, target_tags(**facts))
    registry.set_target_alias("stack-llm", "production", version)
    mark("target registered")

    def delivered():
        events = prefect_post(
            running,
            "/events/filter",
            {"filter": {"event": {"name": ["draftsync.target.version.created"]}}, "limit": 10},
        )
        return [e for e in events.get("events", []) if e["resource"].get("draftsync.target.name") == "stack-llm"]

    wait_for("the webhook delivery (draftsync.target.version.created)", delivered, 180)
    mark("webhook delivered")

    def synced():
        runs = runs_of(running, "drafter-sync")
        final = [r for r in runs if r["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")]
        return final[0] if final else None

    run = wait_for("the drafter-sync run", synced, 1800, every=5)
    assert run["state"]["type"] == "COMPLETED", (run["state"], running.stack.log_tail("worker-gpu-on-cpu", 80))
    mark("sync done")
    from mlflow import MlflowClient

    drafters = MlflowClient(running.url("mlflow")).search_model_versions("name='stack-llm-drafter'")
    assert drafters, "no drafter version registered"
    drafter = max(int(v.version) for v in drafters)

    def rolled_out():
        chat = served(running).get("chat")
        return chat if chat and chat.get("drafter_version") == drafter else None

    before = wait_for("the rollout on the serving service", rolled_out, 900, every=5)
    mark("rollout")
    first = completion(running, "def add(a, b):")
    assert spec_decode_counts(first)["draft_tokens"] > 0, first  # the router answers, speculating

    # The admin API refuses calls without the token, or with another one, and the pair stays as it was.
    pair = f"{running.url('serving')}/draftsync/deployments/chat/pair"
    plain = {"target_version": version, "drafter_version": None, "gamma": 0, "method": None, "schedule": None}
    refused = [
        httpx.put(pair, json=plain, timeout=30),
        httpx.put(pair, json=plain, headers={"Authorization": "Bearer not-the-token"}, timeout=30),
        httpx.get(f"{running.url('serving')}/draftsync/deployments", timeout=30),
    ]
    assert [r.status_code for r in refused] == [401, 403, 401]
    assert served(running)["chat"] == before

    # Scrapes are recorded: acceptance-scrape runs complete on the CPU worker after the rollout.
    rolled_at = datetime.now(UTC).isoformat()

    def scraped():
        runs = runs_of(running, "acceptance-scrape")
        return [r for r in runs if r["state"]["type"] == "COMPLETED" and (r.get("end_time") or "") > rolled_at]

    wait_for("a completed acceptance-scrape after the rollout", scraped, 300, every=5)
    mark("scrape recorded")

    def fell_back():
        chat = served(running).get("chat")
        return chat if chat and chat.get("drafter_version") is None else None

    # The forced drop: prose at temperature 1 until the drafter has drafted well past fallback_min_draft_tokens (or a
    # scrape in between already switched speculation off: then nothing is drafted any more).
    drafted = 0
    while drafted < 120 and not fell_back():
        for prompt in PROSE:
            drafted += spec_decode_counts(completion(running, prompt, temperature=1.0, max_tokens=24))["draft_tokens"]
    mark("prose sent")

    after = wait_for("the scrape's fallback (speculation off at the serving service)", fell_back, 300, every=5)
    mark("fallback")
    assert after["backend"]["endpoint"] != before["backend"]["endpoint"], after  # a plain server took the traffic
    assert spec_decode_counts(completion(running, "def add(a, b):"))["draft_tokens"] == 0

    def mailed():
        messages = httpx.get(f"{running.url('mailpit')}/api/v1/messages", timeout=30).json()["messages"]
        return [m for m in messages if "chat fell back to plain decoding" in m["Subject"]]

    mails = wait_for("the alert e-mail in the mail sink", mailed, 300, every=5)
    mark("mail")
    print("alert:", json.dumps(mails[0]["Subject"]))
    print("timeline (s since the stack's start):", json.dumps(running.stack.timeline))
