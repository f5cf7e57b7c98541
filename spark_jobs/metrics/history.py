"""What the metrics tables already say about a job, read by a run as it starts.

A new run continues from the job's last recorded checkpoint (its statuses and lag state)
and records the batches its predecessor committed but did not live to record; both need
the rows already there, read here so that the runtime holds no SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa

from spark_jobs.metrics.schema import as_utc, backlog_checkpoints


def last_sources(connection: sa.Connection, job_name: str) -> str | None:
    """The ``sources`` column of the job's last checkpoint recorded by its run (recovered
    rows carry no source statuses), or None for a job never recorded."""
    table = backlog_checkpoints
    return connection.execute(
        sa.select(table.c.sources)
        .where(table.c.job_name == job_name, table.c.recovered.is_not(True))
        .order_by(table.c.committed_at.desc())
        .limit(1)
    ).scalar_one_or_none()


def commit_times(
    connection: sa.Connection, job_name: str, batch_ids: Iterable[int]
) -> dict[int, list[datetime]]:
    """When each of ``batch_ids`` was recorded as committed (a batch id recurs when the job
    moved to a new checkpoint, hence the list)."""
    table = backlog_checkpoints
    ids = sorted(set(batch_ids))
    if not ids:
        return {}
    rows = connection.execute(
        sa.select(table.c.batch_id, table.c.committed_at).where(
            table.c.job_name == job_name, table.c.batch_id.in_(ids)
        )
    ).all()
    times: dict[int, list[datetime]] = {}
    for batch_id, committed_at in rows:
        at = as_utc(committed_at)
        assert at is not None
        times.setdefault(int(batch_id), []).append(at)
    return times
