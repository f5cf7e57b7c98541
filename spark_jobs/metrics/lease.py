"""The lease that keeps one live driver per checkpoint: both sides of its protocol.

Two drivers on one checkpoint would both commit batches, and a sink is exactly-once only
for one writer. The driver takes the lease of its checkpoint location before its query
starts and renews it well within its time to live; a driver that dies stops renewing, the
lease expires, and a restarted driver (an Airflow retry) takes over. Airflow reads the same
rows to find a job's live run.

Every lease time is the database's: hosts' clocks differ, and a driver whose clock runs
ahead must not see a lease as expired that its holder renewed a moment ago. The holder
itself judges how long its lease is confirmed with its own monotonic clock, from just
before the renewal it sent, so it stops starting batches before any other driver could
take the lease over, whatever the wall clocks say.

The lease is keyed by the checkpoint location (normalized): a checkpoint holds one job's
offsets and state, so a second job name on it is refused as firmly as a second driver.

A handover (a make-before-break relaunch) keeps the gap between two runs short: the next
run warms up first, then stands by, named on the holder's row so that Airflow knows it is
ready, and polls the row a few times a second. Airflow then asks the holder to stop; the
holder releases the lease after its last commit, and the standby takes it at once. It
never runs a batch before it holds the lease, and one that waits in vain gives up after
its own deadline while the holder serves on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa

from spark_jobs.backlog.secrets import redact_text
from spark_jobs.metrics.periodic import PeriodicThread
from spark_jobs.metrics.schema import as_utc, backlog_leases, create_tables, make_engine

logger = logging.getLogger(__name__)

#: The holder stops starting batches this share of the time to live before its lease could
#: expire, leaving room for a batch start that was already being decided.
FENCE_MARGIN = 0.1
#: While renewals fail, a warning at most this often (and when batches stop).
WARN_EVERY_S = 10.0
#: How often a standby reads the lease row: a release wakes it within this.
HANDOVER_POLL_S = 0.15


class LeaseHeld(RuntimeError):
    """The checkpoint's lease is held (by a live driver, or by another job); the message
    names the holder."""


class LeaseLost(RuntimeError):
    """This run's lease was taken over by another run: it must stop at once."""


@dataclass(frozen=True)
class Lease:
    job_name: str
    checkpoint_location: str
    run_id: str
    acquired_at: datetime
    expires_at: datetime
    spark_ui_url: str | None
    released_at: datetime | None
    #: A run warmed up and standing by to take over, and since when (database time).
    standby_run_id: str | None = None
    standby_since: datetime | None = None

    def alive(self, now: datetime) -> bool:
        """Held and renewed: ``now`` must be the database's time."""
        return self.released_at is None and self.expires_at > now


@dataclass(frozen=True)
class Acquired:
    """A lease just taken, and the run that held it before (whose last batches may have
    committed without being recorded)."""

    lease: Lease
    previous_run_id: str | None
    #: Until when (this host's monotonic clock) the lease is surely held.
    confirmed_until: float


def database_now(connection: sa.Connection) -> datetime:
    """The database's current time, in UTC. SQLite's clock is the clock of the host using
    the file, which is also the only host that can."""
    if connection.dialect.name == "sqlite":
        text = connection.exec_driver_sql("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')").scalar()
        now = as_utc(str(text))
    else:
        now = as_utc(connection.execute(sa.select(sa.func.clock_timestamp())).scalar())
    assert now is not None
    return now


def _lease(row: sa.Row) -> Lease:
    values = dict(row._mapping)
    for key in ("acquired_at", "expires_at", "released_at", "standby_since"):
        values[key] = as_utc(values[key])
    return Lease(**values)


def lease_at(connection: sa.Connection, checkpoint_location: str) -> Lease | None:
    table = backlog_leases
    row = connection.execute(
        sa.select(table).where(table.c.checkpoint_location == checkpoint_location)
    ).one_or_none()
    return None if row is None else _lease(row)


def live_lease(connection: sa.Connection, job_name: str) -> Lease | None:
    """The lease of ``job_name`` that a driver holds and renews, if any."""
    table = backlog_leases
    row = connection.execute(
        sa.select(table).where(
            table.c.job_name == job_name,
            table.c.released_at.is_(None),
            table.c.expires_at > database_now(connection),
        )
    ).first()
    return None if row is None else _lease(row)


def latest_lease(
    connection: sa.Connection, job_name: str, run_id: str | None = None
) -> Lease | None:
    """The job's most recently taken lease (of ``run_id``, when given)."""
    table = backlog_leases
    query = sa.select(table).where(table.c.job_name == job_name)
    if run_id is not None:
        query = query.where(table.c.run_id == run_id)
    row = connection.execute(query.order_by(table.c.acquired_at.desc()).limit(1)).first()
    return None if row is None else _lease(row)


def release_run(connection: sa.Connection, job_name: str, run_id: str) -> bool:
    """Let go of ``run_id``'s lease (its driver has ended); False if it held none."""
    table = backlog_leases
    result = connection.execute(
        table.update()
        .where(
            table.c.job_name == job_name, table.c.run_id == run_id, table.c.released_at.is_(None)
        )
        .values(released_at=database_now(connection))
    )
    return result.rowcount > 0


def offer_standby(connection: sa.Connection, lease: Lease, run_id: str) -> bool:
    """Name ``run_id`` on ``lease``'s row as standing by to take over; False when that run
    no longer holds it (it let go or another took over meanwhile)."""
    return _update_held(
        connection, lease, standby_run_id=run_id, standby_since=database_now(connection)
    )


def _update_held(connection: sa.Connection, lease: Lease, **values: object) -> bool:
    """Set ``values`` on ``lease``'s row while its run still holds it; False once it does not."""
    table = backlog_leases
    result = connection.execute(
        table.update()
        .where(
            table.c.checkpoint_location == lease.checkpoint_location,
            table.c.run_id == lease.run_id,
            table.c.released_at.is_(None),
        )
        .values(**values)
    )
    return result.rowcount > 0


def withdraw_standby(connection: sa.Connection, checkpoint_location: str, run_id: str) -> None:
    """Take ``run_id``'s name off the row it stood by on (it gave up waiting)."""
    table = backlog_leases
    connection.execute(
        table.update()
        .where(
            table.c.checkpoint_location == checkpoint_location,
            table.c.standby_run_id == run_id,
        )
        .values(standby_run_id=None, standby_since=None)
    )


def standing_by(connection: sa.Connection, job_name: str, run_id: str) -> Lease | None:
    """The live lease of ``job_name`` that ``run_id`` stands by to take over, if any."""
    held = live_lease(connection, job_name)
    return held if held is not None and held.standby_run_id == run_id else None


class LeaseStore:
    """Takes, renews and releases leases in the metrics database."""

    def __init__(self, url: str, monotonic: Callable[[], float] = time.monotonic):
        self._engine = make_engine(url)
        self._monotonic = monotonic
        self._tables_ready = False

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[sa.Connection]:
        with self._engine.begin() as connection:
            if not self._tables_ready:
                create_tables(connection)
            yield connection
        self._tables_ready = True

    def get(self, checkpoint_location: str) -> Lease | None:
        with self._engine.connect() as connection:
            return lease_at(connection, checkpoint_location)

    def acquire(
        self,
        job_name: str,
        checkpoint_location: str,
        run_id: str,
        ttl_s: float,
        spark_ui_url: str | None = None,
        wait_s: float = 0.0,
    ) -> Acquired:
        """Take the lease of ``checkpoint_location``, waiting up to ``wait_s`` for a holder's
        lease to expire; raise LeaseHeld naming the holder if it is still renewed, or at once
        if the checkpoint belongs to another job.

        A holder that is alive renews every third of its time to live, so waiting one time
        to live tells a live holder from a dead one.
        """
        deadline = self._monotonic() + wait_s
        while True:
            try:
                return self._try_acquire(job_name, checkpoint_location, run_id, ttl_s, spark_ui_url)
            except _Busy as busy:
                if self._monotonic() >= deadline:
                    raise LeaseHeld(str(busy)) from None
            time.sleep(min(1.0, ttl_s / 3))

    def check_free(
        self, job_name: str, checkpoint_location: str, ttl_s: float, wait_s: float
    ) -> None:
        """Raise LeaseHeld where ``acquire`` would, waiting as long, without taking the
        lease: a launch asks this before it starts a Spark session, which the lease's row
        names (its UI), so that a refused launch costs a database read, not a JVM."""
        deadline = self._monotonic() + wait_s
        while True:
            with self._transaction() as connection:
                held = lease_at(connection, checkpoint_location)
                alive = held is not None and held.alive(database_now(connection))
            if held is not None and held.job_name != job_name:
                raise LeaseHeld(_another_job(job_name, held))
            if not alive:
                return
            if self._monotonic() >= deadline:
                raise LeaseHeld(_held_by(held))
            time.sleep(min(1.0, ttl_s / 3))

    def take_over(
        self,
        job_name: str,
        checkpoint_location: str,
        run_id: str,
        ttl_s: float,
        spark_ui_url: str | None = None,
        *,
        wait_s: float,
        poll_s: float = HANDOVER_POLL_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Acquired:
        """Stand by for the lease of ``checkpoint_location`` and take it as soon as its
        holder lets go (or its lease expires); at once if nobody holds it. While waiting,
        this run is named on the holder's row (``standby_run_id``). Past ``wait_s`` the
        name is taken off again and LeaseHeld raised, naming the holder.

        The row is read, not written, while it is held: a poll every ``poll_s`` costs the
        holder's database no lock.
        """
        deadline = self._monotonic() + wait_s
        offered_to: str | None = None
        try:
            while True:
                with self._engine.connect() as connection:
                    held = lease_at(connection, checkpoint_location)
                    alive = held is not None and held.alive(database_now(connection))
                if held is not None and held.job_name != job_name:
                    raise LeaseHeld(_another_job(job_name, held))
                if not alive:
                    try:
                        return self._try_acquire(
                            job_name, checkpoint_location, run_id, ttl_s, spark_ui_url
                        )
                    except _Busy:
                        pass  # another run was quicker; it is the holder to wait for now
                elif held is not None and offered_to != held.run_id:
                    with self._transaction() as connection:
                        if offer_standby(connection, held, run_id):
                            offered_to = held.run_id
                            logger.info("standing by to take over from run %s", held.run_id)
                if self._monotonic() >= deadline:
                    holder = _held_by(held) if held is not None and alive else "it was taken"
                    raise LeaseHeld(
                        f"run {run_id} stood by {wait_s:g} s for the lease of "
                        f"{checkpoint_location}, which was not handed over: {holder}"
                    )
                sleep(poll_s)
        except BaseException:
            if offered_to is not None:
                self._withdraw_offer(checkpoint_location, run_id)
            raise

    def _withdraw_offer(self, checkpoint_location: str, run_id: str) -> None:
        try:
            with self._transaction() as connection:
                withdraw_standby(connection, checkpoint_location, run_id)
        except sa.exc.SQLAlchemyError as error:  # the name stays; the run's end tells Airflow
            logger.warning(
                "could not withdraw the standby of run %s: %s", run_id, redact_text(str(error))
            )

    def _try_acquire(
        self,
        job_name: str,
        checkpoint_location: str,
        run_id: str,
        ttl_s: float,
        spark_ui_url: str | None,
    ) -> Acquired:
        table = backlog_leases
        started = self._monotonic()
        with self._transaction() as connection:
            now = database_now(connection)
            held = lease_at(connection, checkpoint_location)
            values = {
                "job_name": job_name,
                "run_id": run_id,
                "acquired_at": now,
                "expires_at": now + timedelta(seconds=ttl_s),
                "spark_ui_url": spark_ui_url,
                "released_at": None,
                "standby_run_id": None,
                "standby_since": None,
            }
            if held is not None and held.job_name != job_name:
                raise LeaseHeld(_another_job(job_name, held))
            if held is None:
                try:
                    with connection.begin_nested():  # a concurrent insert must not abort it all
                        connection.execute(
                            table.insert().values(checkpoint_location=checkpoint_location, **values)
                        )
                except sa.exc.IntegrityError:
                    raise _Busy(f"checkpoint {checkpoint_location} was just taken") from None
            else:
                taken = connection.execute(
                    table.update()
                    .where(
                        table.c.checkpoint_location == checkpoint_location,
                        table.c.job_name == job_name,
                        table.c.released_at.is_not(None) | (table.c.expires_at <= now),
                    )
                    .values(**values)
                ).rowcount
                if not taken:
                    raise _Busy(_held_by(held))
        lease = Lease(checkpoint_location=checkpoint_location, **values)  # type: ignore[arg-type]
        previous = held.run_id if held is not None else None
        return Acquired(lease, previous, started + ttl_s)

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend a lease still held by its run; False if it was lost (taken over)."""
        with self._transaction() as connection:
            expires_at = database_now(connection) + timedelta(seconds=ttl_s)
            return _update_held(connection, lease, expires_at=expires_at)

    def release(self, lease: Lease) -> None:
        with self._transaction() as connection:
            release_run(connection, lease.job_name, lease.run_id)


class _Busy(Exception):
    """The lease is held by a live driver of this job: worth waiting for."""


def _held_by(lease: Lease) -> str:
    return (
        f"job {lease.job_name!r} at checkpoint {lease.checkpoint_location} is already run by "
        f"{lease.run_id} (lease renewed until {lease.expires_at.isoformat()}, database time); "
        "stop it first, or wait for its lease to expire if its driver has died"
    )


def _another_job(job_name: str, lease: Lease) -> str:
    state = "holds it" if lease.released_at is None else "ran there last"
    return (
        f"checkpoint {lease.checkpoint_location} belongs to job {lease.job_name!r} (its run "
        f"{lease.run_id} {state}), not to {job_name!r}: a checkpoint holds one job's offsets "
        "and state; use the job name it was started with, or a new checkpoint"
    )


class LeaseKeeper:
    """Renews a held lease every third of its time to live, and tells the run what it may do.

    ``confirmed_until`` is the monotonic time until which the lease is surely held (less a
    margin); past it, the run must start no batch. ``on_confirmed`` gets each new deadline,
    ``on_lost`` is called once if another run took the lease over.
    """

    def __init__(
        self,
        store: LeaseStore,
        acquired: Acquired,
        ttl_s: float,
        on_confirmed: Callable[[float], None],
        on_lost: Callable[[str], None],
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._store = store
        self.lease = acquired.lease
        self._ttl_s = ttl_s
        self._on_confirmed = on_confirmed
        self._on_lost = on_lost
        self._monotonic = monotonic
        self.confirmed_until = self._fence(acquired.confirmed_until)
        self._last_warning, self._warned_fenced = -math.inf, False
        self._thread = PeriodicThread("backlog-lease", self.renew_once, first_delay_s=ttl_s / 3)

    def _fence(self, held_until: float) -> float:
        return held_until - FENCE_MARGIN * self._ttl_s

    def start(self) -> None:
        self._on_confirmed(self.confirmed_until)
        self._thread.start()

    def confirmed(self) -> bool:
        return self._monotonic() < self.confirmed_until

    def renew_once(self) -> float:
        """One renewal; returns the wait before the next (sooner after a failure)."""
        started = self._monotonic()
        try:
            held = self._store.renew(self.lease, self._ttl_s)
        except sa.exc.SQLAlchemyError as error:
            self._warn_unrenewed(error)
            return min(self._ttl_s / 10, 1.0)
        if not held:
            message = (
                f"run {self.lease.run_id} lost the lease of {self.lease.checkpoint_location}: "
                "another run took it over after this one failed to renew it"
            )
            logger.error("%s", message)
            self._thread.stop(timeout_s=0)
            self._on_lost(message)
            return self._ttl_s
        was_confirmed = self.confirmed()
        self._last_warning, self._warned_fenced = -math.inf, False
        self.confirmed_until = self._fence(started + self._ttl_s)
        if not was_confirmed:
            logger.info("the lease of %s is confirmed again", self.lease.checkpoint_location)
        self._on_confirmed(self.confirmed_until)
        return self._ttl_s / 3

    def stop(self) -> None:
        """Stop renewing, keeping the lease as it is (another run holds it, or it will
        expire by itself)."""
        self._thread.stop()

    def _warn_unrenewed(self, error: sa.exc.SQLAlchemyError) -> None:
        """Warn at the first failed renewal, when the fence falls, and every
        ``WARN_EVERY_S`` meanwhile: renewals are retried several times a second."""
        now = self._monotonic()
        left = self.confirmed_until - now
        fence_fell = left <= 0 and not self._warned_fenced
        if now - self._last_warning < WARN_EVERY_S and not fence_fell:
            return
        self._last_warning = now
        self._warned_fenced = left <= 0
        logger.warning(
            "cannot renew the lease of %s (%s); %s",
            self.lease.checkpoint_location,
            " ".join(str(getattr(error, "orig", error)).split())[:300],
            f"batches stop in {left:.1f} s unless a renewal succeeds"
            if left > 0
            else "no batch starts until a renewal succeeds",
        )

    def release(self) -> None:
        """Stop renewing and let the lease go (the run ended cleanly)."""
        self.stop()
        self._store.release(self.lease)
