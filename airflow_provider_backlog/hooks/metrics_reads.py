"""What a job did over a period, read from its metrics tables: the reads behind the Backlog
view in Airflow's UI and ``BacklogMetricsHook.checkpoint_costs``.

Every read is bounded twice: by time, along the tables' (job_name, time) indexes, and by a
number of rows, keeping the newest, so that a page over a busy job's week costs what a page
over its hour does. Whoever shows the rows says when a cap cut them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import sqlalchemy as sa

from airflow_provider_backlog.hooks.metrics_rows import (
    CHECKPOINT_COLUMNS,
    checkpoint,
    control_request,
    interval_change,
    transition,
)
from airflow_provider_backlog.hooks.metrics_values import (
    Checkpoint,
    ControlRequest,
    IntervalChange,
    Transition,
)
from spark_jobs.metrics.lease import Lease, database_now, latest_lease
from spark_jobs.metrics.schema import (
    as_utc,
    backlog_checkpoints,
    backlog_control,
    backlog_interval_changes,
    backlog_leases,
    backlog_transitions,
)

#: The most checkpoints, transitions and requests read for one period; the newest are kept.
MAX_CHECKPOINTS = 2000
MAX_TRANSITIONS = 500
MAX_REQUESTS = 200
MAX_INTERVAL_CHANGES = 500
#: The latest checkpoints a job's freshness is judged by.
RECENT_CHECKPOINTS = 20

_checkpoints, _transitions = backlog_checkpoints, backlog_transitions
T = TypeVar("T")


@dataclass(frozen=True)
class JobSummary:
    """Where a job stands, from its latest rows.

    :param job_name: The job's name.
    :param recent: Its latest checkpoints (at most ``RECENT_CHECKPOINTS``), oldest first.
    :param phase_since: The transition of the latest checkpoint's run into that
        checkpoint's phase; None when the run started in it.
    :param run_started_at: When that run committed its first checkpoint.
    :param latest_transition: The job's latest transition, of any run.
    :param lease: The job's most recently taken lease; None when no run ever took one.
    :param database_now: The metrics database's time, read with the lease: what the lease's
        expiry is judged by, since drivers renew it by that clock and not the reader's.
    """

    job_name: str
    recent: tuple[Checkpoint, ...]
    phase_since: Transition | None
    run_started_at: datetime | None
    latest_transition: Transition | None
    lease: Lease | None
    database_now: datetime


@dataclass(frozen=True)
class JobHistory:
    """What a job did from ``since`` to ``until``.

    :param job_name: The job's name.
    :param since: The period's start (aware, UTC).
    :param until: The period's end (aware, UTC).
    :param checkpoints: The checkpoints committed in it, oldest first: the newest
        ``MAX_CHECKPOINTS``.
    :param checkpoints_cut: True when older checkpoints of the period were left out.
    :param run_before: The run of the checkpoint just before the first one read.
    :param run_after: The run of the checkpoint just after the last one read.
    :param transitions: The transitions in it, oldest first: the newest ``MAX_TRANSITIONS``.
    :param transitions_cut: True when older transitions of the period were left out.
    :param requests: The requests made in it, oldest first: the newest ``MAX_REQUESTS``.
    :param requests_cut: True when older requests of the period were left out.
    :param lease: The job's most recently taken lease; None when no run ever took one.
    :param database_now: The metrics database's time, read with the lease: what the lease's
        expiry is judged by.
    :param interval_changes: The live intervals chosen in it for a freshness target,
        oldest first: the newest ``MAX_INTERVAL_CHANGES``.
    """

    job_name: str
    since: datetime
    until: datetime
    checkpoints: tuple[Checkpoint, ...]
    checkpoints_cut: bool
    run_before: str | None
    run_after: str | None
    transitions: tuple[Transition, ...]
    transitions_cut: bool
    requests: tuple[ControlRequest, ...]
    requests_cut: bool
    lease: Lease | None
    database_now: datetime
    interval_changes: tuple[IntervalChange, ...] = ()


def aware_utc(value: datetime, name: str) -> datetime:
    """``value`` in UTC; a naive datetime is refused, since which zone it meant is unknown
    (and SQLite would compare it as if it were UTC)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} = {value.isoformat()} must be timezone-aware, e.g. in UTC")
    return value.astimezone(UTC)


def job_names(connection: sa.Connection) -> list[str]:
    """Every job with a checkpoint or a lease, by name."""
    names = sa.union(
        sa.select(_checkpoints.c.job_name).distinct(),
        sa.select(backlog_leases.c.job_name),
    )
    return sorted(connection.execute(names).scalars())


def _newest(
    connection: sa.Connection,
    query: sa.Select,
    order: tuple[sa.ColumnElement, ...],
    limit: int,
    convert: Callable[[sa.RowMapping], T],
) -> tuple[tuple[T, ...], bool]:
    """The newest ``limit`` rows of ``query`` by ``order``, oldest first, and whether there
    were more."""
    rows = connection.execute(
        query.order_by(*(column.desc() for column in order)).limit(limit + 1)
    ).mappings()
    read = [convert(row) for row in rows]
    return tuple(reversed(read[:limit])), len(read) > limit


_CHECKPOINT_ORDER = (_checkpoints.c.committed_at, _checkpoints.c.id)
_select_checkpoints = sa.select(*(_checkpoints.c[name] for name in CHECKPOINT_COLUMNS))


def _latest_transition(connection: sa.Connection, *where: sa.ColumnElement) -> Transition | None:
    query = sa.select(_transitions).where(*where)
    latest, _ = _newest(connection, query, (_transitions.c.at,), 1, transition)
    return latest[0] if latest else None


def job_summary(connection: sa.Connection, job_name: str) -> JobSummary | None:
    """Where ``job_name`` stands; None when it has neither a checkpoint nor a lease."""
    table = _checkpoints
    query = _select_checkpoints.where(table.c.job_name == job_name)
    recent, _ = _newest(connection, query, _CHECKPOINT_ORDER, RECENT_CHECKPOINTS, checkpoint)
    lease, lease_read_at = latest_lease(connection, job_name), database_now(connection)
    if not recent and lease is None:
        return None
    phase_since = started = None
    if recent:
        latest = recent[-1]
        phase_since = _latest_transition(
            connection,
            _transitions.c.job_name == job_name,
            _transitions.c.run_id == latest.run_id,
            _transitions.c.is_backlog == latest.is_backlog,
        )
        first = sa.select(sa.func.min(table.c.committed_at)).where(
            table.c.job_name == job_name, table.c.run_id == latest.run_id
        )
        started = as_utc(connection.execute(first).scalar_one())
    return JobSummary(
        job_name=job_name,
        recent=recent,
        phase_since=phase_since,
        run_started_at=started,
        latest_transition=_latest_transition(connection, _transitions.c.job_name == job_name),
        lease=lease,
        database_now=lease_read_at,
    )


def checkpoints(
    connection: sa.Connection, job_name: str, since: datetime, until: datetime | None
) -> tuple[tuple[Checkpoint, ...], bool]:
    """The checkpoints of ``job_name`` committed from ``since`` to ``until`` (no end when
    None), oldest first: the newest ``MAX_CHECKPOINTS``, and whether older ones were left
    out."""
    table = _checkpoints
    since = aware_utc(since, "since")
    query = _select_checkpoints.where(table.c.job_name == job_name, table.c.committed_at >= since)
    if until is not None:
        query = query.where(table.c.committed_at <= aware_utc(until, "until"))
    return _newest(connection, query, _CHECKPOINT_ORDER, MAX_CHECKPOINTS, checkpoint)


def _neighbour_run(
    connection: sa.Connection, job_name: str, at: datetime, *, later: bool
) -> str | None:
    """The run of the job's checkpoint nearest to ``at``: the first one committed after it
    when ``later``, else the last one committed before it."""
    table = _checkpoints
    query = sa.select(table.c.run_id).where(table.c.job_name == job_name)
    if later:
        query = query.where(table.c.committed_at > at).order_by(*_CHECKPOINT_ORDER)
    else:
        query = query.where(table.c.committed_at < at)
        query = query.order_by(*(column.desc() for column in _CHECKPOINT_ORDER))
    return connection.execute(query.limit(1)).scalar_one_or_none()


def run_period(
    connection: sa.Connection, job_name: str, run_id: str
) -> tuple[datetime, datetime] | None:
    """From the run's launch (its lease taken, or else its first checkpoint) to its end (its
    lease released or expiring, or else its last checkpoint); None for a run the tables do
    not know."""
    table = _checkpoints
    first, last = connection.execute(
        sa.select(sa.func.min(table.c.committed_at), sa.func.max(table.c.committed_at)).where(
            table.c.job_name == job_name, table.c.run_id == run_id
        )
    ).one()
    times = [at for at in (as_utc(first), as_utc(last)) if at is not None]
    lease = latest_lease(connection, job_name, run_id)
    if lease is not None:
        times += [lease.acquired_at, lease.released_at or lease.expires_at]
    return (min(times), max(times)) if times else None


def job_history(
    connection: sa.Connection, job_name: str, since: datetime, until: datetime
) -> JobHistory:
    """What ``job_name`` did from ``since`` to ``until``."""
    since, until = aware_utc(since, "since"), aware_utc(until, "until")
    read, cut = checkpoints(connection, job_name, since, until)
    t, c = _transitions, backlog_control
    transitions, transitions_cut = _newest(
        connection,
        sa.select(t).where(t.c.job_name == job_name, t.c.at >= since, t.c.at <= until),
        (t.c.at,),
        MAX_TRANSITIONS,
        transition,
    )
    requests, requests_cut = _newest(
        connection,
        sa.select(c).where(
            c.c.job_name == job_name, c.c.requested_at >= since, c.c.requested_at <= until
        ),
        (c.c.id,),
        MAX_REQUESTS,
        control_request,
    )
    i = backlog_interval_changes
    changes, _ = _newest(
        connection,
        sa.select(i).where(i.c.job_name == job_name, i.c.at >= since, i.c.at <= until),
        (i.c.at,),
        MAX_INTERVAL_CHANGES,
        interval_change,
    )
    return JobHistory(
        job_name=job_name,
        since=since,
        until=until,
        checkpoints=read,
        checkpoints_cut=cut,
        run_before=_neighbour_run(
            connection, job_name, read[0].committed_at if read else since, later=False
        ),
        run_after=_neighbour_run(
            connection, job_name, read[-1].committed_at if read else until, later=True
        ),
        transitions=transitions,
        transitions_cut=transitions_cut,
        requests=requests,
        requests_cut=requests_cut,
        lease=latest_lease(connection, job_name),
        database_now=database_now(connection),
        interval_changes=changes,
    )
