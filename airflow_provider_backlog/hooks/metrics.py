"""The metrics database the jobs write to, as an Airflow connection.

A ``DbApiHook``, so ``SqlSensor``, ``SQLExecuteQueryOperator`` and ad-hoc queries work with
it too. The tables and how to reach the database (SQLite tuned for a writer and readers,
PostgreSQL with whichever driver is installed) come from the one schema module the jobs
write with, which imports no pyspark.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from airflow.providers.common.sql.hooks.sql import DbApiHook
from airflow.sdk.exceptions import AirflowException
from sqlalchemy.engine import URL, Engine, make_url

from airflow_provider_backlog import METRICS_CONN_TYPE
from airflow_provider_backlog.hooks import metrics_reads
from airflow_provider_backlog.hooks.metrics_reads import JobHistory, JobSummary
from airflow_provider_backlog.hooks.metrics_values import Checkpoint
from spark_jobs.metrics import control, lease
from spark_jobs.metrics.schema import (
    APPLIED,
    CLAIMED,
    PENDING,
    STOP,
    as_utc,
    backlog_checkpoints,
    backlog_leases,
    create_tables,
    make_engine,
)

T = TypeVar("T")
Phase = Literal["live", "backlog"]
PHASES: tuple[Phase, ...] = ("live", "backlog")
#: How long a run that took a request may take to answer it.
CLAIMED_ANSWER_S = 30.0
#: A sensor may ask a job to stay in a phase for at most this many checkpoints.
MAX_STREAK = 1000


@dataclass(frozen=True)
class JobSnapshot:
    """A job's latest checkpoints, as its metrics rows tell them.

    ``streak`` counts the latest checkpoints of ``run_id`` in the phase of the last one
    (at most ``MAX_STREAK``).

    :param job_name: The job's name, as its metrics rows give it.
    :param run_id: The run that committed the latest checkpoint.
    :param last_committed_at: When that checkpoint was committed: an aware UTC datetime.
    :param phase: The phase of that checkpoint: ``"live"`` or ``"backlog"``.
    :param streak: That count of checkpoints: 1 to ``MAX_STREAK`` (1000).
    """

    job_name: str
    run_id: str
    last_committed_at: datetime
    phase: Phase
    streak: int

    def in_phase(self, phase: Phase, checkpoints: int = 1) -> bool:
        """In ``phase`` for at least the last ``checkpoints`` committed batches."""
        return self.phase == phase and self.streak >= checkpoints

    def committed_within(self, seconds: float, now: datetime) -> bool:
        """A checkpoint committed no longer than ``seconds`` before ``now``."""
        return (now - self.last_committed_at).total_seconds() <= seconds

    def as_dict(self) -> dict[str, Any]:
        """For XCom and trigger events: JSON types only."""
        return {
            "job_name": self.job_name,
            "run_id": self.run_id,
            "last_committed_at": self.last_committed_at.isoformat(),
            "phase": self.phase,
            "streak": self.streak,
        }


@dataclass(frozen=True)
class Expectation:
    """What a sensor waits for: a phase held for some checkpoints, or a recent checkpoint,
    or both. Checked the same way by a poking sensor and by its trigger.

    :param phase: ``"live"`` or ``"backlog"``: the phase the job's latest checkpoints must be
        in; None (the default) for any phase, and then ``within_s`` must be set.
    :param checkpoints: How many of the latest checkpoints, all of one run, must be in
        ``phase``: 1 (the default) to ``MAX_STREAK`` (1000). Only counts with ``phase``.
    :param within_s: In seconds, above 0: the latest checkpoint must have been committed no
        longer ago than this; None (the default) for no such condition.
    """

    phase: Phase | None = None
    checkpoints: int = 1
    within_s: float | None = None

    def __post_init__(self) -> None:
        if self.phase is None and self.within_s is None:
            raise ValueError("expect a phase ('live' or 'backlog'), a freshness, or both")
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} must be one of {list(PHASES)}")
        if not 1 <= self.checkpoints <= MAX_STREAK:
            raise ValueError(f"checkpoints = {self.checkpoints!r} must be 1 to {MAX_STREAK}")
        if self.within_s is not None and self.within_s <= 0:
            raise ValueError(f"freshness = {self.within_s!r} s must be above 0")

    def met_by(self, snapshot: JobSnapshot | None, now: datetime) -> bool:
        if snapshot is None:
            return False
        if self.phase is not None and not snapshot.in_phase(self.phase, self.checkpoints):
            return False
        return self.within_s is None or snapshot.committed_within(self.within_s, now)

    def describe(self) -> str:
        parts = []
        if self.phase is not None:
            parts.append(f"{self.phase} for {self.checkpoints} checkpoint(s)")
        if self.within_s is not None:
            parts.append(f"a checkpoint within {self.within_s:g} s")
        return " and ".join(parts)


@dataclass(frozen=True)
class LiveRun:
    """The run that holds a job's lease: its driver renews it and has not let go.

    :param job_name: The job's name.
    :param run_id: The run's id.
    :param checkpoint_location: The checkpoint the lease is held on.
    :param expires_at: When the lease expires unless the driver renews it, by the metrics
        database's clock (an aware UTC datetime).
    :param spark_ui_url: The driver's Spark UI; None when the UI is disabled.
    """

    job_name: str
    run_id: str
    checkpoint_location: str
    expires_at: datetime
    spark_ui_url: str | None

    def describe(self) -> str:
        ui = f", Spark UI {self.spark_ui_url}" if self.spark_ui_url else ""
        return (
            f"run {self.run_id} of job {self.job_name!r} at {self.checkpoint_location} "
            f"(lease renewed until {self.expires_at.isoformat()}{ui})"
        )


@dataclass(frozen=True)
class RunStart:
    """A run that has taken its lease and committed its first checkpoint.

    :param run_id: The run's id.
    :param first_committed_at: When it committed its first checkpoint (an aware UTC datetime).
    :param spark_ui_url: The driver's Spark UI; None when the UI is disabled.
    """

    run_id: str
    first_committed_at: datetime
    spark_ui_url: str | None


class MetricsConnectionError(ValueError):
    """A metrics connection that names no database; the message says what to set."""


class JobRequestError(AirflowException):
    """The job rejected a request, or no run of it answered in time."""


#: PEP 249's names for errors of the database or the connection to it, not of the query.
_TRANSIENT_ERRORS = frozenset({"OperationalError", "InterfaceError"})


def is_transient(error: BaseException) -> bool:
    """The database could not answer now (unreachable, restarting, locked, timed out, its
    file system away), by the names every driver and SQLAlchemy give such errors: worth
    asking again."""
    if isinstance(error, OSError):
        return True
    if isinstance(error, sa.exc.DBAPIError) and error.connection_invalidated:
        return True
    return any(kind.__name__ in _TRANSIENT_ERRORS for kind in type(error).__mro__)


class BacklogMetricsHook(DbApiHook):
    """The ``backlog_metrics`` connection: an SQLAlchemy URL (field ``url``), or a SQLite file
    (field ``host``). A URL without a password takes the connection's password.

    :param backlog_metrics_conn_id: The id of the ``backlog_metrics`` connection, also taken
        as the only positional argument; default ``backlog_metrics_default``.
    """

    conn_name_attr = "backlog_metrics_conn_id"
    default_conn_name = "backlog_metrics_default"
    conn_type = METRICS_CONN_TYPE
    hook_name = "Backlog metrics database"

    @cached_property
    def sqlalchemy_url(self) -> URL:
        connection = self.get_connection(self.get_conn_id())
        extra = connection.extra_dejson
        # The connection form stores the field as "url"; older forms prefixed it.
        text = (extra.get("url") or extra.get(f"extra__{METRICS_CONN_TYPE}__url") or "").strip()
        if text:
            url = make_url(text)
            if url.username and url.password is None and connection.password:
                url = url.set(password=connection.password)
            return url
        if connection.host:
            return make_url(f"sqlite:///{Path(connection.host).expanduser().absolute()}")
        raise MetricsConnectionError(
            f"connection {self.get_conn_id()!r} names no metrics database: set its SQLAlchemy "
            "URL (e.g. postgresql://user@host:5432/metrics) or, for SQLite, its file as host"
        )

    @cached_property
    def engine(self) -> Engine:
        """The engine, with the tables created where missing (as the job does), so a sensor
        that starts before the job has written anything reads "no checkpoint yet"."""
        engine = make_engine(self.sqlalchemy_url.render_as_string(hide_password=False))
        with engine.begin() as connection:
            create_tables(connection)
        return engine

    def get_uri(self) -> str:
        return self.sqlalchemy_url.render_as_string(hide_password=False)

    def get_sqlalchemy_engine(self, engine_kwargs: dict[str, Any] | None = None) -> Engine:
        del engine_kwargs  # the engine is tuned for this database; see make_engine
        return self.engine

    def get_conn(self) -> Any:
        """A DB-API connection from the engine (sqlite3 or the PostgreSQL driver's)."""
        return self.engine.raw_connection()

    @property
    def placeholder(self) -> str:
        return "?" if self.sqlalchemy_url.get_backend_name() == "sqlite" else "%s"

    def job_snapshot(self, job_name: str, checkpoints: int = 1) -> JobSnapshot | None:
        """The job's latest run as its last ``checkpoints`` rows tell it; None before any."""
        table = backlog_checkpoints
        query = (
            sa.select(table.c.run_id, table.c.committed_at, table.c.is_backlog)
            .where(table.c.job_name == job_name)
            .order_by(table.c.committed_at.desc(), table.c.id.desc())
            .limit(min(max(checkpoints, 1), MAX_STREAK))
        )
        with self.engine.connect() as connection:
            rows = connection.execute(query).all()
        if not rows:
            return None
        run_id, committed_at, is_backlog = rows[0]
        streak = 0
        for row in rows:
            if row.run_id != run_id or bool(row.is_backlog) != bool(is_backlog):
                break
            streak += 1
        committed = as_utc(committed_at)
        assert committed is not None
        return JobSnapshot(
            job_name=job_name,
            run_id=run_id,
            last_committed_at=committed,
            phase="backlog" if is_backlog else "live",
            streak=streak,
        )

    def ask(
        self,
        job_name: str,
        action: str,
        settings: dict[str, str] | None = None,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        run_id: str | None = None,
    ) -> str:
        """Ask the running job to ``reconfigure`` (with ``settings``) or ``stop`` and return
        its answer; with ``run_id``, only that run may act on it (another rejects it).
        Raises JobRequestError when it rejects the request, or when no run answers within
        ``timeout_s``; the request is then withdrawn, so that a run started later does not
        act on it."""
        with self.engine.begin() as connection:
            request_id = control.send(connection, job_name, action, settings, run_id)
        self.log.info(
            "asked job %s to %s %s (request %s)", job_name, action, settings or "", request_id
        )
        status, answer = self._await_answer(request_id, timeout_s, poll_s)
        if status == PENDING and self._withdraw(request_id):
            raise JobRequestError(
                f"job {job_name!r} did not answer {action} request {request_id} within "
                f"{timeout_s:g} s: is it running?"
            )
        if status in (PENDING, CLAIMED):  # a run took it: it acts on it and answers next
            status, answer = self._await_answer(request_id, CLAIMED_ANSWER_S, poll_s)
        if status == CLAIMED:
            raise JobRequestError(
                f"job {job_name!r} took {action} request {request_id} but did not answer "
                f"within {CLAIMED_ANSWER_S:g} s more"
            )
        if status != APPLIED:
            raise JobRequestError(f"job {job_name!r} rejected {settings or action}: {answer}")
        return answer or ""

    def stop(
        self, job_name: str, *, answer_timeout_s: float, stop_timeout_s: float, poll_s: float = 1.0
    ) -> str:
        """Stop the running job after its next committed checkpoint and wait until its
        driver has let go of its lease; returns the job's answer."""
        answer = self.ask(job_name, STOP, timeout_s=answer_timeout_s, poll_s=poll_s)
        if not self.run_released(job_name, None, stop_timeout_s, poll_s):
            raise JobRequestError(
                f"job {job_name!r} agreed to stop but its driver still runs after "
                f"{stop_timeout_s:g} s"
            )
        return answer

    def _await_answer(
        self, request_id: int, wait_s: float, poll_s: float
    ) -> tuple[str, str | None]:
        """The request's status and the job's answer, waiting up to ``wait_s`` for one."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.engine.connect() as connection:
                status, answer = control.status_of(connection, request_id)
            if status not in (PENDING, CLAIMED) or time.monotonic() >= deadline:
                return status, answer
            time.sleep(poll_s)

    def _withdraw(self, request_id: int) -> bool:
        """Take back a request no run has taken; False if one took it meanwhile."""
        with self.engine.begin() as connection:
            return control.withdraw(connection, request_id)

    def live_run(self, job_name: str) -> LiveRun | None:
        """The run whose driver holds a lease of this job and renews it, if any (judged by
        the database's clock, which every driver's lease is kept by)."""
        with self.engine.connect() as connection:
            held = lease.live_lease(connection, job_name)
        if held is None:
            return None
        return LiveRun(
            job_name, held.run_id, held.checkpoint_location, held.expires_at, held.spark_ui_url
        )

    def standing_by(self, job_name: str, run_id: str) -> bool:
        """Whether ``run_id`` has warmed up and stands by to take over the job's live lease
        (a make-before-break relaunch): it is named on the live run's lease row."""
        with self.engine.connect() as connection:
            return lease.standing_by(connection, job_name, run_id) is not None

    def release(self, job_name: str, run_id: str) -> bool:
        """Release the lease of a run whose driver is known to have ended (a launch task
        ended it), so that the next run need not wait for it to expire."""
        with self.engine.begin() as connection:
            return lease.release_run(connection, job_name, run_id)

    def database_now(self) -> datetime:
        """The metrics database's clock, which lease times are kept by."""
        with self.engine.connect() as connection:
            return lease.database_now(connection)

    def run_start(self, job_name: str, run_id: str) -> RunStart | None:
        """The run's first committed checkpoint and its Spark UI; None until both exist."""
        checkpoints, leases = backlog_checkpoints, backlog_leases
        with self.engine.connect() as connection:
            first = connection.execute(
                sa.select(sa.func.min(checkpoints.c.committed_at)).where(
                    checkpoints.c.job_name == job_name, checkpoints.c.run_id == run_id
                )
            ).scalar_one_or_none()
            ui = connection.execute(
                sa.select(leases.c.spark_ui_url).where(
                    leases.c.job_name == job_name, leases.c.run_id == run_id
                )
            ).first()
        if first is None or ui is None:
            return None
        committed = as_utc(first)
        assert committed is not None
        return RunStart(run_id, committed, ui.spark_ui_url)

    def run_released(self, job_name: str, run_id: str | None, wait_s: float, poll_s: float) -> bool:
        """Whether the job's run (the latest, when ``run_id`` is None) has let go of its
        lease, that is ended cleanly, waiting up to ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.engine.connect() as connection:
                latest = lease.latest_lease(connection, job_name, run_id)
            released = latest is not None and latest.released_at is not None
            if released or time.monotonic() >= deadline:
                return released
            time.sleep(poll_s)

    def _read(self, read: Callable[..., T], *args: Any) -> T:
        with self.engine.connect() as connection:
            return read(connection, *args)

    def job_names(self) -> list[str]:
        """Every job the database has a checkpoint or a lease of, by name."""
        return self._read(metrics_reads.job_names)

    def job_summary(self, job_name: str) -> JobSummary | None:
        """Where ``job_name`` stands (its latest checkpoints, the transition into its phase,
        its lease and the database's time it was read at); None when it has neither a
        checkpoint nor a lease."""
        return self._read(metrics_reads.job_summary, job_name)

    def job_history(self, job_name: str, since: datetime, until: datetime) -> JobHistory:
        """What ``job_name`` did from ``since`` to ``until`` (aware datetimes): its
        checkpoints, transitions and requests (each capped, the newest kept) and its lease."""
        return self._read(metrics_reads.job_history, job_name, since, until)

    def run_period(self, job_name: str, run_id: str) -> tuple[datetime, datetime] | None:
        """When the run was launched and when it ended (or its lease, while it runs, will
        expire); None for a run the database does not know."""
        return self._read(metrics_reads.run_period, job_name, run_id)

    def checkpoint_costs(
        self, job_name: str, since: datetime, until: datetime | None = None
    ) -> list[Checkpoint]:
        """Where the time of each of the job's checkpoints went, and the state it carried.

        Each ``Checkpoint`` has Spark's duration parts (``latest_offset_ms``,
        ``get_batch_ms``, ``query_planning_ms``, ``wal_commit_ms``, ``commit_offsets_ms``),
        the data work ``add_batch_ms``, the remainder ``other_ms`` (Spark's bookkeeping),
        ``fixed_ms`` (every part but the data work), and the state's rows, bytes and commit
        time. A checkpoint recorded by an older release has them as None: unknown.

        :param job_name: The job's name.
        :param since: The earliest commit time to read: an aware datetime.
        :param until: The latest commit time to read: an aware datetime; None (the default)
            for no end.
        :return: The checkpoints committed from ``since`` to ``until``, oldest first: at
            most ``MAX_CHECKPOINTS`` (2000) of them, the newest.
        """
        checkpoints, _ = self._read(metrics_reads.checkpoints, job_name, since, until)
        return list(checkpoints)
