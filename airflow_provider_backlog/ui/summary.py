"""One line per job: where it stands, as the jobs page, a DAG's tab and a job's page head
show it.

Freshness is judged as ``BacklogFreshnessSensor`` judges it, by how long ago the latest
checkpoint was committed, and also by the largest gap between the recent live checkpoints
of one run: a live job should commit about once per interval, so a gap far above it shows
a job that keeps up only now and then. A lease past its expiry that was never released is
a driver that died: its job is not running, whatever its last checkpoint says. Expiry is
judged by the metrics database's clock, read with the lease: drivers renew their leases by
it, and the api-server's clock may differ from it by more than a lease's time to live.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

from airflow_provider_backlog.hooks.metrics_reads import JobSummary
from airflow_provider_backlog.hooks.metrics_values import Checkpoint, SourceReport
from spark_jobs.metrics.lease import Lease

RUNNING, ENDED, DIED = "running", "ended", "died"


@dataclass(frozen=True)
class JobRow:
    """Where one job stands at ``now`` (its lease: at the database's time it was read).

    :param job_name: The job's name.
    :param lease: The job's latest lease; None when no run took one.
    :param lease_state: ``running``, ``ended`` (released) or ``died`` (expired, never
        released); None without a lease.
    :param phase: ``backlog`` or ``live``, as its latest checkpoint says; None before any.
    :param since: Since when it is in that phase: its transition into it, or else its
        run's first checkpoint.
    :param reason: The rule that put it there (the transition's reason); None when its run
        started in it.
    :param run_id: The run of the latest checkpoint.
    :param last_checkpoint_at: When the latest checkpoint was committed.
    :param age_s: Seconds from that commit to ``now``.
    :param live_gap_s: The largest gap, in seconds, between consecutive live checkpoints of
        one run among the recent ones; None with fewer than two.
    :param interval_ms: The latest checkpoint's effective interval; None when periodic
        checkpoints were off (or before any checkpoint).
    :param sources: What each source of the latest checkpoint said: its rule and lag.
    """

    job_name: str
    lease: Lease | None
    lease_state: str | None
    phase: str | None = None
    since: datetime | None = None
    reason: str | None = None
    run_id: str | None = None
    last_checkpoint_at: datetime | None = None
    age_s: float | None = None
    live_gap_s: float | None = None
    interval_ms: int | None = None
    sources: tuple[SourceReport, ...] = ()

    @property
    def spark_ui_url(self) -> str | None:
        """The Spark UI of the running run; None when none runs, its UI is off, or its
        address is no http(s) URL (a page links to nothing else it read)."""
        url = self.lease.spark_ui_url if self.lease and self.lease_state == RUNNING else None
        return url if url and url.startswith(("http://", "https://")) else None


def _lease_state(lease: Lease | None, database_now: datetime) -> str | None:
    if lease is None:
        return None
    if lease.released_at is not None:
        return ENDED
    return RUNNING if lease.alive(database_now) else DIED


def _largest_live_gap_s(recent: tuple[Checkpoint, ...]) -> float | None:
    """The largest gap between consecutive live checkpoints of one run, in seconds."""
    gaps = [
        (later.committed_at - earlier.committed_at).total_seconds()
        for earlier, later in pairwise(recent)
        if earlier.run_id == later.run_id and not earlier.is_backlog and not later.is_backlog
    ]
    return max(gaps, default=None)


def job_row(summary: JobSummary, now: datetime) -> JobRow:
    """The line of ``summary``'s job at ``now``; its lease as of when it was read."""
    state = _lease_state(summary.lease, summary.database_now)
    if not summary.recent:
        return JobRow(summary.job_name, summary.lease, state)
    latest = summary.recent[-1]
    since = summary.phase_since
    return JobRow(
        job_name=summary.job_name,
        lease=summary.lease,
        lease_state=state,
        phase="backlog" if latest.is_backlog else "live",
        since=since.at if since else summary.run_started_at,
        reason=since.reason if since else None,
        run_id=latest.run_id,
        last_checkpoint_at=latest.committed_at,
        age_s=(now - latest.committed_at).total_seconds(),
        live_gap_s=_largest_live_gap_s(summary.recent),
        interval_ms=latest.effective_interval_ms,
        sources=latest.sources,
    )
