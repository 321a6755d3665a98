"""The monitor's SQL store: one database (`draftsync.monitors.database`) and one repository per kind of record.

    store = Store(url)
    store.acceptance  # samples, hourly rollups, the scrape baselines, booked per-request acceptance (acceptance.py)
    store.watermarks  # the last processed version per key (watermarks.py)
    store.pairs       # what each deployment serves (pairs.py)
    store.alerts      # the alerts sent, for de-duplication (alerts.py)
    store.outbox      # the e-mails written and their delivery (outbox.py)
    store.ledger      # sync jobs and webhook deliveries (sync_jobs.py)

Every repository runs its calls in the store's one `transaction()`, so a failing database is the same
DraftsyncError (`draftsync.monitors.store_failures`) whichever kind of record was read or written. The tables are
in `draftsync.monitors.tables` (the ledger's in `sync_jobs.py`).
"""

from __future__ import annotations

from draftsync.monitors.acceptance import AcceptanceRecords
from draftsync.monitors.alerts import Alerts
from draftsync.monitors.database import Database
from draftsync.monitors.outbox import Outbox
from draftsync.monitors.pairs import ServingPairs
from draftsync.monitors.sync_jobs import SyncLedger
from draftsync.monitors.watermarks import Watermarks


class Store(Database):
    """The monitor database, opened (and migrated) once, with a repository per kind of record over it."""

    def __init__(self, url: str, *, echo: bool = False):
        super().__init__(url, echo=echo)
        self.watermarks = Watermarks(self)
        self.acceptance = AcceptanceRecords(self, self.watermarks)
        self.pairs = ServingPairs(self)
        self.alerts = Alerts(self)
        self.outbox = Outbox(self)
        self.ledger = SyncLedger(self)
