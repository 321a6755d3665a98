"""The monitor store at scale: 1,000 deployments x 7 days x 1-minute samples (about 10M) on Postgres 15 and SQLite.

For each backend: the schema comes from `Store(url)` (the Alembic migrations); the week of samples is
bulk-loaded (COPY on Postgres, one executemany transaction on SQLite) with the hourly rollups that
`record_scrape` would have kept; then
- ingest: the real `record_scrape` (delta, sample, rollup upsert, one transaction each) on fresh
  deployments, scrapes per second;
- weekly report: what the weekly review reads and computes for every deployment, timed end to end:
  the serving pairs, `rollup_window` over the week (one query), `summarize_hourly` and the staleness
  rules per deployment; for a week starting on a whole hour (a report week) and for "the last 7 days"
  from an arbitrary minute (edges summed from samples);
- the old path for comparison: `samples()` + `summarize` for a few deployments, extrapolated to all.
Every tenth deployment's drafter decays from 0.80 to 0.45 acceptance over the week; the report must find
exactly those stale. A throwaway Postgres cluster is started with initdb/pg_ctl (fsync off) and removed.
Prints JSON. Run it on one core: `taskset -c 1 python bench/monitor_scale.py --json out.json`.

Usage: python bench/monitor_scale.py [--json PATH] [--postgres-bin DIR] [--deployments 1000] [--days 7]
       [--backends postgres,sqlite] [--ingest-scrapes 2000] [--sqlite-ingest-scrapes 300] [--workdir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import platform
import pwd
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WEEK_START = datetime(2026, 11, 2, tzinfo=UTC)  # Monday of ISO week 2026-W45
GAMMA = 3
STALE_EVERY = 10  # every tenth deployment decays
SAMPLE_COLUMNS = (
    "deployment",
    "ts",
    "interval_start",
    "target_name",
    "target_version",
    "drafter_version",
    "gamma",
    "drafts",
    "draft_tokens",
    "accepted",
    "accepted_per_position",
    "generation_tokens",
    "tpot_sum",
    "tpot_count",
    "reset",
)
ROLLUP_COLUMNS = (
    "deployment",
    "hour",
    "target_name",
    "target_version",
    "drafter_version",
    "gamma",
    "intervals",
    "resets",
    "drafts",
    "draft_tokens",
    "accepted",
    "accepted_per_position",
    "generation_tokens",
    "tpot_sum",
    "tpot_count",
    "last_ts",
)
POSTGRES_SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    "shared_buffers": "512MB",
    "maintenance_work_mem": "256MB",
    "max_wal_size": "4GB",
}


# --- data ----------------------------------------------------------------------------------------
def deployment_name(index: int) -> str:
    return f"dep-{index:04d}"


def week_of(index: int, minutes: int):
    """Per-minute counter deltas of one deployment (numpy arrays), seeded by its index."""
    import numpy as np

    rng = np.random.default_rng(index)
    if index % STALE_EVERY == 0:
        acceptance = np.linspace(0.80, 0.45, minutes)
    else:
        acceptance = np.full(minutes, rng.uniform(0.65, 0.90))
    drafts = rng.integers(20, 80, minutes)
    drafts[rng.random(minutes) < 0.05] = 0  # idle minutes
    position_rates = np.clip(acceptance[:, None] + np.array([0.10, 0.0, -0.10]), 0.0, 1.0)
    per_position = rng.binomial(drafts[:, None], position_rates)
    accepted = per_position.sum(axis=1)
    generation_tokens = drafts + accepted
    tpot_sum = generation_tokens * rng.uniform(0.008, 0.014)
    return drafts, per_position, accepted, generation_tokens, tpot_sum


def minute_stamps(minutes: int, fmt: str) -> list[str]:
    return [(WEEK_START + timedelta(minutes=k)).strftime(fmt) for k in range(minutes + 1)]


def hourly_sums(drafts, per_position, accepted, generation_tokens, tpot_sum):
    """The rollup rows' sums: sample k (ending at minute k+1) counts in hour k // 60, as `rollup_hour` says."""
    hours = len(drafts) // 60

    def by_hour(values):
        return values.reshape(hours, 60, *values.shape[1:]).sum(axis=1)

    return by_hour(drafts), by_hour(per_position), by_hour(accepted), by_hour(generation_tokens), by_hour(tpot_sum)


def rows_of(index: int, minutes: int, stamps: list[str], *, text: bool):
    """(sample rows, rollup rows) of one deployment: tab-separated COPY lines or tuples for executemany."""
    drafts, per_position, accepted, generation_tokens, tpot_sum = week_of(index, minutes)
    name = deployment_name(index)
    d, pp, acc, gen, tpot = (a.tolist() for a in (drafts, per_position, accepted, generation_tokens, tpot_sum))
    false = "f" if text else 0
    samples = []
    for k in range(minutes):
        values = (
            name,
            stamps[k + 1],
            stamps[k],
            "chat-llm",
            1,
            1,
            GAMMA,
            d[k],
            GAMMA * d[k],
            acc[k],
            json.dumps(pp[k]),
            gen[k],
            tpot[k],
            gen[k],
            false,
        )
        samples.append("\t".join(map(str, values)) if text else values)
    h_drafts, h_pp, h_acc, h_gen, h_tpot = (
        a.tolist() for a in hourly_sums(drafts, per_position, accepted, generation_tokens, tpot_sum)
    )
    rollups = []
    for h in range(len(h_drafts)):
        values = (
            name,
            stamps[60 * h],
            "chat-llm",
            1,
            1,
            GAMMA,
            60,
            0,
            h_drafts[h],
            GAMMA * h_drafts[h],
            h_acc[h],
            json.dumps(h_pp[h]),
            h_gen[h],
            h_tpot[h],
            h_gen[h],
            stamps[60 * (h + 1)],
        )
        rollups.append("\t".join(map(str, values)) if text else values)
    return samples, rollups


# --- Postgres ------------------------------------------------------------------------------------
def postgres_bin(explicit: str | None) -> Path:
    candidates = [explicit or "", os.environ.get("DRAFTSYNC_PG_BIN", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for candidate in candidates:
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    sys.exit("Postgres server binaries (initdb, pg_ctl) not found: pass --postgres-bin DIR")


@contextlib.contextmanager
def postgres_cluster(bin_dir: Path, root: Path) -> Iterator[str]:
    """A throwaway cluster on a free loopback port (as the `postgres` user under root); yields a database URL."""
    from draftsync.serving.process import free_port

    root.mkdir(parents=True, exist_ok=True)
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the cluster belongs to `postgres` (or `nobody`)
        os.chmod(root.parent, 0o711)
        owner = next(name for name in ("postgres", "nobody") if _user_exists(name))
        record = pwd.getpwnam(owner)
        os.chown(root, record.pw_uid, record.pw_gid)
        prefix = ["runuser", "-u", owner, "--"]
    data, log, port = root / "data", root / "server.log", free_port()

    def run(*args: str) -> None:
        done = subprocess.run(prefix + list(args), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            detail = done.stderr + (log.read_text() if log.exists() else "")
            raise RuntimeError(f"{Path(args[0]).name} failed: {detail}")

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
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 " + " ".join(
        f"-c {key}={value}" for key, value in POSTGRES_SETTINGS.items()
    )
    run(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "-t", "120", "start")
    try:
        run(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "draftsync", "monitor")
        yield f"postgresql+psycopg://draftsync@127.0.0.1:{port}/monitor"
    finally:
        subprocess.run(
            prefix + [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=300,
        )


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def load_postgres(url: str, deployments: int, minutes: int) -> dict:
    import psycopg
    from sqlalchemy import make_url

    parts = make_url(url)
    stamps = minute_stamps(minutes, "%Y-%m-%d %H:%M:%S+00")
    generate_s = copy_s = 0.0
    with psycopg.connect(host=parts.host, port=parts.port, user=parts.username, dbname=parts.database) as connection:
        with connection.cursor() as cursor:
            with cursor.copy(f"COPY samples ({', '.join(SAMPLE_COLUMNS)}) FROM STDIN") as sample_copy:
                rollup_lines = []
                for index in range(deployments):
                    t = time.perf_counter()
                    samples, rollups = rows_of(index, minutes, stamps, text=True)
                    block = "\n".join(samples) + "\n"
                    rollup_lines.extend(rollups)
                    generate_s += time.perf_counter() - t
                    t = time.perf_counter()
                    sample_copy.write(block)
                    copy_s += time.perf_counter() - t
            t = time.perf_counter()
            with cursor.copy(f"COPY hourly_rollups ({', '.join(ROLLUP_COLUMNS)}) FROM STDIN") as rollup_copy:
                rollup_copy.write("\n".join(rollup_lines) + "\n")
            pairs = io.StringIO(
                "".join(
                    f"{deployment_name(i)}\tchat-llm\t1\tchat-llm-drafter\t1\t{GAMMA}\thttp://10.0.0.{i % 250}:8000\t"
                    f"serving\t{stamps[0]}\n"
                    for i in range(deployments)
                )
            )
            with cursor.copy(
                "COPY serving_pairs (deployment, target_name, target_version, drafter_name, "
                "drafter_version, gamma, endpoint, state, updated_at) FROM STDIN"
            ) as pair_copy:
                pair_copy.write(pairs.getvalue())
        connection.commit()
        copy_s += time.perf_counter() - t
        t = time.perf_counter()
        connection.autocommit = True
        connection.execute("ANALYZE")
        analyze_s = time.perf_counter() - t
        size = connection.execute("SELECT pg_database_size(current_database())").fetchone()[0]
    return {
        "generate_s": round(generate_s, 1),
        "copy_s": round(copy_s, 1),
        "analyze_s": round(analyze_s, 1),
        "database_mib": round(size / 2**20),
    }


# --- SQLite --------------------------------------------------------------------------------------
def load_sqlite(path: Path, deployments: int, minutes: int) -> dict:
    stamps = minute_stamps(minutes, "%Y-%m-%d %H:%M:%S.000000")  # SQLAlchemy's SQLite DATETIME text
    generate_s = insert_s = 0.0
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA synchronous=OFF")  # this connection only: the load is rerun, not recovered
    connection.execute("PRAGMA journal_mode=MEMORY")
    sample_sql = f"INSERT INTO samples ({', '.join(SAMPLE_COLUMNS)}) VALUES ({', '.join('?' * len(SAMPLE_COLUMNS))})"
    rollup_sql = (
        f"INSERT INTO hourly_rollups ({', '.join(ROLLUP_COLUMNS)}) VALUES ({', '.join('?' * len(ROLLUP_COLUMNS))})"
    )
    with connection:
        for index in range(deployments):
            t = time.perf_counter()
            samples, rollups = rows_of(index, minutes, stamps, text=False)
            generate_s += time.perf_counter() - t
            t = time.perf_counter()
            connection.executemany(sample_sql, samples)
            connection.executemany(rollup_sql, rollups)
            insert_s += time.perf_counter() - t
        connection.executemany(
            "INSERT INTO serving_pairs (deployment, target_name, target_version, drafter_name, drafter_version, gamma,"
            " endpoint, state, updated_at) VALUES (?, 'chat-llm', 1, 'chat-llm-drafter', 1, ?, ?, 'serving', ?)",
            [(deployment_name(i), GAMMA, f"http://10.0.0.{i % 250}:8000", stamps[0]) for i in range(deployments)],
        )
    connection.close()
    return {
        "generate_s": round(generate_s, 1),
        "insert_s": round(insert_s, 1),
        "database_mib": round(path.stat().st_size / 2**20),
    }


# --- measurements --------------------------------------------------------------------------------
def ingest_rate(store, scrapes: int, start: datetime) -> dict:
    """The real `record_scrape`: 50 fresh deployments scraped in turn, a minute apart, after the loaded week."""
    from draftsync.monitors.metrics import SpecDecodeCounters
    from draftsync.monitors.tables import ServedPair

    pair = ServedPair("chat-llm", 1, 1, GAMMA)
    fleet = [f"live-{i:03d}" for i in range(50)]
    for name in fleet:  # baselines first: the timed scrapes all store a sample and a rollup update
        store.acceptance.record_scrape(name, start, SpecDecodeCounters(0, 0, 0, (0, 0, 0)), pair)
    t = time.perf_counter()
    for step in range(scrapes):
        n = step // len(fleet) + 1
        counters = SpecDecodeCounters(40 * n, 120 * n, 80 * n, (32 * n, 27 * n, 21 * n), 120 * n, 1.2 * n, 120 * n)
        store.acceptance.record_scrape(fleet[step % len(fleet)], start + timedelta(minutes=n), counters, pair)
    seconds = time.perf_counter() - t
    return {
        "scrapes": scrapes,
        "seconds": round(seconds, 2),
        "scrapes_per_s": round(scrapes / seconds, 1),
        "ms_per_scrape": round(1000 * seconds / scrapes, 2),
    }


def weekly_report_reads(store, since: datetime, until: datetime) -> dict:
    """What the weekly review does per deployment, for all of them: pairs, rollups, summary, rules."""
    from draftsync.monitors.staleness import Thresholds, evaluate
    from draftsync.monitors.trends import summarize_hourly

    t0 = time.perf_counter()
    pairs = store.pairs.all()
    window = store.acceptance.rollup_window(since, until, [p.deployment for p in pairs])
    t1 = time.perf_counter()
    summaries = [summarize_hourly(window.get(p.deployment, []), since, until, deployment=p.deployment) for p in pairs]
    t2 = time.perf_counter()
    thresholds = Thresholds()
    findings = [
        evaluate(summary, p.target_version, p.target_version, thresholds)  # lineage in order here
        for summary, p in zip(summaries, pairs, strict=True)
    ]
    t3 = time.perf_counter()
    stale = sorted(
        s.deployment for s, found in zip(summaries, findings, strict=True) if any(f.rule == "stale" for f in found)
    )
    return {
        "deployments": len(pairs),
        "hourly_rows": sum(len(rows) for rows in window.values()),
        "samples_covered": sum(s.intervals for s in summaries),
        "store_read_s": round(t1 - t0, 3),
        "summaries_s": round(t2 - t1, 3),
        "rules_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3),
        "stale": stale,
    }


def timed_report(store, since: datetime, until: datetime, repeats: int, deployments: int) -> dict:
    runs = [weekly_report_reads(store, since, until) for _ in range(repeats)]
    expected_stale = [deployment_name(i) for i in range(0, deployments, STALE_EVERY)]
    first = runs[0]
    return {
        "window": [since.isoformat(), until.isoformat()],
        "deployments": first["deployments"],
        "hourly_rows": first["hourly_rows"],
        "samples_covered": first["samples_covered"],
        "total_s": [r["total_s"] for r in runs],
        "total_s_median": statistics.median(r["total_s"] for r in runs),
        "store_read_s": [r["store_read_s"] for r in runs],
        "summaries_s": [r["summaries_s"] for r in runs],
        "rules_s": [r["rules_s"] for r in runs],
        "stale_found": len(first["stale"]),
        "stale_as_planted": first["stale"] == expected_stale,
    }


def raw_path(store, since: datetime, until: datetime, deployments: int, sample_count: int) -> dict:
    """The pre-rollup path (`samples()` + `summarize`) for a few deployments, extrapolated to all."""
    from draftsync.monitors.trends import summarize

    names = [deployment_name(i) for i in range(0, deployments, max(1, deployments // sample_count))][:sample_count]
    t = time.perf_counter()
    for name in names:
        summarize(store.acceptance.samples(name, since, until), since, until, deployment=name)
    seconds = time.perf_counter() - t
    per_deployment = seconds / len(names)
    return {
        "deployments_timed": len(names),
        "seconds_per_deployment": round(per_deployment, 3),
        "extrapolated_all_s": round(per_deployment * deployments, 1),
    }


def rollups_match_samples(store, since: datetime, until: datetime, deployments: int) -> bool:
    """The bulk-loaded rollups sum exactly what the samples hold (spot check of three deployments).

    TPOT sums are floats added in another order, so they are compared to 9 significant digits."""
    from dataclasses import replace

    from draftsync.monitors.rollups import hourly_rows

    def rounded(rows):
        return [replace(r, tpot_sum=float(f"{r.tpot_sum:.9g}")) for r in rows]

    for index in (0, deployments // 2, deployments - 1):
        name = deployment_name(index)
        if rounded(store.acceptance.hourly(name, since, until)) != rounded(
            hourly_rows(store.acceptance.samples(name, since, until))
        ):
            return False
    return True


def measure(backend: str, url: str, args, load) -> dict:
    from draftsync.monitors.store import Store

    minutes = args.days * 24 * 60
    week_end = WEEK_START + timedelta(days=args.days)
    t = time.perf_counter()
    Store(url).close()  # the schema, through the migrations
    migrate_s = time.perf_counter() - t
    t = time.perf_counter()
    loaded = load()
    loaded["seconds"] = round(time.perf_counter() - t, 1)
    loaded["samples"] = args.deployments * minutes
    loaded["samples_per_s"] = round(loaded["samples"] / loaded["seconds"])
    store = Store(url)
    try:
        result = {"backend": backend, "migrate_new_database_s": round(migrate_s, 2), "bulk_load": loaded}
        print(f"[{backend}] loaded {loaded['samples']:,} samples in {loaded['seconds']} s", file=sys.stderr)
        result["weekly_report_aligned_week"] = timed_report(store, WEEK_START, week_end, args.repeats, args.deployments)
        odd_end = week_end - timedelta(minutes=17)
        result["weekly_report_last_7_days_at_a_minute"] = timed_report(
            store, odd_end - timedelta(days=args.days), odd_end, args.repeats, args.deployments
        )
        result["old_path_samples_and_summarize"] = raw_path(store, WEEK_START, week_end, args.deployments, 5)
        result["rollups_match_samples"] = rollups_match_samples(store, WEEK_START, week_end, args.deployments)
        scrapes = args.ingest_scrapes if backend == "postgres" else args.sqlite_ingest_scrapes
        result["record_scrape"] = ingest_rate(store, scrapes, week_end + timedelta(hours=1))
        print(
            f"[{backend}] report {result['weekly_report_aligned_week']['total_s']} s; "
            f"record_scrape {result['record_scrape']['scrapes_per_s']}/s",
            file=sys.stderr,
        )
        return result
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--postgres-bin", help="folder with initdb and pg_ctl (default: /usr/lib/postgresql/*/bin)")
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--backends", default="postgres,sqlite")
    parser.add_argument("--ingest-scrapes", type=int, default=2000, help="record_scrape calls timed on Postgres")
    parser.add_argument(
        "--sqlite-ingest-scrapes",
        type=int,
        default=300,
        help="record_scrape calls timed on SQLite (each commit is synced to disk)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, help="where the databases go (default: a temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = set(backends) - {"postgres", "sqlite"}
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}: use postgres and/or sqlite")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-monitor-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    minutes = args.days * 24 * 60
    result = {
        "deployments": args.deployments,
        "days": args.days,
        "samples": args.deployments * minutes,
        "machine": {
            "cpus": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
        },
        "backends": {},
    }
    started = time.perf_counter()
    try:
        if "postgres" in backends:
            bin_dir = postgres_bin(args.postgres_bin)
            result["postgres_server"] = {"bin": str(bin_dir), "settings": POSTGRES_SETTINGS}
            with postgres_cluster(bin_dir, workdir / "pg") as url:
                result["backends"]["postgres"] = measure(
                    "postgres", url, args, lambda: load_postgres(url, args.deployments, minutes)
                )
        if "sqlite" in backends:
            path = workdir / "monitor.db"
            path.unlink(missing_ok=True)
            result["backends"]["sqlite"] = measure(
                "sqlite", f"sqlite:///{path}", args, lambda: load_sqlite(path, args.deployments, minutes)
            )
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    pg = result["backends"].get("postgres")
    if pg:
        median = pg["weekly_report_aligned_week"]["total_s_median"]
        result["must_show_weekly_report_on_postgres_under_5s"] = median < 5.0
    from bench.harness import emit_json

    emit_json(result, args.json)


if __name__ == "__main__":
    main()
