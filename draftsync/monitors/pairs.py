"""Serving pairs: what each deployment serves now (target version, its drafter, gamma, endpoint, state)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

from sqlalchemy import select

from draftsync.errors import DraftsyncError
from draftsync.monitors.database import Repository
from draftsync.monitors.tables import PairState, ServedPair, ServingPair, as_utc


class ServingPairs(Repository):
    """The `serving_pairs` table of the monitor store: one row per deployment."""

    def record(
        self,
        deployment: str,
        pair: ServedPair | ServingPair,
        *,
        endpoint: str,
        state: PairState,
        now: datetime | None = None,
    ) -> ServingPair:
        """Record that `deployment` serves `pair` now, at `endpoint` (insert or replace)."""
        _check_pair_state(deployment, state)
        now = as_utc(now or datetime.now(UTC))
        values = dict(
            target_name=pair.target_name,
            target_version=int(pair.target_version),
            drafter_name=pair.drafter_name,
            drafter_version=None if pair.drafter_version is None else int(pair.drafter_version),
            gamma=int(pair.gamma),
            endpoint=endpoint,
            state=state,
            updated_at=now,
        )
        with self._database.transaction() as session:
            row = session.scalars(
                select(ServingPair).where(ServingPair.deployment == deployment).with_for_update()
            ).one_or_none()
            if row is None:
                row = ServingPair(deployment=deployment, **values)
                session.add(row)
            else:
                for name, value in values.items():
                    setattr(row, name, value)
            return row

    def set_state(self, deployment: str, state: PairState) -> ServingPair | None:
        """Change only the state of what `deployment` serves (None if it has no pair).

        The pair's `updated_at` stays: it dates the pair's start, from which the weekly review counts its weeks."""
        _check_pair_state(deployment, state)
        with self._database.transaction() as session:
            row = session.scalars(
                select(ServingPair).where(ServingPair.deployment == deployment).with_for_update()
            ).one_or_none()
            if row is not None:
                row.state = state
            return row

    def get(self, deployment: str) -> ServingPair | None:
        with self._database.transaction() as session:
            return session.scalars(select(ServingPair).where(ServingPair.deployment == deployment)).one_or_none()

    def all(self) -> list[ServingPair]:
        """Every deployment's pair, by deployment name."""
        with self._database.transaction() as session:
            return list(session.scalars(select(ServingPair).order_by(ServingPair.deployment)).all())


def _check_pair_state(deployment: str, state: str) -> None:
    states = get_args(PairState)
    if state not in states:
        raise DraftsyncError(
            f"serving pair state {state!r} for {deployment}", "use one of " + ", ".join(repr(s) for s in states)
        )
