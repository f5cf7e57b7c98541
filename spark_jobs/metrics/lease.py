"""The lease that keeps one live driver per job and checkpoint location.

Two drivers on one checkpoint would both commit batches, and a sink is exactly-once only
for one writer. The driver acquires the lease before its query starts and renews it well
within its time to live; a driver that dies stops renewing, so the lease expires and a
restarted driver (an Airflow retry) takes over. A driver that finds its lease taken stops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from spark_jobs.metrics.schema import backlog_leases, create_tables, make_engine

logger = logging.getLogger(__name__)


class LeaseHeld(RuntimeError):
    """Another live driver holds the lease; the message names it and until when."""


@dataclass(frozen=True)
class Lease:
    job_name: str
    checkpoint_location: str
    run_id: str
    acquired_at: datetime
    expires_at: datetime
    spark_ui_url: str | None
    released_at: datetime | None

    def alive(self, now: datetime) -> bool:
        return self.released_at is None and self.expires_at > now


def _row_to_lease(row: sa.Row) -> Lease:
    values = dict(row._mapping)
    for key in ("acquired_at", "expires_at", "released_at"):
        if values[key] is not None and values[key].tzinfo is None:
            values[key] = values[key].replace(tzinfo=UTC)
    return Lease(**values)


class LeaseStore:
    """Reads and writes leases in the metrics database."""

    def __init__(self, url: str, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self._engine = make_engine(url)
        self._clock = clock

    def close(self) -> None:
        self._engine.dispose()

    def get(self, job_name: str, checkpoint_location: str) -> Lease | None:
        table = backlog_leases
        with self._engine.begin() as connection:
            create_tables(connection)
            row = connection.execute(
                sa.select(table).where(
                    table.c.job_name == job_name,
                    table.c.checkpoint_location == checkpoint_location,
                )
            ).one_or_none()
        return None if row is None else _row_to_lease(row)

    def acquire(
        self,
        job_name: str,
        checkpoint_location: str,
        run_id: str,
        ttl_s: float,
        spark_ui_url: str | None = None,
        wait_s: float = 0.0,
    ) -> Lease:
        """Take the lease, waiting up to ``wait_s`` for a holder's lease to expire; raise
        LeaseHeld naming the holder if it is still renewed.

        A holder that is alive renews every third of its time to live, so waiting one time
        to live tells a live holder from a dead one.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._try_acquire(job_name, checkpoint_location, run_id, ttl_s, spark_ui_url)
            except LeaseHeld:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(1.0, ttl_s / 3))

    def _try_acquire(
        self,
        job_name: str,
        checkpoint_location: str,
        run_id: str,
        ttl_s: float,
        spark_ui_url: str | None,
    ) -> Lease:
        table = backlog_leases
        now = self._clock()
        values = {
            "run_id": run_id,
            "acquired_at": now,
            "expires_at": now + timedelta(seconds=ttl_s),
            "spark_ui_url": spark_ui_url,
            "released_at": None,
        }
        where = (table.c.job_name == job_name) & (
            table.c.checkpoint_location == checkpoint_location
        )
        with self._engine.begin() as connection:
            create_tables(connection)
            taken = connection.execute(
                table.update()
                .where(where, (table.c.released_at.is_not(None)) | (table.c.expires_at <= now))
                .values(**values)
            ).rowcount
            if not taken:
                try:
                    # A savepoint: a concurrent driver's insert must not abort the transaction.
                    with connection.begin_nested():
                        connection.execute(
                            table.insert().values(
                                job_name=job_name,
                                checkpoint_location=checkpoint_location,
                                **values,
                            )
                        )
                    taken = 1
                except sa.exc.IntegrityError:
                    taken = 0
        if not taken:
            holder = self.get(job_name, checkpoint_location)
            assert holder is not None
            raise LeaseHeld(
                f"job {job_name!r} at checkpoint {checkpoint_location} is already run by "
                f"{holder.run_id} (lease renewed until {holder.expires_at.isoformat()}); "
                "stop it first, or wait for its lease to expire if its driver has died"
            )
        lease = self.get(job_name, checkpoint_location)
        assert lease is not None
        return lease

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend a lease still held by its run; False if it was lost (taken over)."""
        table = backlog_leases
        with self._engine.begin() as connection:
            renewed = connection.execute(
                table.update()
                .where(
                    table.c.job_name == lease.job_name,
                    table.c.checkpoint_location == lease.checkpoint_location,
                    table.c.run_id == lease.run_id,
                    table.c.released_at.is_(None),
                )
                .values(expires_at=self._clock() + timedelta(seconds=ttl_s))
            ).rowcount
        return bool(renewed)

    def release(self, lease: Lease) -> None:
        table = backlog_leases
        with self._engine.begin() as connection:
            connection.execute(
                table.update()
                .where(
                    table.c.job_name == lease.job_name,
                    table.c.checkpoint_location == lease.checkpoint_location,
                    table.c.run_id == lease.run_id,
                )
                .values(released_at=self._clock())
            )


class LeaseKeeper:
    """Renews a held lease every third of its time to live on its own thread; calls
    ``on_lost`` once if it finds the lease gone (another driver took over)."""

    def __init__(self, store: LeaseStore, lease: Lease, on_lost: Callable[[], None], ttl_s: float):
        self._store = store
        self.lease = lease
        self._on_lost = on_lost
        self._ttl_s = ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="backlog-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._ttl_s / 3):
            try:
                held = self._store.renew(self.lease, self._ttl_s)
            except sa.exc.SQLAlchemyError as error:
                logger.warning("cannot renew the lease (will retry): %s", error)
                continue
            if not held:
                logger.error("lost the lease of %s: another driver took over", self.lease)
                self._on_lost()
                return

    def release(self) -> None:
        """Stop renewing and let the lease go (the run ended cleanly)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._store.release(self.lease)
