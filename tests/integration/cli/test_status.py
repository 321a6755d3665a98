"""`draftsync status` against a real MLflow registry (SQLite), the real monitor store and the sync ledger:
a target with two versions and three drafters (one promoted, one before it, one pending), two deployments
(one serving, one fallen back), a target with no drafter, one named only in DRAFTSYNC_TARGETS; then a deployment
that replaced a stale pair mid-week, whose figures status must take from the weekly review as the report does."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import typer
from draftsync.cli.status import status_command
from draftsync.cli.status_query import last_attempt, last_good_sync, last_sync
from draftsync.errors import DraftsyncError
from draftsync.registry.tags import measured_gamma, parse_gamma_range, recommended_gamma
from typer.testing import CliRunner

HOUR = timedelta(hours=1)
WIDE = {"COLUMNS": "240"}  # rich wraps cells to the terminal's width


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the command is called by name as in the draftsync app
    app.command(name="status")(status_command)
    return app


def record_hours(
    store, deployment: str, pair, first: datetime, hours: int, accepted_per_hour: int, totals: list[int]
) -> None:
    """One scrape an hour; each hour adds 100 drafts of 3 tokens and `accepted_per_hour` accepted tokens.

    `totals` (drafts, draft tokens, accepted) carries the server's cumulative counters across calls."""
    from draftsync.monitors.metrics import SpecDecodeCounters

    for hour in range(hours):
        totals[0] += 100
        totals[1] += 300
        totals[2] += accepted_per_hour
        store.acceptance.record_scrape(deployment, first + hour * HOUR, SpecDecodeCounters(*totals), pair)


def baseline_scrape(store, deployment: str, pair, moment: datetime, totals: list[int]) -> None:
    """A scrape that adds nothing: the first one sets the baseline, a later one closes a gap with zero traffic."""
    from draftsync.monitors.metrics import SpecDecodeCounters

    store.acceptance.record_scrape(deployment, moment, SpecDecodeCounters(*totals), pair)


@pytest.fixture
def status_world(workdir, tmp_path, monkeypatch):
    """The registry, store and ledger described in the module docstring; returns the versions created.

    Tiny random targets and drafters: status reads tags, aliases and counters, never weights."""
    from draftsync.monitors.tables import ServedPair
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.targets import describe_target
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

    monkeypatch.setenv("DRAFTSYNC_TARGETS", "planned-llm")
    context.reset()
    registry, store, ledger = context.registry(), context.store(), context.sync_ledger()
    targets = {version: build_tiny_target(tmp_path / f"target-{version}", seed=version) for version in (1, 2)}

    v1 = publish_target("status-llm", str(targets[1]), {"code": 0.5, "math": 0.5})
    v2 = publish_target("status-llm", str(targets[2]), {"code": 0.25, "math": 0.25, "prose": 0.5})
    registry.set_target_alias("status-llm", "canary", v1)

    def drafter_dir(target_version: int, gamma: int):
        return build_tiny_drafter(targets[target_version], tmp_path / f"drafter-{target_version}-{gamma}", gamma)

    d1 = registry.register_drafter("status-llm", v1, drafter_dir(1, 3), "eagle3", 3, {}, validation_passed=True)
    registry.promote("status-llm", d1)
    recommended = {"draftsync.recommended.gamma_start": "3", "draftsync.recommended.gamma_range": "[2, 4]"}
    d2 = registry.register_drafter(
        "status-llm", v2, drafter_dir(2, 3), "eagle3", 3, {}, extra_tags=recommended, validation_passed=None
    )
    registry.record_validation(
        "status-llm", d2, passed=True, metrics={"gamma_knee": 4, "acceptance_mean": 0.74}, tags={}, gamma=4
    )
    registry.promote("status-llm", d2)
    d3 = registry.register_drafter("status-llm", v2, drafter_dir(2, 5), "eagle3.1", 5, {}, validation_passed=None)

    bare = registry.register_target(
        "bare-llm", targets[1], target_tags(**{**describe_target(targets[1]), "task_mix": {"code": 1.0}})
    )

    # chat: 10 hours at 0.2 more than a week ago (outside the window), then 48 hours at 0.7 in it.
    now = datetime.now(UTC)
    chat_pair = ServedPair("status-llm", v2, d2, 4)
    store.pairs.record(
        "chat",
        ServedPair(
            target_name="status-llm", target_version=v2, drafter_version=d2, gamma=4, drafter_name="status-llm-drafter"
        ),
        endpoint="http://127.0.0.1:9",
        state="serving",
    )
    totals = [0, 0, 0]
    baseline_scrape(store, "chat", chat_pair, now - timedelta(days=9), totals)
    record_hours(store, "chat", chat_pair, now - timedelta(days=9) + HOUR, 10, 60, totals)
    baseline_scrape(store, "chat", chat_pair, now - timedelta(days=3), totals)
    record_hours(store, "chat", chat_pair, now - timedelta(days=3) + HOUR, 48, 210, totals)

    # batch: 24 hours at 0.4 with drafter d1, then fallen back (speculation off, no draft tokens since).
    batch_pair = ServedPair("status-llm", v1, d1, 3)
    totals = [0, 0, 0]
    baseline_scrape(store, "batch", batch_pair, now - timedelta(days=2), totals)
    record_hours(store, "batch", batch_pair, now - timedelta(days=2) + HOUR, 24, 120, totals)
    store.pairs.record(
        "batch",
        ServedPair(target_name="status-llm", target_version=v1, drafter_version=None, gamma=3, drafter_name=None),
        endpoint="http://127.0.0.1:10",
        state="fallback",
    )
    baseline_scrape(store, "batch", ServedPair("status-llm", v1, None, 3), now - timedelta(hours=2), totals)

    # The ledger: v2's sync succeeded after v1's, and a retrain of v1 was asked for last (the newest change).
    start = now - timedelta(days=4)
    ledger.request("status-llm", v1, "eagle3", source="watch", reason="new version", now=start)
    job = ledger.claim("status-llm", v1, "eagle3", run_id="run-1", now=start + HOUR).job
    ledger.finish(job.id, "succeeded", drafter_version=d1, now=start + 2 * HOUR)
    ledger.request("status-llm", v2, "eagle3", source="webhook", reason="version created", now=start + 3 * HOUR)
    job = ledger.claim("status-llm", v2, "eagle3", run_id="run-2", now=start + 4 * HOUR).job
    ledger.finish(job.id, "succeeded", drafter_version=d2, now=start + 5 * HOUR)
    assert ledger.request(
        "status-llm", v1, "eagle3", source="weekly-review", reason="drafter stale", retrain=True, now=start + 6 * HOUR
    )
    return {
        "v1": v1,
        "v2": v2,
        "d1": d1,
        "d2": d2,
        "d3": d3,
        "bare": bare,
        "retrain_at": start + 6 * HOUR,
        "finished_at": start + 2 * HOUR,
        "workdir": workdir,
    }


def test_status_json_field_by_field_and_the_table(status_world, tmp_path):
    w = status_world
    json_path = tmp_path / "out" / "status.json"
    result = CliRunner().invoke(_cli(), ["status", "--json", str(json_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    data = json.loads(json_path.read_text())
    targets = {t["name"]: t for t in data["targets"]}
    assert list(targets) == ["bare-llm", "planned-llm", "status-llm"]
    for target in data["targets"]:
        assert set(target) == {
            "name", "aliases", "versions", "drafters", "deployments", "last_sync", "last_attempt", "mtp_heads"
        }  # fmt: skip

    status = targets["status-llm"]
    assert status["versions"] == [w["v1"], w["v2"]]
    assert status["aliases"] == {"canary": w["v1"], "production": w["v2"]}
    assert status["drafters"] == [
        {
            "version": w["d1"],
            "trained_for": w["v1"],
            "method": "eagle3",
            "validation": "passed",
            "aliases": ["previous"],
            "gamma_measured": 3,
            "gamma_recommended": None,
            "mtp_head": None,
        },
        {
            "version": w["d2"],
            "trained_for": w["v2"],
            "method": "eagle3",
            "validation": "passed",
            "aliases": ["production"],
            "gamma_measured": 4,
            "gamma_recommended": {"start": 3, "range": [2, 4], "method": None},
            "mtp_head": None,
        },
        {
            "version": w["d3"],
            "trained_for": w["v2"],
            "method": "eagle3.1",
            "validation": "pending",
            "aliases": ["candidate"],
            "gamma_measured": None,
            "gamma_recommended": None,
            "mtp_head": None,
        },
    ]
    batch, chat = status["deployments"]
    assert batch["name"] == "batch" and batch["state"] == "fallback"
    assert (batch["target_version"], batch["drafter_version"], batch["gamma"]) == (w["v1"], None, None)
    # the week before the fallback still counts: the review judges the drafter it fell back from
    assert batch["acceptance_7d"] == pytest.approx(0.4) and batch["draft_tokens_7d"] == 24 * 300
    assert batch["judged"] == {"target_version": w["v1"], "drafter_version": w["d1"]}
    assert (batch["pooled_acceptance_7d"], batch["pooled_draft_tokens_7d"]) == (pytest.approx(0.4), 24 * 300)
    assert [(f["rule"], f["severity"]) for f in batch["findings"]] == [("stale", "critical")]  # 0.40 < 0.50
    assert all(p["draft_tokens"] == 0 for p in batch["replaced_pairs"])  # speculation off drafts nothing
    assert chat == {
        "name": "chat",
        "state": "serving",
        "target_version": w["v2"],
        "drafter_version": w["d2"],
        "gamma": 4,
        "acceptance_7d": pytest.approx(0.7),
        "draft_tokens_7d": 48 * 300,
        "judged": {"target_version": w["v2"], "drafter_version": w["d2"]},
        "pooled_acceptance_7d": pytest.approx(0.7),
        "pooled_draft_tokens_7d": 48 * 300,
        "replaced_pairs": [],
        "findings": [],
        "review_error": None,
    }  # the hours at 0.2 are over a week old
    good = status["last_sync"]  # the last sync that succeeded: the newer retrain request does not hide it
    assert (good["target_version"], good["status"], good["drafter_version"]) == (w["v2"], "succeeded", w["d2"])
    job = status["last_attempt"]
    assert (job["target_version"], job["method"], job["status"], job["generation"]) == (
        w["v1"],
        "eagle3",
        "requested",
        1,
    )
    assert (job["source"], job["reason"], job["attempts"]) == ("weekly-review", "drafter stale", 0)
    assert datetime.fromisoformat(job["requested_at"]) == w["retrain_at"]
    assert datetime.fromisoformat(job["finished_at"]) == w["finished_at"]  # the previous generation's finish

    bare = targets["bare-llm"]
    assert bare == {
        "name": "bare-llm",
        "aliases": {},
        "versions": [w["bare"]],
        "drafters": [],
        "deployments": [],
        "last_sync": None,
        "last_attempt": None,
        "mtp_heads": [],
    }
    assert targets["planned-llm"] == {
        "name": "planned-llm",
        "aliases": {},
        "versions": [],
        "drafters": [],
        "deployments": [],
        "last_sync": None,
        "last_attempt": None,
        "mtp_heads": [],
    }

    out = result.output
    assert "production -> v2" in out and "canary -> v1" in out
    assert "v2 <- t2 eagle3 passed [production]" in out and "v3 <- t2 eagle3.1 pending [candidate]" in out
    assert "rec 2-4 (start 3) / meas 4" in out and "rec - / meas -" in out
    assert "t1, speculation off" in out and "t2 + d2, gamma 4" in out
    flat = " ".join(out.split())
    assert "acceptance 0.70 (pair serving now, 14,400 drafted)" in flat and "pooled 7d 0" not in flat
    assert "acceptance 0.40 (t1 + d1 before speculation went off, 7,200 drafted)" in flat
    assert "critical stale (fallback+retrain): drafter stale: acceptance 0.40" in flat
    assert "no drafter" in out and "not deployed" in out
    assert "last sync" in out and "t2 eagle3 succeeded -> d2" in out
    assert "last attempt" in out and "t1 eagle3 requested" in out
    assert "-> d1" not in out  # the re-opened job's earlier drafter is not shown as its result
    assert f"{w['retrain_at']:%Y-%m-%d %H:%M} UTC" in out

    # at 80 columns nothing is cut: every line fits, no cell ends in an ellipsis, and the short forms are defined
    narrow = CliRunner().invoke(_cli(), ["status"], env={"COLUMNS": "80"}).output
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "\u2026" not in narrow
    assert "production -> v2" in narrow and "bare-llm" in narrow and "not deployed" in narrow
    assert "drafter version 3, trained for target version 2" in narrow.replace("\n", " ")


@pytest.fixture
def replaced_pair_world(status_world):
    """status_world and a deployment, assistant, that served t1 + d1 at 0.06 for 40 hours (12,000 drafted tokens)
    from six days ago, then was switched to t2 + d2, at 0.92 for the last 10 hours (3,000 drafted): pooled, the
    week is 0.23; the pair serving now is at 0.92. Returns the moment the status and the review are taken at."""
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context

    w, store = status_world, context.store()
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    old = ServedPair("status-llm", w["v1"], w["d1"], 3, drafter_name="status-llm-drafter")
    new = ServedPair("status-llm", w["v2"], w["d2"], 4, drafter_name="status-llm-drafter")
    store.pairs.record("assistant", old, endpoint="http://127.0.0.1:11", state="serving", now=now - timedelta(days=6))
    totals = [0, 0, 0]
    baseline_scrape(store, "assistant", old, now - timedelta(days=6), totals)
    record_hours(store, "assistant", old, now - timedelta(days=6) + HOUR, 40, 18, totals)
    store.pairs.record("assistant", new, endpoint="http://127.0.0.1:11", state="serving", now=now - 11 * HOUR)
    baseline_scrape(store, "assistant", new, now - 11 * HOUR, totals)
    record_hours(store, "assistant", new, now - 10 * HOUR, 10, 276, totals)
    return {**w, "now": now}


def test_status_shows_the_pair_serving_now_as_the_report_does(replaced_pair_world, tmp_path):
    """A stale pair replaced mid-week: status gives the acceptance of the pair serving now (0.92), not the pooled
    week (0.23) the replaced pair's many drafted tokens drag down, which it labels as pooled. Every deployment's
    figure, drafted tokens, replaced pairs and findings are those of the weekly review and `draftsync report`."""
    from draftsync.cli.status_query import current_status
    from draftsync.flows.weekly_report import weekly_report
    from draftsync.tasks.monitoring import review_deployment

    w, now = replaced_pair_world, replaced_pair_world["now"]
    status = current_status(now)
    deployments = {d["name"]: d for t in status["targets"] for d in t["deployments"]}
    assistant = deployments["assistant"]
    assert assistant["acceptance_7d"] == pytest.approx(0.92) and assistant["draft_tokens_7d"] == 3_000
    assert assistant["judged"] == {"target_version": w["v2"], "drafter_version": w["d2"]}
    assert assistant["pooled_acceptance_7d"] == pytest.approx(3_480 / 15_000)
    assert assistant["pooled_draft_tokens_7d"] == 15_000
    ((old),) = assistant["replaced_pairs"]
    assert (old["target_version"], old["drafter_version"], old["draft_tokens"]) == (w["v1"], w["d1"], 12_000)
    assert old["acceptance_rate"] == pytest.approx(0.06)
    assert assistant["findings"] == []

    # the same figures as the review, the report's rows and the e-mail's summaries, deployment by deployment
    report = weekly_report(now=now, send=False, act=False)
    rows = {row["name"]: row for row in report["deployments"]}
    assert set(rows) == set(deployments) == {"assistant", "batch", "chat"}
    for name, shown in deployments.items():
        review, row = review_deployment.fn(name, now), rows[name]
        assert shown["acceptance_7d"] == review.summary.acceptance_rate == row["acceptance_rate"], name
        assert report["summaries"][name]["acceptance_rate"] == shown["acceptance_7d"], name
        assert shown["draft_tokens_7d"] == review.summary.draft_tokens == row["draft_tokens"], name
        assert shown["replaced_pairs"] == review.replaced == row["replaced_pairs"], name
        assert shown["findings"] == [
            {key: f[key] for key in ("rule", "severity", "message", "action")}
            for f in row["findings"]
            if f["severity"] != "info"
        ], name
    assert deployments["batch"]["findings"]  # a finding the review raises shows in status too

    result = CliRunner().invoke(_cli(), ["status", "--json", str(tmp_path / "status.json")], env=WIDE)
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "t2 + d2, gamma 4; acceptance 0.92 (pair serving now, 3,000 drafted); pooled 7d 0.23" in flat
    assert "replaced this week: t1 + d1 0.06 (12,000 drafted)" in flat
    # batch's finding, as the report words it
    assert "critical stale (fallback+retrain): drafter stale: acceptance 0.40" in flat
    assert "acceptance 7d" not in flat  # the pooled figure is never given as the deployment's acceptance
    shown = json.loads((tmp_path / "status.json").read_text())
    assistant_json = next(d for t in shown["targets"] for d in t["deployments"] if d["name"] == "assistant")
    assert assistant_json["acceptance_7d"] == pytest.approx(0.92)


def test_a_deployment_the_review_cannot_judge_is_said_not_hidden(workdir, tmp_path):
    """A deployment whose drafter version MLflow does not hold: the review cannot read its lineage, so status says
    why it is not judged and still gives the pooled week, rather than failing the whole command."""
    from draftsync.monitors.tables import ServedPair
    from draftsync.tasks import context

    store, now = context.store(), datetime.now(UTC)
    ghost = ServedPair("ghost-llm", 1, 7, 3, drafter_name="ghost-llm-drafter")
    store.pairs.record("orphan", ghost, endpoint="http://127.0.0.1:12", state="serving")
    totals = [0, 0, 0]
    baseline_scrape(store, "orphan", ghost, now - timedelta(days=1), totals)
    record_hours(store, "orphan", ghost, now - timedelta(days=1) + HOUR, 5, 150, totals)
    json_path = tmp_path / "status.json"
    result = CliRunner().invoke(_cli(), ["status", "--json", str(json_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    ((orphan,),) = [t["deployments"] for t in json.loads(json_path.read_text())["targets"]]
    assert (orphan["acceptance_7d"], orphan["judged"], orphan["findings"]) == (None, None, [])
    assert orphan["review_error"].startswith("registered model ghost-llm-drafter has no version 7 in ")
    assert (orphan["pooled_acceptance_7d"], orphan["pooled_draft_tokens_7d"]) == (pytest.approx(0.5), 1_500)
    flat = " ".join(result.output.split())
    assert "acceptance not judged (registered model ghost-llm-drafter has no version 7" in flat
    assert "pooled 7d 0.50" in flat


def test_status_with_no_targets_says_how_to_get_one(workdir, tmp_path):
    json_path = tmp_path / "status.json"
    result = CliRunner().invoke(_cli(), ["status", "--json", str(json_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "no targets" in result.output and "DRAFTSYNC_TARGETS" in result.output
    assert json.loads(json_path.read_text()) == {"targets": [], "problems": []}


@pytest.mark.parametrize("kind", ["folder", "link loop", "missing", "unknown target"])
def test_status_names_what_keeps_a_declared_deployment_from_serving(workdir, tmp_path, monkeypatch, kind):
    """A deployments file status cannot read, or a deployment of a target MLflow does not hold, is a problem line in
    the table and in the JSON, not a deployment left out without a word."""
    from draftsync.tasks import context

    path = tmp_path / "deployments.yaml"
    if kind == "folder":
        path.mkdir()
        expected = f"deployments file {path} is a folder, not a file"
    elif kind == "link loop":
        (tmp_path / "other.yaml").symlink_to(path)
        path.symlink_to(tmp_path / "other.yaml")
        expected = f"deployments file {path} is a loop of symbolic links"
    elif kind == "missing":
        expected = f"deployments file {path} does not exist"
    else:
        path.write_text("deployments:\n- {name: ghost, target_name: no-such-llm, task_mix: {math: 1.0}}\n")
        expected = "deployment ghost serves target 'no-such-llm', which MLflow does not hold"
    monkeypatch.setenv("DRAFTSYNC_DEPLOYMENTS_FILE", str(path))
    context.reset()
    json_path = tmp_path / "status.json"
    result = CliRunner().invoke(_cli(), ["status", "--json", str(json_path)], env=WIDE)
    assert result.exit_code == 0, result.output
    (problem,) = json.loads(json_path.read_text())["problems"]
    assert problem.startswith(expected) and "fix:" in problem
    assert f"problem: {expected}" in " ".join(result.output.split())


def test_status_fails_fast_when_mlflow_is_unreachable(tmp_path, monkeypatch):
    from draftsync.serving.process import free_port
    from draftsync.tasks import context

    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    context.reset()
    try:
        result = CliRunner().invoke(_cli(), ["status", "--json", str(tmp_path / "status.json")])
    finally:
        context.reset()
    assert isinstance(result.exception, DraftsyncError), result.output
    assert "is not reachable" in result.exception.what and "MLFLOW_TRACKING_URI" in result.exception.fix
    assert not (tmp_path / "status.json").exists()
    assert not (tmp_path / "work" / "monitor.db").exists()  # nothing was opened before the check


def test_status_help_names_the_option():
    result = CliRunner().invoke(_cli(), ["status", "--help"], env=WIDE)
    assert result.exit_code == 0 and "--json" in result.output


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[2, 4]", [2, 4]),
        ("[4, 2]", [2, 4]),
        ("2-4", [2, 4]),
        ("2..4", [2, 4]),
        ("3,6", [3, 6]),
        ("5", [5, 5]),
        ("[5]", [5, 5]),
        ("", None),
        (None, None),
        ("none", None),
        ("[1, 2, 3]", None),
        ('{"lo": 2}', None),
    ],
)
def test_recommended_gamma_range_forms(text, expected):
    assert parse_gamma_range(text) == expected


def test_gammas_from_tags():
    assert recommended_gamma({}) is None
    assert recommended_gamma({"draftsync.recommended.gamma_start": "6"}) == {"start": 6, "range": None, "method": None}
    none = {"draftsync.recommended.gamma_range": "0-0", "draftsync.recommended.method": "none"}
    assert recommended_gamma(none) == {"start": None, "range": [0, 0], "method": "none"}
    # the knee wins; a validated version's gamma tag is measured; a pending version's is only configured
    assert (
        measured_gamma(
            {"draftsync.validation.gamma_knee": "4", "draftsync.gamma": "7", "draftsync.validation.status": "passed"}
        )
        == 4
    )
    assert measured_gamma({"draftsync.gamma": "7", "draftsync.validation.status": "failed"}) == 7
    assert measured_gamma({"draftsync.gamma": "7", "draftsync.validation.status": "pending"}) is None


def _render(status: dict) -> str:
    import io

    from draftsync.cli.status import status_table
    from rich.console import Console

    console = Console(width=240, file=io.StringIO(), color_system=None)
    console.print(status_table(status))
    return console.file.getvalue()


def test_a_failed_attempt_is_shown_apart_from_the_last_good_sync():
    from draftsync.monitors.sync_jobs import SyncJob

    t0 = datetime(2026, 11, 2, 9, tzinfo=UTC)

    def job(version: int, status: str, hours: int, detail: str | None = None) -> SyncJob:
        moment = t0 + hours * HOUR
        return SyncJob(
            target_name="m",
            target_version=version,
            method="eagle3",
            status=status,
            generation=0,
            attempts=1,
            source="cli",
            reason="r",
            requested_at=moment,
            started_at=moment,
            finished_at=moment,
            drafter_version=3 if status == "succeeded" else None,
            detail=detail,
        )

    good, failed = job(2, "succeeded", 1), job(3, "failed", 2, "the plan refused: 30 GiB of disk needed\nmore")
    assert (last_good_sync([failed, good])["target_version"], last_attempt([failed, good])["status"]) == (2, "failed")
    assert last_attempt([good]) is None  # nothing newer than the good sync
    assert (last_good_sync([failed]), last_attempt([failed])["detail"].startswith("the plan refused")) == (None, True)
    text = _render(
        {
            "targets": [
                {
                    "name": "m",
                    "aliases": {},
                    "versions": [2, 3],
                    "drafters": [],
                    "deployments": [],
                    "last_sync": last_good_sync([good, failed]),
                    "last_attempt": last_attempt([good, failed]),
                    "mtp_heads": [],
                }
            ]
        }
    )
    assert "t2 eagle3 succeeded -> d3" in text
    assert "t3 eagle3 failed, 2026-11-02 11:00 UTC: the plan refused: 30 GiB of disk needed" in text
    assert "more" not in text  # one line of the failure; status --json holds it whole


def test_last_sync_is_the_most_recent_change_whatever_the_order():
    from draftsync.monitors.sync_jobs import SyncJob

    t0 = datetime(2026, 11, 2, 9, tzinfo=UTC)
    finished_late = SyncJob(
        target_name="m",
        target_version=1,
        method="eagle3",
        status="succeeded",
        generation=0,
        attempts=1,
        source="watch",
        reason="r",
        requested_at=t0,
        started_at=t0 + HOUR,
        finished_at=t0 + 5 * HOUR,
    )
    started_later = SyncJob(
        target_name="m",
        target_version=2,
        method="eagle3",
        status="running",
        generation=0,
        attempts=1,
        source="webhook",
        reason="r",
        requested_at=t0 + 2 * HOUR,
        started_at=t0 + 6 * HOUR,
        finished_at=None,
    )
    assert last_sync([]) is None
    assert last_sync([finished_late, started_later])["target_version"] == 2
    assert last_sync([started_later, finished_late])["status"] == "running"
    finished_late.finished_at = t0 + 7 * HOUR
    assert last_sync([started_later, finished_late])["status"] == "succeeded"


def test_serving_is_held_to_what_validation_predicted_in_the_report_the_email_and_status(replaced_pair_world, tmp_path):
    """d2 was validated to serve 0.94-0.99 over its first 1,200 drafted tokens and served 0.92: the review finds that
    validation over-predicted, and the e-mail and status say so. d1 carries no prediction (registered by hand): the
    review says so and finds nothing. A window longer than the pair has served: no finding, and how many more."""
    from draftsync.cli.status_query import current_status
    from draftsync.flows.weekly_report import weekly_report
    from draftsync.registry.tags import prediction_tags
    from draftsync.tasks import context

    w, now = replaced_pair_world, replaced_pair_world["now"]
    prediction = {
        "traffic": "the validation set",
        "requests": 40,
        "gamma": 4,
        "temperature": 0.0,
        "window_draft_tokens": 1200,
        "level": 0.9,
        "mean": [0.96, 0.94, 0.99],
        "p50": [0.96, 0.9, 1.0],
        "p5": [0.8, 0.7, 0.9],
    }
    registry = context.registry()
    for key, value in prediction_tags(prediction).items():
        registry.tag_version("status-llm-drafter", w["d2"], key, value)

    report = weekly_report(now=now, send=False, act=False)
    found = [f for f in report["findings"] if f["rule"] == "prediction"]
    ((finding),) = [f for f in found if f["deployment"] == "assistant"]
    assert (finding["severity"], finding["action"]) == ("warning", "none")
    assert finding["message"] == (
        f"drafter v{w['d2']}: validation over-predicted: served 0.92 over 1200 drafted, predicted 0.94-0.99"
    )
    notes = "\n".join(report["notes"])
    assert f"t{w['v1']} + d{w['d1']}, held to its validation: no prediction" in notes
    row = next(r for r in report["deployments"] if r["name"] == "assistant")
    assert [p["verdict"] for p in row["predictions"]] == ["no prediction", "over-predicted"]
    status = current_status(now)
    assistant = next(d for t in status["targets"] for d in t["deployments"] if d["name"] == "assistant")
    assert [f["rule"] for f in assistant["findings"]] == ["prediction"]
    flat = " ".join(CliRunner().invoke(_cli(), ["status"], env=WIDE).output.split())
    assert "warning prediction: drafter v" in flat and "validation over-predicted: served 0.92" in flat

    registry.tag_version("status-llm-drafter", w["d2"], "draftsync.prediction.window_draft_tokens", "100000")
    report = weekly_report(now=now, send=False, act=False)
    assert not [f for f in report["findings"] if f["rule"] == "prediction" and f["deployment"] == "assistant"]
    assert "too few drafted tokens to judge: 3000 of the 100000 its prediction (0.94-0.99) is for, 97000 more" in (
        "\n".join(report["notes"])
    )
