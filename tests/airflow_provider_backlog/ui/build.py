"""The hook's values built by hand, for the pure parts of the pages to be tested without a
database. Times are seconds after ``T0``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow_provider_backlog.hooks.metrics_reads import JobHistory
from airflow_provider_backlog.hooks.metrics_values import (
    Checkpoint,
    ControlRequest,
    IntervalChange,
    SourceReport,
    Transition,
)
from spark_jobs.metrics.lease import Lease

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
#: A 1000 ms batch's parts: 700 ms of data work, 240 ms of fixed parts, 60 ms left over.
PARTS = {
    "latest_offset_ms": 100,
    "get_batch_ms": 50,
    "query_planning_ms": 30,
    "add_batch_ms": 700,
    "wal_commit_ms": 20,
    "commit_offsets_ms": 40,
}
NO_PARTS = dict.fromkeys(PARTS)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def checkpoint(
    run_id: str,
    batch_id: int,
    seconds: float,
    backlog: bool = False,
    rows: int = 10,
    *,
    interval_ms: int | None = 10_000,
    duration_ms: int = 1000,
    rule: str = "hybrid-phase",
    parts: dict[str, int | None] = PARTS,
    state: tuple[int | None, int | None] = (None, None),
    recovered: bool = False,
) -> Checkpoint:
    """A checkpoint of one source ``events``, in ``backlog`` by ``rule``; ``state`` gives
    its rows and bytes on disk."""
    return Checkpoint(
        run_id=run_id,
        batch_id=batch_id,
        committed_at=at(seconds),
        is_backlog=backlog,
        effective_interval_ms=interval_ms,
        num_input_rows=rows,
        batch_duration_ms=duration_ms,
        recovered=recovered,
        sources=(SourceReport("events", backlog, rule, (("offsets_behind_latest", 5.0),)),),
        sink_output_rows=None,
        state_rows_total=state[0],
        state_rows_updated=None,
        state_memory_bytes=None,
        state_disk_bytes=state[1],
        state_commit_ms=None,
        **parts,  # type: ignore[arg-type]
    )


def transition(run_id: str, seconds: float, backlog: bool, reason: str = "r") -> Transition:
    return Transition(run_id, at(seconds), backlog, reason, None)


def lease(
    run_id: str,
    acquired: float,
    expires: float,
    released: float | None = None,
    ui: str | None = None,
) -> Lease:
    return Lease(
        job_name="orders",
        checkpoint_location="file:///checkpoints/orders",
        run_id=run_id,
        acquired_at=at(acquired),
        expires_at=at(expires),
        spark_ui_url=ui,
        released_at=None if released is None else at(released),
    )


def request(seconds: float, status: str = "applied", answer: str | None = "ok") -> ControlRequest:
    return ControlRequest(at(seconds), "reconfigure", '{"a": "1"}', status, answer, "r1")


def history(
    *checkpoints: Checkpoint,
    since: float = 0,
    until: float = 100,
    transitions: tuple[Transition, ...] = (),
    requests: tuple[ControlRequest, ...] = (),
    interval_changes: tuple[IntervalChange, ...] = (),
    lease: Lease | None = None,
    run_before: str | None = None,
    run_after: str | None = None,
    database_now: float = 100,
) -> JobHistory:
    """A history of job ``orders``; ``database_now`` is when its lease was read, by the
    metrics database's clock."""
    return JobHistory(
        job_name="orders",
        since=at(since),
        until=at(until),
        checkpoints=checkpoints,
        checkpoints_cut=False,
        run_before=run_before,
        run_after=run_after,
        transitions=transitions,
        transitions_cut=False,
        requests=requests,
        requests_cut=False,
        lease=lease,
        database_now=at(database_now),
        interval_changes=interval_changes,
    )
