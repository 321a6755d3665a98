"""The serving service's admin API in process: who may change what a deployment serves, and what a bad call gets."""

from __future__ import annotations

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.servers import PairSwitch
from draftsync.serving_service.app import ServedPairs, create_app
from starlette.testclient import TestClient

TOKEN = "the-token"
PLAIN = {"target_version": 2, "drafter_version": None, "gamma": 0, "method": None, "schedule": None}
SPECS = {
    "chat": ServingDeployment(name="chat", target_name="llama-chat", launch="reference", port=8000),
    "k8s": ServingDeployment(name="k8s", target_name="llama-chat", launch="external", endpoint="http://chat:8000"),
}


class Service:
    """The app over a record of the pairs it was asked to serve (the launches are the system test's)."""

    def __init__(self, pairs: ServedPairs, failure: DraftsyncError | None = None):
        self.served: list = []
        self.failure = failure
        self.pairs = pairs
        self.client = TestClient(create_app(TOKEN, lambda: SPECS, self.serve, self.record, pairs, self.captured))

    def serve(self, spec, pair) -> PairSwitch:
        if self.failure is not None:
            raise self.failure
        self.served.append((spec.name, pair))
        return PairSwitch("http://0.0.0.0:8000", None, None, {"argv": ["vllm", "serve"]}, ["switched"])

    def captured(self, spec, after_id: int) -> list[dict]:
        rows = [{"id": 1, "prompt": "def f(x):"}, {"id": 2, "prompt": "The sum of"}] if spec.name == "chat" else []
        return [row for row in rows if row["id"] > after_id]

    def record(self, name: str) -> dict | None:
        if name != "chat" or not self.served:
            return None
        return {"router": {"port": 8000, "token_file": "/secret/place"}, "backend": {"endpoint": "http://x:1"}}


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer stale"}, 403), ({"Authorization": "Basic the-token"}, 401)],
)
def test_a_call_without_the_token_changes_nothing(headers, status, tmp_path):
    service = Service(ServedPairs(tmp_path / "pairs.json"))

    answer = service.client.put("/draftsync/deployments/chat/pair", json=PLAIN, headers=headers)

    assert answer.status_code == status
    assert service.served == []
    assert service.client.get("/draftsync/deployments", headers=headers).status_code == status
    assert service.client.get("/healthz").status_code == 200  # health needs no token


def test_a_pair_is_served_with_the_deployments_own_target_and_drafter_names(tmp_path):
    service = Service(ServedPairs(tmp_path / "pairs.json"))
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    answer = service.client.put(
        "/draftsync/deployments/chat/pair",
        json={**PLAIN, "drafter_version": 4, "gamma": 3, "method": "eagle3"},
        headers=bearer,
    )

    assert answer.status_code == 200, answer.text
    assert answer.json()["router_port"] == 8000 and answer.json()["switch"]["steps"] == ["switched"]
    [(name, pair)] = service.served
    assert (name, pair.target_name, pair.target_version, pair.drafter_name, pair.drafter_version, pair.gamma) == (
        "chat",
        "llama-chat",
        2,
        "llama-chat-drafter",
        4,
        3,
    )
    listed = service.client.get("/draftsync/deployments", headers=bearer).json()["deployments"]
    assert listed["chat"]["router"] == {"port": 8000}  # where the router's own token lies is not given out
    assert (listed["chat"]["target_version"], listed["chat"]["drafter_version"], listed["chat"]["gamma"]) == (2, 4, 3)
    assert listed["k8s"] is None


@pytest.mark.parametrize(
    ("path", "body", "status", "said"),
    [
        ("chat", {**PLAIN, "target_version": 0}, 400, "target_version 0 is not a version number"),
        ("chat", {**PLAIN, "gamma": True}, 400, "gamma True"),
        ("chat", [1, 2], 400, "not a JSON object"),
        ("chta", PLAIN, 404, "no deployment is called 'chta'; known: chat, k8s"),
        ("k8s", PLAIN, 409, "launch: external"),
    ],
)
def test_a_bad_call_is_refused_naming_what_is_wrong(path, body, status, said, tmp_path):
    service = Service(ServedPairs(tmp_path / "pairs.json"))

    answer = service.client.put(
        f"/draftsync/deployments/{path}/pair", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
    )

    assert answer.status_code == status
    assert said in answer.json()["error"] and answer.json()["fix"]
    assert service.served == []


def test_a_candidate_that_fails_comes_back_with_its_error_and_fix(tmp_path):
    pairs = ServedPairs(tmp_path / "pairs.json")
    service = Service(pairs, DraftsyncError("vLLM for chat did not start: CUDA out of memory", "give it a GPU"))

    answer = service.client.put(
        "/draftsync/deployments/chat/pair", json=PLAIN, headers={"Authorization": f"Bearer {TOKEN}"}
    )

    assert answer.status_code == 502
    assert answer.json() == {"error": "vLLM for chat did not start: CUDA out of memory", "fix": "give it a GPU"}
    assert pairs.all() == {}  # a pair that was not served is not served again on a restart


def test_a_restarted_service_serves_each_remembered_pair_again(tmp_path):
    import time

    first = Service(ServedPairs(tmp_path / "pairs.json"))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    asked = {**PLAIN, "drafter_version": 4, "gamma": 3, "method": "eagle3"}
    assert first.client.put("/draftsync/deployments/chat/pair", json=asked, headers=bearer).status_code == 200

    again = Service(ServedPairs(tmp_path / "pairs.json"))
    with again.client:  # the app's start
        deadline = time.monotonic() + 30
        while not again.served and time.monotonic() < deadline:
            time.sleep(0.05)

    assert again.served == first.served


def test_the_captured_traffic_is_read_after_a_row_with_the_token_only(tmp_path):
    service = Service(ServedPairs(tmp_path / "pairs.json"))
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    after_one = service.client.get("/draftsync/deployments/chat/traffic?after_id=1", headers=bearer)
    bad = service.client.get("/draftsync/deployments/chat/traffic?after_id=-1", headers=bearer)

    assert after_one.json() == {"capture": False, "rows": [{"id": 2, "prompt": "The sum of"}]}
    assert bad.status_code == 400 and "after_id '-1'" in bad.json()["error"]
    assert service.client.get("/draftsync/deployments/chat/traffic").status_code == 401
