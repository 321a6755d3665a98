"""Reading back the events draftsync emitted about a target version from the Prefect API the test runs against."""

from __future__ import annotations

import time
from datetime import datetime


def target_events(name: str, since: datetime, target: str, version: int, wanted: int) -> list:
    """Events `name` about `target` v`version` stored since `since`, once `wanted` have arrived.

    Events travel to the API in the background and are stored in batches, so this waits for them (up to a minute),
    then returns what is there."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    wanted_filter = EventFilter(
        occurred=EventOccurredFilter(since=since),
        event=EventNameFilter(name=[name]),
        resource=EventResourceFilter(id=[f"draftsync.target.{target}.v{version}"]),
    )
    with get_client(sync_client=True) as client:
        for _ in range(120):
            found = client.read_events(filter=wanted_filter, limit=50).events
            if len(found) >= wanted:
                break
            time.sleep(0.5)
    return found
