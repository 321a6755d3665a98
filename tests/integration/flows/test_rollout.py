"""Rollout through real subprocesses: the router, the servers behind it (the reference server, and real vLLM in
`make test-vllm`), MLflow aliases and the monitor store."""

from __future__ import annotations

import threading
from email import policy
from email.parser import BytesParser

import httpx
import pytest

pytestmark = pytest.mark.slow


# The same rollout on both engines; the vllm runs need the engine `make vllm` installs.
@pytest.fixture(params=["reference", pytest.param("vllm", marks=pytest.mark.vllm)])
def launch(request) -> str:
    if request.param == "vllm":
        request.getfixturevalue("vllm_engine")
    return request.param


def _gamma(completion: dict) -> int:
    from draftsync.tasks.traffic import spec_decode_counts

    return spec_decode_counts(completion)["gamma"]


def _draft_tokens(completion: dict) -> int:
    from draftsync.tasks.traffic import spec_decode_counts

    return spec_decode_counts(completion)["draft_tokens"]


def _drafter(registry, target_name: str, target_version: int, target_dir, tmp_path, gamma: int, seed: int = 0) -> int:
    """A validated drafter version (random weights: what matters here is which one serves)."""
    from tests.support.tiny_models import build_tiny_drafter

    path = build_tiny_drafter(target_dir, tmp_path / f"drafter-{gamma}-{seed}", gamma=gamma, seed=seed)
    return registry.register_drafter(target_name, target_version, path, "eagle3", gamma, {}, validation_passed=True)


class Client(threading.Thread):
    """Sends completions to the deployment's address without pause until stopped; keeps every answer."""

    def __init__(self, endpoint: str, model: str):
        super().__init__(daemon=True)
        self.endpoint, self.model = endpoint, model
        self.stop = threading.Event()
        self.answers: list[dict] = []
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.endpoint, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    response = client.post(
                        "/v1/completions",
                        json={"model": self.model, "prompt": "def add(a, b):", "max_tokens": 6, "temperature": 0},
                    )
                except httpx.HTTPError as error:
                    self.failures.append(f"{type(error).__name__}: {error}")
                    continue
                if response.status_code != 200:
                    self.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")
                else:
                    self.answers.append(response.json())


# CI's vLLM smoke tier runs it on vLLM; the reference engine's run is the system tier's (make test-all).
@pytest.mark.smoke
@pytest.mark.parametrize(
    "launch",
    [pytest.param("reference", marks=pytest.mark.system), pytest.param("vllm", marks=pytest.mark.vllm)],
    indirect=True,
)
def test_swapping_drafters_under_load_fails_no_request(workdir, built_targets, tmp_path, launch):
    from draftsync.flows.rollout import rollout
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("swap-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    first = _drafter(registry, "swap-llm", v1, built_targets[1], tmp_path, gamma=2)
    registry.promote("swap-llm", first)
    deployment = ServingDeployment(name="swap", target_name="swap-llm", launch=launch)
    before = rollout(deployment)
    assert (before["state"], before["drafter_version"]) == ("serving", first)

    client = Client(before["endpoint"], "swap")
    client.start()
    try:
        while len(client.answers) < 3:
            client.stop.wait(0.1)
        second = _drafter(registry, "swap-llm", v1, built_targets[1], tmp_path, gamma=3, seed=1)
        after = rollout(deployment, drafter_version=second)
        served_before_end = len(client.answers)
        while len(client.answers) < served_before_end + 3:
            client.stop.wait(0.1)
    finally:
        client.stop.set()
        client.join(timeout=60)

    assert client.failures == []
    assert after["endpoint"] == before["endpoint"]  # clients kept one address
    assert after["replaced"] is not None and after["replaced"] != after["endpoint"]
    gammas = [_gamma(a) for a in client.answers]
    assert gammas[0] == 2 and gammas[-1] == 3
    assert gammas == sorted(gammas)  # once switched, never back to the old server
    assert registry.alias_version("swap-llm-drafter", "production") == second
    assert registry.alias_version("swap-llm-drafter", "previous") == first
    pair = context.store().pairs.get("swap")
    assert (pair.drafter_version, pair.gamma, pair.state) == (second, 3, "serving")
    with pytest.raises(httpx.TransportError):  # the old server was stopped once drained
        httpx.get(f"{after['replaced']}/health", timeout=5)


def test_a_canary_under_the_threshold_rolls_back_by_itself_and_aliases_end_where_they_began(
    workdir, built_targets, tmp_path, launch
):
    from draftsync.flows.rollout import rollout
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("canary-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    good = _drafter(registry, "canary-llm", v1, built_targets[1], tmp_path, gamma=2)
    registry.promote("canary-llm", good)
    deployment = ServingDeployment(name="canary", target_name="canary-llm", launch=launch)
    rollout(deployment)
    bad = _drafter(registry, "canary-llm", v1, built_targets[1], tmp_path, gamma=3, seed=1)
    aliases_before = registry.alias_snapshot("canary-llm")

    # A random drafter accepts far less than 0.99: the canary must see it and undo the rollout.
    result = rollout(deployment, drafter_version=bad, canary_requests=3, canary_threshold=0.99)

    assert result["canary"]["passed"] is False and result["canary"]["acceptance"] < 0.99
    assert result["rolled_back"] and result["drafter_version"] == good
    assert registry.alias_snapshot("canary-llm") == aliases_before
    pair = context.store().pairs.get("canary")
    assert (pair.drafter_version, pair.state) == (good, "serving")
    answer = httpx.post(
        f"{result['endpoint']}/v1/completions",
        timeout=60,
        json={"model": "canary", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0},
    ).json()
    assert _gamma(answer) == 2  # the good drafter serves again
    subjects = [
        BytesParser(policy=policy.default).parsebytes(p.read_bytes())["Subject"]
        for p in (workdir / "outbox").glob("*.eml")
    ]
    assert any("rolled back by its canary" in s for s in subjects), subjects


@pytest.mark.system  # make test-system
def test_a_target_alias_moved_with_no_drafter_is_served_plain_alerted_and_synced(workdir, built_targets, tmp_path):
    from draftsync.flows.rollout import rollout
    from draftsync.profiles import profile, validation_profile
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("pair-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    registry.promote("pair-llm", _drafter(registry, "pair-llm", v1, built_targets[1], tmp_path, gamma=2))
    deployment = ServingDeployment(name="pair", target_name="pair-llm")
    rollout(deployment)
    v2 = publish_target("pair-llm", str(built_targets[2]), {"code": 0.25, "math": 0.25, "prose": 0.5})  # alias moves

    tiny = profile("test").model_copy(
        update={
            "train_steps": 10,
            "training_texts": 30,
            "generated_samples": 4,
            "checkpoint_every": 0,
            "validation": validation_profile("test").model_copy(
                update={
                    "requests": 2,
                    "max_tokens": 8,
                    "gamma_range": (2, 2),
                    "sweep_requests": 1,
                    "stress_requests": 0,
                    "long_max_tokens": 8,
                }
            ),
        }
    )
    result = rollout(deployment, sync_profile=tiny)

    assert result["state"] == "fallback" and result["drafter_version"] is None
    assert result["target_version"] == v2
    assert result["speculative_config"] is None and "--speculative-config" not in result["argv"]
    pair = context.store().pairs.get("pair")
    assert (pair.target_version, pair.drafter_version) == (v2, None)
    completion = httpx.post(
        f"{result['endpoint']}/v1/completions",
        timeout=60,
        json={"model": "pair", "prompt": "def f(x):\n", "max_tokens": 4, "temperature": 0},
    ).json()
    assert _draft_tokens(completion) == 0  # speculation off: never v1's drafter on v2
    subjects = [
        BytesParser(policy=policy.default).parsebytes(p.read_bytes())["Subject"]
        for p in (workdir / "outbox").glob("*.eml")
    ]
    assert any("speculation off" in s and "pair" in s for s in subjects), subjects
    assert any("sync requested" in step for step in result["steps"])
    assert any(step.startswith("sync ran") for step in result["steps"])
    assert registry.drafter_for_target_version("pair-llm", v2, validated_only=False) is not None


def test_live_acceptance_under_the_threshold_falls_back_to_plain_decoding_and_alerts(
    workdir, built_targets, tmp_path, launch
):
    from draftsync.flows.rollout import rollout
    from draftsync.flows.scrape import scrape
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("guard-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    registry.promote("guard-llm", _drafter(registry, "guard-llm", v1, built_targets[1], tmp_path, gamma=3))
    spec = ServingDeployment(
        name="guard", target_name="guard-llm", fallback_threshold=0.95, fallback_min_draft_tokens=30, launch=launch
    )
    served = rollout(spec)
    with httpx.Client(base_url=served["endpoint"], timeout=60) as client:
        for prompt in ("def add(a, b):", "The sum of 12 and 30", "Permission is hereby"):
            client.post(
                "/v1/completions", json={"model": "guard", "prompt": prompt, "max_tokens": 16, "temperature": 0}
            ).raise_for_status()

    lenient = scrape(deployments=[spec.model_copy(update={"fallback_threshold": 0.0})])
    assert lenient["guard"][0]["action"] == "none" and lenient["guard"][0]["draft_tokens"] >= 30
    assert context.store().pairs.get("guard").state == "serving"
    with httpx.Client(base_url=served["endpoint"], timeout=60) as client:
        for prompt in ("def add(a, b):", "The sum of 12 and 30", "Permission is hereby"):
            client.post(
                "/v1/completions", json={"model": "guard", "prompt": prompt, "max_tokens": 16, "temperature": 0}
            ).raise_for_status()

    result = scrape(deployments=[spec])

    decision = result["guard"][0]
    assert decision["action"] == "fallback" and decision["acceptance"] < 0.95 and decision["draft_tokens"] >= 30
    pair = context.store().pairs.get("guard")
    assert (pair.state, pair.drafter_version) == ("fallback", None)
    completion = httpx.post(
        f"{served['endpoint']}/v1/completions",
        timeout=60,
        json={"model": "guard", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0},
    ).json()
    assert _draft_tokens(completion) == 0
    subjects = [
        BytesParser(policy=policy.default).parsebytes(p.read_bytes())["Subject"]
        for p in (workdir / "outbox").glob("*.eml")
    ]
    assert any("fell back to plain decoding" in s for s in subjects), subjects


@pytest.mark.vllm
@pytest.mark.smoke
def test_a_vllm_that_refuses_to_start_leaves_the_pair_serving_and_the_alert_names_its_error_and_log(
    workdir, built_targets, tmp_path, vllm_engine, monkeypatch
):
    from draftsync.errors import DraftsyncError
    from draftsync.flows.rollout import rollout
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("refuse-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    good = _drafter(registry, "refuse-llm", v1, built_targets[1], tmp_path, gamma=2)
    registry.promote("refuse-llm", good)
    deployment = ServingDeployment(name="refuse", target_name="refuse-llm", launch="vllm")
    served = rollout(deployment)
    newer = _drafter(registry, "refuse-llm", v1, built_targets[1], tmp_path, gamma=3, seed=1)
    aliases = registry.alias_snapshot("refuse-llm")
    monkeypatch.setenv("DRAFTSYNC_VLLM_CPU_KVCACHE_GB", "100000")  # a KV cache no machine here has room for

    with pytest.raises(DraftsyncError) as refused:
        rollout(deployment, drafter_version=newer)

    assert "vLLM for refuse did not start" in refused.value.what
    failed_log = next(log for log in (workdir / "serving").glob("refuse-*.log") if str(log) in refused.value.what)
    error_line = refused.value.what.split("did not start: ", 1)[1].split(" (log: ")[0]
    assert "kv" in error_line.lower() and error_line in failed_log.read_text()  # vLLM's own words, from its log
    pair = context.store().pairs.get("refuse")
    assert (pair.drafter_version, pair.state) == (good, "serving")
    assert registry.alias_snapshot("refuse-llm") == aliases
    answer = httpx.post(
        f"{served['endpoint']}/v1/completions",
        timeout=60,
        json={"model": "refuse", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0},
    ).json()
    assert _gamma(answer) == 2  # the current pair still answers at the same address
    mails = [BytesParser(policy=policy.default).parsebytes(p.read_bytes()) for p in (workdir / "outbox").glob("*.eml")]
    body = next(m for m in mails if "did not start" in m["Subject"]).get_body(("plain",)).get_content()
    assert str(failed_log) in body and error_line in body


def test_without_a_vllm_engine_a_vllm_rollout_fails_naming_make_vllm_and_nothing_moves(
    workdir, built_targets, tmp_path, monkeypatch
):
    from draftsync.errors import DraftsyncError
    from draftsync.flows.rollout import rollout
    from draftsync.serving import vllm_engine
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    v1 = publish_target("bare-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    first = _drafter(registry, "bare-llm", v1, built_targets[1], tmp_path, gamma=2)
    second = _drafter(registry, "bare-llm", v1, built_targets[1], tmp_path, gamma=3, seed=1)
    registry.promote("bare-llm", first)
    aliases = registry.alias_snapshot("bare-llm")
    monkeypatch.setattr(vllm_engine, "_checkout_root", lambda: tmp_path)  # no .venv-vllm, no vllm on PATH
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("DRAFTSYNC_VLLM", raising=False)

    with pytest.raises(DraftsyncError) as missing:
        rollout(ServingDeployment(name="bare", target_name="bare-llm", launch="vllm"), drafter_version=second)

    assert "no vLLM engine" in missing.value.what and "make vllm" in missing.value.fix
    assert registry.alias_snapshot("bare-llm") == aliases
    assert context.store().pairs.get("bare") is None
    assert not list((workdir / "serving").glob("bare-*.log"))  # no process was started


def test_a_pair_whose_servers_were_stopped_is_recorded_stopped_skipped_by_scrapes_and_back_after_a_rollout(
    workdir, built_targets, tmp_path
):
    from draftsync.flows.rollout import rollout
    from draftsync.flows.scrape import scrape
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.serving import stop_all

    registry, store = context.registry(), context.store()
    v1 = publish_target("stop-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    registry.promote("stop-llm", _drafter(registry, "stop-llm", v1, built_targets[1], tmp_path, gamma=2))
    spec = ServingDeployment(name="stopper", target_name="stop-llm")
    served = rollout(spec)
    started = store.pairs.get("stopper")

    stop_all()

    stopped = store.pairs.get("stopper")
    assert (stopped.state, stopped.updated_at, stopped.drafter_version) == (
        "stopped",
        started.updated_at,
        started.drafter_version,
    )
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{served['endpoint']}/health", timeout=5)
    assert scrape(deployments=[spec])["deployments"] == [{"deployment": "stopper", "skipped": "stopped"}]
    assert store.acceptance.samples("stopper", started.updated_at, started.updated_at.replace(year=3000)) == []

    again = rollout(spec)
    assert store.pairs.get("stopper").state == "serving"
    assert httpx.get(f"{again['endpoint']}/health", timeout=5).status_code == 200
