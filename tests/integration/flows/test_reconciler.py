"""The registry watch as reconciler: the job of a sync whose worker died is given back and its event sent again,
a job whose run is alive is left alone, and a sync whose worker dies every time stops after MAX_ATTEMPTS."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime

from draftsync.monitors.sync_jobs import MAX_ATTEMPTS
from draftsync.tasks import context, events

from tests.support.prefect_events import target_events


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) a moment ago."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(finished.stdout)


def test_the_watch_gives_back_a_dead_runs_job_and_leaves_a_live_one(workdir):
    from draftsync.flows.watch import watch

    started = datetime.now(UTC)
    ledger = context.sync_ledger()
    host = socket.gethostname()
    dead_owner = f"no-run@{host}:{dead_pid()}"
    live_owner = f"no-run@{host}:{os.getpid()}"
    assert ledger.claim("crashed-llm", 3, "eagle3", run_id=dead_owner).outcome == "claimed"
    assert ledger.claim("busy-llm", 1, "eagle3", run_id=live_owner).outcome == "claimed"
    worn = "worn-llm"
    assert ledger.claim(worn, 2, "eagle3", run_id=dead_owner).outcome == "claimed"
    for _ in range(MAX_ATTEMPTS - 1):  # its worker died each time a run took it over
        assert ledger.claim(worn, 2, "eagle3", run_id=dead_owner, takeover_from=dead_owner).outcome == "claimed"

    result = watch(dispatch="event")

    assert sorted((r["target_name"], r["status"]) for r in result["released"]) == [
        ("crashed-llm", "requested"),
        ("worn-llm", "failed"),
    ]
    assert ledger.get("crashed-llm", 3, "eagle3").status == "requested"
    assert (ledger.get("busy-llm", 1, "eagle3").status, ledger.get("busy-llm", 1, "eagle3").run_id) == (
        "running",
        live_owner,
    )
    assert ledger.get(worn, 2, "eagle3").status == "failed"
    (event,) = target_events(events.SYNC_REQUESTED, started, "crashed-llm", 3, wanted=1)
    assert event.payload["source"] == "reconciler" and "died" in event.payload["reason"]
    assert target_events(events.SYNC_REQUESTED, started, worn, 2, wanted=0) == []

    again = watch(dispatch="event")  # nothing left to give back: the released job waits for its sync run
    assert again["released"] == []
