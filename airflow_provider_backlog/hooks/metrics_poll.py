"""One read of everything the sensors waiting on a job decide by, and the stop rule applied to
it per sensor.

A deferred sensor asks two things each poll: where the job stands (its latest checkpoints)
and whether waiting is pointless (its driver died, or its run ended after the wait began).
The second depends on when each sensor's wait began, the read does not: the job's latest
lease and the database's clock answer it for every sensor at once. So one read serves all
the sensors of a job, and ``stop_reason`` judges it for each, without I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from airflow_provider_backlog.hooks.metrics import BacklogMetricsHook, JobSnapshot
from spark_jobs.metrics import lease
from spark_jobs.metrics.lease import Lease


@dataclass(frozen=True)
class JobPoll:
    """What one read found.

    :param snapshot: The job's latest checkpoints (as many as were asked for), or None
        before its first.
    :param latest_lease: The job's most recently taken lease, or None before any.
    :param database_now: The database's time, read only when it matters: while the latest
        lease is held (unreleased), to tell whether it has expired; None otherwise.
    """

    snapshot: JobSnapshot | None
    latest_lease: Lease | None
    database_now: datetime | None


def read_job(hook: BacklogMetricsHook, job_name: str, checkpoints: int) -> JobPoll:
    """The job's latest lease and, while that is held, the database's time, then its last
    ``checkpoints`` checkpoints. Blocking: call it from a thread in the triggerer.

    The lease is read first: a run delivers its last rows before it releases its lease, so
    checkpoints read after a released lease hold every row of that run. Read the other way
    round, a run that went live and ended between the two reads would look like one that
    ended before going live."""
    with hook.engine.connect() as connection:
        latest = lease.latest_lease(connection, job_name)
        held = latest is not None and latest.released_at is None
        now = lease.database_now(connection) if held else None
    return JobPoll(hook.job_snapshot(job_name, checkpoints), latest, now)


def stop_reason(job_name: str, poll: JobPoll, since: datetime) -> str | None:
    """Why waiting for the job is pointless, or None: its driver died (its lease expired
    without being released), or its run ended at or after ``since``, when this wait began."""
    latest = poll.latest_lease
    if latest is None:
        return None
    if latest.released_at is None:
        if poll.database_now is not None and latest.expires_at <= poll.database_now:
            return (
                f"the driver of job {job_name!r} (run {latest.run_id}) stopped renewing its "
                f"lease, which expired at {latest.expires_at.isoformat()}: it has died"
            )
        return None
    if latest.released_at >= since:
        return (
            f"the run {latest.run_id} of job {job_name!r} ended at "
            f"{latest.released_at.isoformat()} while it was awaited"
        )
    return None
