"""`draftsync demo`: the whole loop on one machine, with real MLflow, Prefect, servers and e-mail.

The story: target v1 appears -> drafter v1 (for the math traffic it serves) -> served; math traffic;
traffic drifts to prose and acceptance falls; the weekly review flags the drafter stale, falls back and mails
the team; the retrain it requests learns the prose traffic the router captured, for the same target v1, and the
retrained pair recovers; target v2 appears -> drafter v2 (warm start) -> the v2 pair serves prose as well. The
monitor's clock is a parameter: the demo moves it 12 simulated hours per scrape, so a week passes in a few
minutes. The simulated days end at the real present, and the demo's deployment is declared in the deployments
file, so `draftsync status`, `report` and `rollout` read the story afterwards as they would a real one.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from draftsync.cli.common import JsonOption, write_json
from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write
from draftsync.serving.deployment import ServingDeployment, TrafficCaptureSettings
from draftsync.settings import write_workdir_settings
from draftsync.tasks import context

TARGET_NAME = "demo-llm"
DEPLOYMENT = "demo-assistant"
TEMPERATURE = 0.0
# Short completions (chat turns, code completions). Tiny targets fall into loops after a few dozen greedy
# tokens, and loops are easy to draft whatever the domain; short outputs keep the drift visible.
MAX_TOKENS = 24
# The traffic each target version is registered for (its task mix: what its drafter's data covers). Target v1 knows
# code and math and serves a math assistant, so drafter v1 learns math and a draft vocabulary of math's tokens. On
# prose the tiny v1 writes code-like text its drafter never saw: acceptance falls from about 0.8 to near 0, where
# a drafter that had learned code too would have held about 0.7 on those loops, too close to any line to show a
# drift. Target v2 is registered for the mix it was fine-tuned on, prose included (a version not named here is).
TRAFFIC_MIX: dict[int, dict[str, float]] = {1: {"math": 1.0}}
# The demo's stale line: the bottom of the healthy band the source document gives (acceptance 70-90 %). The
# global default (0.50, the source's line for drafters that no longer match at all) is for production. The demo
# writes it into its work dir's settings file, so every later command on that work dir (report, status, a retrain)
# judges with the same line; the environment variable DRAFTSYNC_STALE_THRESHOLD still wins.
STALE_THRESHOLD = 0.70
# Its warning line sits above the critical one, as in production (0.60 over 0.50): a drop is flagged before it is stale.
MISMATCH_THRESHOLD = 0.75
STEP = timedelta(hours=12)
# The traffic phases: (name, prompts per task, scrapes, seed, requests per scrape), each request labelled with its
# task as the client's domain. Scrapes of all times STEP is how far back the simulated clock starts, so that the
# last scrape lands at about the real present. The drift sends 160 prose requests (119 distinct prompts): what the
# router captures for the retrain (a fifth held out to validate it on); 80 distinct left the retrain's held-out
# acceptance under the gate in one run (0.66), and bench/drift_retrain.py measures how it grows with more. Each
# phase a pair serves drafts more than the window its validation's prediction is for (the demo profile's 200
# drafted tokens at gamma 1), so the summary can hold every pair to its prediction; c2 and d serve 24 prompts: for
# one retrained drafter, c2's former dozen measured 0.72 where 40 other prose prompts measured 0.83.
TRAFFIC = {
    "b": ("b: math traffic", {"math": 15}, 6, 1, 5),
    "c": ("c: drift to prose", {"prose": 160}, 8, 2, 20),
    "c2": ("c2: prose traffic on the retrained v1 pair", {"prose": 24}, 4, 4, 6),
    "d": ("d: prose traffic on the v2 pair", {"prose": 24}, 4, 3, 6),
}
CAPTURE = TrafficCaptureSettings(rate=1.0, max_rows=10_000)  # the demo keeps every request it serves
ENGINES = ("auto", "vllm", "reference")
# What one story writes, moved aside by the next: its syncs' checkpoints would resume into another story's data, and
# its captured traffic would join the next retrain's.
STORY_STATE = (
    "mlflow.db",
    "mlartifacts",
    "monitor.db",
    "outbox",
    "serving",
    "drafters",
    "syncs",
    "validations",
    "traffic",
    "demo.json",
)


class DemoClock:
    """The monitor's clock for the demo: starts in the past and advances only when told."""

    def __init__(self, start: datetime):
        self.now = start

    def advance(self, by: timedelta = STEP) -> datetime:
        self.now += by
        return self.now


def _archive_previous_story(root: Path) -> Path | None:
    """A rerun starts a fresh story; the previous one is moved aside, not deleted. Built targets stay cached."""
    present = [root / name for name in STORY_STATE if (root / name).exists()]
    if not present:
        return None
    archive = root / "archive" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    archive.mkdir(parents=True, exist_ok=True)
    for path in present:
        shutil.move(str(path), archive / path.name)
    return archive


def choose_engine(engine: str) -> dict:
    """The engine the demo serves with, as demo.json records it: vLLM when asked for or (auto) installed, else
    the CPU reference server. `vllm` without an engine fails here, before anything starts."""
    from draftsync import __version__
    from draftsync.errors import DraftsyncError
    from draftsync.serving.vllm_engine import find_vllm_engine

    found = None if engine == "reference" else find_vllm_engine(required=engine == "vllm")
    if found is None:
        return {"name": "reference", "version": __version__}
    try:
        return {"name": "vllm", "version": found.version()}
    except DraftsyncError as error:
        raise DraftsyncError(error.what, f"{error.fix}; or run the demo with --engine reference") from None


def _deployments_with(deployment: ServingDeployment, path: Path) -> str:
    """The deployments file with the demo's deployment declared in it: its other deployments are kept as
    written, an earlier demo entry is replaced. A file that does not load fails here rather than being lost."""
    import yaml

    from draftsync.serving.deployment import load_deployments

    entries = []
    if path.exists():
        load_deployments(path)
        entries = [e for e in yaml.safe_load(path.read_text())["deployments"] if e["name"] != deployment.name]
    entries.append(deployment.model_dump(mode="json", exclude_unset=True))
    return yaml.safe_dump({"deployments": entries}, sort_keys=False)


def _declare(deployment: ServingDeployment, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _deployments_with(deployment, path)
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _target_entry(version: int, recipe, task_mix: dict[str, float], built: str, cache_dir: Path) -> dict:
    """A target as demo.json records it: the traffic it is registered for (`task_mix`) and what it was trained on,
    how it came (`built`: "shipped" with draftsync; else "before the demo", by `demo --prepare` or an earlier
    run; else "in the story"), and the seconds its training took."""
    from draftsync.speculative.builtin.targets import built_target_info

    info = built_target_info(recipe, cache_dir) or {}
    return {
        "name": TARGET_NAME,
        "version": version,
        "task_mix": task_mix,
        "trained_on": recipe.task_mix,
        "built": built,
        "train_seconds": info.get("train_seconds"),
    }


def _start_prefect_api() -> threading.Thread:
    """Without PREFECT_API_URL, Prefect's API is an ephemeral server process that starts on first use (about 13 s on
    a fresh work dir, its database migrations included): it starts in a thread while this process opens the MLflow
    registry (about 8 s), each on a core of its own. A failure shows where the story first uses Prefect."""
    from prefect.client.orchestration import get_client

    def start() -> None:
        with contextlib.suppress(Exception):
            get_client(sync_client=True)

    thread = threading.Thread(target=start, name="prefect-api", daemon=True)
    thread.start()
    return thread


def _phase(
    name: str,
    prompts_by_task: dict[str, int],
    intervals: int,
    seed: int,
    requests_per_interval: int,
    clock: DemoClock,
    deployment: ServingDeployment,
    max_tokens: int,
) -> dict:
    """Send traffic interval by interval, each request labelled with its task, scraping after each; acceptance is
    read back from the store."""
    from draftsync.flows.scrape import scrape
    from draftsync.monitors.trends import summarize
    from draftsync.speculative.data.corpora import prompts
    from draftsync.tasks.traffic import send_traffic

    store = context.store()
    start = clock.now
    # The scrapes book the router's captured requests (per-domain acceptance); the live guard is left out, as the
    # story's fallback is the weekly review's.
    scraped = deployment.model_copy(update={"fallback_threshold": None})
    pool = [(task, p) for task, n in prompts_by_task.items() for p in prompts(task, n, seed=seed)]
    for i in range(intervals):
        batch = [pool[(i * requests_per_interval + j) % len(pool)] for j in range(requests_per_interval)]
        endpoint = store.pairs.get(deployment.name).endpoint
        send_traffic(
            endpoint,
            deployment.name,
            [prompt for _, prompt in batch],
            deployment.temperature,
            max_tokens,
            seed + i * 100,
            domains=[task for task, _ in batch],
        )
        scrape(now=clock.advance(), deployments=[scraped])
    summary = summarize(
        store.acceptance.samples(deployment.name, start, clock.now), start, clock.now, deployment=deployment.name
    )
    return {
        "name": name,
        "traffic": sorted(prompts_by_task),
        "start": start.isoformat(),
        "end": clock.now.isoformat(),
        "acceptance_rate": summary.acceptance_rate,
        "mean_acceptance_length": summary.mean_acceptance_length,
        "draft_tokens": summary.draft_tokens,
    }


def _retrain_on_captured_traffic(deployment: ServingDeployment, sync_profile) -> dict:
    """The retrain the weekly review requested, run now (a sync worker would start it): it claims the request, learns
    the prose the router captured and is validated on a held-out slice of it; the rollout then serves it."""
    from draftsync.flows.rollout import rollout
    from draftsync.flows.sync import sync
    from draftsync.serving.traffic_capture import captured_rows
    from draftsync.tasks.serving import capture_config

    _declare(deployment, context.settings().deployments_path)  # a retrain reads captured traffic of declared ones
    config = capture_config(deployment)
    assert config is not None, "the demo's deployment captures its traffic"
    rows = len(captured_rows(config.path))
    result = sync(TARGET_NAME, 1, sync_profile, reason="the weekly review found the drafter stale")
    validation = result["validation"]
    served = None
    if validation["passed"]:  # else the pair stays as the review left it: speculation off
        reason = f"drafter v{result['drafter_version']} retrained on captured traffic"
        served = rollout(deployment, reason=reason)["drafter_version"]
    return {
        "captured_rows": rows,
        "captured_prompts_trained": result["dataset"]["captured"],
        "generation": result["generation"],
        "drafter_version": result["drafter_version"],
        "validation_passed": validation["passed"],
        "acceptance_on_declared_mix": validation["acceptance"]["mean"],
        "acceptance_on_captured_holdout": (validation.get("captured_acceptance") or {}).get("mean"),
        "served_drafter_version": served,
    }


def _set_the_stage(engine: str) -> tuple[dict, ServingDeployment, Path | None]:
    """The serving engine, the demo's deployment, and a fresh work dir with the demo's thresholds (the previous story
    moved aside: where to, if there was one); the registry and Prefect's API are up when it returns."""
    settings = context.settings()
    serving_engine = choose_engine(engine)
    deployment = ServingDeployment(
        name=DEPLOYMENT,
        target_name=TARGET_NAME,
        temperature=TEMPERATURE,
        task_mix=TRAFFIC_MIX[1],
        launch=serving_engine["name"],
        capture=CAPTURE,
    )
    _deployments_with(deployment, settings.deployments_path)  # a deployments file it cannot keep fails before the story
    archived = _archive_previous_story(settings.root)
    write_workdir_settings(
        settings.root,
        {"DRAFTSYNC_STALE_THRESHOLD": str(STALE_THRESHOLD), "DRAFTSYNC_MISMATCH_THRESHOLD": str(MISMATCH_THRESHOLD)},
    )
    context.reset()
    context.settings()
    registry = context.registry()
    prefect_api = _start_prefect_api()
    registry.ping()
    prefect_api.join()
    return serving_engine, deployment, archived


def _drafter_records() -> list[dict]:
    """Every drafter version of the demo's target as demo.json records it."""
    from draftsync.registry.model_registry import drafter_model_name
    from draftsync.registry.tags import DrafterVersion

    registry = context.registry()
    drafter_name = drafter_model_name(TARGET_NAME)
    drafters = []
    for info in registry.target_versions_after(drafter_name, 0):
        drafter = DrafterVersion.from_tags(drafter_name, info.version, info.tags)
        start = drafter.recommended_gamma_start
        drafters.append(
            {
                "name": drafter_name,
                "version": info.version,
                "target_version": drafter.trained_for_version(),
                "method": drafter.method,
                "gamma": drafter.served_gamma(),  # measured: validation's knee
                "gamma_recommended": {
                    "range": drafter.recommended_gamma_range,
                    "start": None if start is None else str(start),  # as the tag reads
                    "method": drafter.recommended_method,
                },
                "validation_passed": drafter.validation_passed,
                "aliases": registry.aliases_of(drafter_name, info.version),
                "path": str(registry.download(drafter_name, info.version)),
            }
        )
    return drafters


def _prediction_records(now: datetime) -> list[dict]:
    """Each pair the story served with a drafter: the first window it served against its validation's prediction."""
    from draftsync.tasks.monitoring import PREDICTION_LOOKBACK, prediction_checks

    rows = context.store().acceptance.hourly(DEPLOYMENT, now - PREDICTION_LOOKBACK, now)
    pairs = list(dict.fromkeys((r.target_version, r.drafter_version) for r in rows if r.drafter_version is not None))
    return [asdict(check) for check in prediction_checks(DEPLOYMENT, pairs, now)]


def _deployment_records(states_at_end: dict, vllm_launches: dict) -> list[dict]:
    """Each deployment the store knows, as demo.json records it: its pair, its state when the story ended and now."""
    return [
        {
            "name": p.deployment,
            "target_version": p.target_version,
            "drafter_version": p.drafter_version,
            "state_at_end": states_at_end.get(p.deployment),
            "state": p.state,
            "gamma": p.gamma,
            "vllm": vllm_launches.get(p.deployment),
        }
        for p in context.store().pairs.all()
    ]


def run_demo(engine: str = "auto") -> dict:
    """Run the story; print a summary and write it to <workdir>/demo.json.

    `engine`: "auto" (vLLM when one is installed, else the CPU reference server), "vllm" or "reference".
    Long: the story's steps in the order they are told, each timed where it happens."""
    from draftsync.flows.prefect_deployments import register_paused_deployments
    from draftsync.flows.watch import watch
    from draftsync.flows.weekly_report import weekly_report
    from draftsync.profiles import profile
    from draftsync.speculative.builtin.shipped_targets import find_shipped
    from draftsync.speculative.builtin.targets import build_target, built_target_info, builtin_recipe
    from draftsync.speculative.machine import machine_record
    from draftsync.tasks.registration import publish_target
    from draftsync.tasks.serving import serving_record, stop_all

    console = Console()
    serving_engine, deployment, archived = _set_the_stage(engine)
    settings = context.settings()
    sync_profile = profile("demo")
    # validated as served: at its temperature and its output length (a tiny target loops deeper into a longer
    # output, where drafting is easy, so a longer validation over-predicts what short requests accept)
    sync_profile.validation = sync_profile.validation.model_copy(
        update={"temperature": TEMPERATURE, "max_tokens": MAX_TOKENS}
    )
    max_tokens = MAX_TOKENS
    simulated = STEP * sum(phase[2] for phase in TRAFFIC.values())
    clock = DemoClock(datetime.now(UTC).replace(second=0, microsecond=0) - simulated)
    timings: dict[str, float] = {}
    sync_stages: dict[str, dict] = {}
    phases, targets = [], []
    started = time.perf_counter()

    def mark(name: str, since: float) -> None:
        timings[name] = round(time.perf_counter() - since, 1)

    console.rule("draftsync demo")
    console.print(f"work dir: {settings.root}" + (f" (previous story moved to {archived})" if archived else ""))
    console.print(f"serving engine: {serving_engine['name']} {serving_engine['version']}")
    console.print(
        f"The monitor's clock is simulated: it starts {simulated.days} days ago and each scrape advances it "
        "12 hours, so the days up to now pass in minutes."
    )
    vllm_launches = {}

    def target_appears(version: int, headline: str) -> None:
        """Target `version` is built (or found built) and published; the watch syncs its drafter and rolls the
        pair out, as it would for a version a training pipeline registered."""
        t = time.perf_counter()
        console.print(headline)
        recipe = builtin_recipe(version)
        if find_shipped(recipe.key()) is not None:
            built = "shipped"
        else:
            built = "before the demo" if built_target_info(recipe, settings.cache_dir) else "in the story"
        path = build_target(recipe, settings.cache_dir)
        mark(f"target_v{version}_build", t)
        t = time.perf_counter()
        task_mix = TRAFFIC_MIX.get(version, recipe.task_mix)
        registered = publish_target(TARGET_NAME, str(path), task_mix)
        targets.append(_target_entry(registered, recipe, task_mix, built, settings.cache_dir))
        sync_stages[f"v{version}"] = watch(TARGET_NAME, deployment, sync_profile)["syncs"][0]["stages_s"]
        mark(f"sync_and_rollout_v{version}", t)

    try:
        # (a) target v1 appears; the watch syncs a drafter for it and rolls the pair out.
        target_appears(1, "[bold](a)[/] target v1 (trained on code + math; serves math; shipped with draftsync) ...")

        # (b) normal traffic: math.
        t = time.perf_counter()
        console.print("[bold](b)[/] math traffic ...")
        phases.append(_phase(*TRAFFIC["b"], clock, deployment, max_tokens))
        mark("phase_b", t)

        # (c) traffic drifts to prose; the weekly review finds the drafter stale.
        t = time.perf_counter()
        console.print("[bold](c)[/] traffic drifts to prose ...")
        phases.append(_phase(*TRAFFIC["c"], clock, deployment, max_tokens))
        report = weekly_report(
            now=clock.now,
            deployments=[deployment],
            notes=[
                "This is the draftsync demo: the monitor's clock was compressed, a simulated week took a few minutes."
            ],
        )
        mark("phase_c_and_report", t)

        # (c2) the retrain the review requested learns the captured prose traffic, for the same target v1.
        t = time.perf_counter()
        console.print("[bold](c2)[/] the retrain learns the captured prose traffic (target v1) ...")
        retrain = _retrain_on_captured_traffic(deployment, sync_profile)
        mark("retrain_and_rollout_v1", t)
        t = time.perf_counter()
        phases.append(_phase(*TRAFFIC["c2"], clock, deployment, max_tokens))
        retrain["acceptance_on_prose"] = phases[-1]["acceptance_rate"]
        mark("phase_c2", t)

        # (d) target v2 (fine-tuned on a mix with prose) appears; its drafter is trained and rolled out.
        target_appears(2, "[bold](d)[/] target v2 (v1 fine-tuned with prose) ...")
        t = time.perf_counter()
        phases.append(_phase(*TRAFFIC["d"], clock, deployment, max_tokens))
        mark("phase_d", t)
        record = serving_record(deployment.name)
        assert record is not None, "the rollout above wrote the deployment's serving record"
        vllm_launches[deployment.name] = record["vllm"]
        states_at_end = {p.deployment: p.state for p in context.store().pairs.all()}
        predictions = _prediction_records(clock.now)
    finally:
        stop_all()  # the store then says "stopped": `draftsync rollout demo-assistant` serves the pair again
    _declare(deployment, settings.deployments_path)
    register_paused_deployments()  # what production schedules, in the work dir's Prefect UI; nothing runs unasked
    timings["total"] = round(time.perf_counter() - started, 1)

    drafters = _drafter_records()
    result = {
        "machine": machine_record(),
        "engine": serving_engine,
        "targets": targets,
        "drafters": drafters,
        "deployments": _deployment_records(states_at_end, vllm_launches),
        "phases": phases,
        "predictions": predictions,
        "retrain": retrain,
        "thresholds": {"stale": settings.stale_threshold, "mismatch": settings.mismatch_threshold},
        "alerts": [
            {"subject": report["subject"], "deployment": f["deployment"], "rule": f["rule"], "file": report["eml_path"]}
            for f in report["findings"]
            if f["severity"] != "info"
        ],
        "weekly_report": {"subject": report["subject"], "file": report["eml_path"], "actions": report["actions"]},
        "timings_s": timings,
        "sync_stages_s": sync_stages,
        "deployments_file": str(settings.deployments_path),
        "simulated_clock": {"start": phases[0]["start"], "end": clock.now.isoformat()},
        "workdir": str(settings.root),
    }
    write_json(result, settings.root / "demo.json")
    _print_summary(console, result, settings)
    return result


def _print_summary(console: Console, result: dict, settings) -> None:
    from rich.table import Table

    table = Table(title="phases (acceptance from the scraped /metrics counters)")
    for column in ("phase", "acceptance", "draft tokens"):
        table.add_column(column)
    for phase in result["phases"]:
        rate = phase["acceptance_rate"]
        table.add_row(phase["name"], "-" if rate is None else f"{rate:.3f}", str(phase["draft_tokens"]))
    console.print(table)
    held = Table(title="each pair's first served window against what its validation predicted")
    for column in ("pair", "predicted", "served", "draft tokens", "verdict"):
        held.add_column(column)
    for check in result["predictions"]:
        predicted = check["predicted"]
        held.add_row(
            f"t{check['target_version']} + d{check['drafter_version']}",
            "-" if predicted is None else f"{predicted[0]:.2f}-{predicted[1]:.2f}",
            "-" if check["served"] is None else f"{check['served']:.3f}",
            f"{check['draft_tokens']} of {check['window_draft_tokens']}",
            check["verdict"],
        )
    console.print(held)
    retrain = result["retrain"]
    served = (
        f"served drafter v{retrain['served_drafter_version']}"
        if retrain["served_drafter_version"] is not None
        else "not promoted: the deployment stays on plain decoding, where the review left it"
    )
    console.print(
        f"retrain of target v1 on {retrain['captured_prompts_trained']} prompts of captured prose (each distinct "
        "one and its openings) "
        f"({retrain['captured_rows']} requests captured): drafter v{retrain['drafter_version']}, validation "
        f"{'passed' if retrain['validation_passed'] else 'FAILED'} (declared mix "
        f"{retrain['acceptance_on_declared_mix']}, held-out captured traffic "
        f"{retrain['acceptance_on_captured_holdout']}); {served}"
    )
    for d in result["drafters"]:
        recommended = d["gamma_recommended"]
        span = recommended["range"]
        if recommended["method"] == "none":
            advice = "the decision framework advises no speculation for a target this size on this hardware"
        elif span:
            advice = f"recommended {recommended['method']}, gamma {span[0]}-{span[1]}"
        else:
            advice = f"recommended {recommended['method']}"
        console.print(
            f"drafter {d['name']} v{d['version']} for target v{d['target_version']}: {d['method']}, gamma "
            f"{d['gamma']} measured ({advice}); aliases {', '.join(d['aliases']) or 'none'}"
        )
    console.print(f"weekly report: {result['weekly_report']['subject']}")
    console.print(f"  {result['weekly_report']['file']}", soft_wrap=True)
    tools = Path(sys.executable).parent  # the venv the demo runs in holds draftsync, mlflow and prefect
    for d in result["deployments"]:
        console.print(
            f"{d['name']}: {d['state_at_end']} at the end, then {d['state']} (the demo stops its servers; "
            "this serves the pair again:)"
        )
        console.print(f"  {tools / 'draftsync'} --workdir {settings.root} rollout {d['name']}", soft_wrap=True)
    console.print(f"timings (s): {result['timings_s']}")
    console.print(f"summary: {settings.root / 'demo.json'}", soft_wrap=True)
    console.print("MLflow UI (then open http://127.0.0.1:5000/#/models?workflowType=machine_learning):")
    console.print(
        f"  {tools / 'mlflow'} ui --backend-store-uri {settings.mlflow_tracking_uri} "
        f"--default-artifact-root {settings.mlflow_artifacts_dir}",
        soft_wrap=True,
    )
    console.print("Prefect UI, its five deployments registered paused (then open http://127.0.0.1:4200/deployments):")
    console.print(f"  PREFECT_HOME={settings.prefect_home} {tools / 'prefect'} server start", soft_wrap=True)


def prepare_demo() -> Path:
    """Put target v1, what the story starts from, into the work dir's cache (copied from the shipped targets, or
    found there), import the story's modules, migrate Prefect's database, and fill the user cache's corpus documents
    and training-precision probe: what the story would otherwise do first on the clock. `make demo` runs this while
    vLLM's environment installs."""
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import documents
    from draftsync.speculative.machine import cpu_bf16_speedup

    t = time.perf_counter()
    settings = context.settings()
    path = build_target(builtin_recipe(1), settings.cache_dir)
    prefect_api = _start_prefect_api()
    # What the story imports first on the clock. pip installs without byte-compiling (half the install's time), so a
    # fresh environment's first import of each module compiles it.
    import great_expectations  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import mlflow.server  # noqa: F401

    from draftsync.flows import scrape, watch, weekly_report  # noqa: F401
    from draftsync.monitors import report  # noqa: F401
    from draftsync.validation import data_checks, plots  # noqa: F401

    documents("prose")  # the standard library's documents, parsed once and kept for every later process
    cpu_bf16_speedup()
    prefect_api.join()
    Console().print(
        f"demo target v1: {path}; story modules and Prefect's database ready ({time.perf_counter() - t:.1f} s)"
    )
    return path


def rebuild_shipped_targets() -> None:
    """Train every shipped target from its recipe and ship it; the work dir's cache keeps what it had (same keys)."""
    from draftsync.speculative.builtin.targets import rebuild_shipped_targets as rebuild

    console = Console()
    t = time.perf_counter()
    rebuild(lambda name, path: console.print(f"shipped target {name}: {path} ({time.perf_counter() - t:.0f} s)"))


def demo_command(
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="Serving engine: 'auto' (vLLM when one is installed, `make vllm`; else the CPU reference "
            "server), 'vllm' (fail when none is installed) or 'reference'.",
        ),
    ] = "auto",
    prepare: Annotated[
        bool,
        typer.Option(
            "--prepare",
            help="Only put target v1, what the story starts from, in the work dir's cache (where the demo finds "
            "it), and stop. `make demo` runs this while vLLM's environment installs.",
        ),
    ] = False,
    rebuild_targets: Annotated[
        bool,
        typer.Option(
            "--rebuild-targets",
            help="Train the shipped built-in targets anew from their recipes and write them, with their hashes, "
            "where draftsync ships them (after a recipe change, or when a shipped file fails its hash); then go on.",
        ),
    ] = False,
    json_path: JsonOption = None,
) -> None:
    """Run the whole loop on this machine: targets v1 and v2, drafters, serving, monitoring, a stale e-mail."""
    if engine not in ENGINES:
        raise DraftsyncError(f"demo engine {engine!r} is unknown", f"use one of {', '.join(ENGINES)}")
    if rebuild_targets:
        rebuild_shipped_targets()
    if prepare:
        prepare_demo()
        return
    with context.flows_without_heartbeats():  # every flow of the story runs in this process
        result = run_demo(engine)
    write_json(result, json_path)
