"""A job's phases in time and its runs over a period, from what the hook read of it.

A checkpoint tells the phase its batch ran in, and the batch ran from the previous commit of
its run to its own: consecutive checkpoints of one phase make one span of it. A run was
launched when it took its lease, or else at its first checkpoint, unless the checkpoint
just before the period is of the same run (it started earlier). It ended when it released
its lease; a lease past its expiry (by the database's clock, read with the lease) that was
never released is a driver that died. A run that another followed ends, as far as the
tables tell, at its last checkpoint: the next run took over its lease row, which no longer
says whether it ended cleanly or died.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from airflow_provider_backlog.hooks.metrics_reads import JobHistory
from airflow_provider_backlog.hooks.metrics_values import Checkpoint

LAUNCH, END, DEATH, TAKEOVER = "launch", "end", "death", "takeover"


@dataclass(frozen=True)
class Span:
    """A stretch of time in one phase, within one run and the period.

    :param run_id: The run.
    :param start: Where it starts (aware, UTC).
    :param end: Where it ends (aware, UTC).
    :param is_backlog: True for backlog.
    :param held_by_lag: In backlog because a lag rule held a source there.
    """

    run_id: str
    start: datetime
    end: datetime
    is_backlog: bool
    held_by_lag: bool

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Boundary:
    """A run's launch or end, as drawn on the timeline.

    :param run_id: The run.
    :param at: When (aware, UTC).
    :param kind: ``launch``, ``end`` (released its lease), ``death`` (its lease expired,
        never released) or ``takeover`` (its last checkpoint, another run followed).
    :param text: What happened, in words.
    """

    run_id: str
    at: datetime
    kind: str
    text: str


@dataclass(frozen=True)
class RunRow:
    """One run within the period.

    :param run_id: The run.
    :param launch: Its launch; None when it started before the period.
    :param end: How it ended, perhaps after the period; None while it runs, or when the
        tables do not tell.
    :param checkpoints: Its checkpoints in the period.
    :param backlog_checkpoints: How many of them were in backlog.
    :param backlog_time_share: The share of its time in the period spent in backlog; None
        when it committed no checkpoint there.
    :param rows: The rows its checkpoints read.
    :param intervals: Per phase (``backlog``, ``live``), the distinct effective intervals
        in ms of its checkpoints, None for periodic checkpoints off.
    """

    run_id: str
    launch: Boundary | None
    end: Boundary | None
    checkpoints: int
    backlog_checkpoints: int
    backlog_time_share: float | None
    rows: int
    intervals: tuple[tuple[str, tuple[int | None, ...]], ...]


def spans(history: JobHistory) -> list[Span]:
    """The phases of ``history``'s period, merged where consecutive checkpoints agree."""
    merged: list[Span] = []
    previous: Checkpoint | None = None
    for checkpoint in history.checkpoints:
        if previous is not None and previous.run_id == checkpoint.run_id:
            start = previous.committed_at
        elif previous is None and history.run_before == checkpoint.run_id:
            start = history.since
        else:
            start = checkpoint.committed_at - timedelta(milliseconds=checkpoint.batch_duration_ms)
        span = Span(
            checkpoint.run_id,
            max(start, history.since),
            checkpoint.committed_at,
            checkpoint.is_backlog,
            checkpoint.held_by_lag,
        )
        last = merged[-1] if merged else None
        if last is not None and _kind(last) == _kind(span):
            merged[-1] = replace(last, end=span.end)
        else:
            merged.append(span)
        previous = checkpoint
    return merged


def _kind(span: Span) -> tuple[str, bool, bool]:
    return span.run_id, span.is_backlog, span.held_by_lag


def _run_order(history: JobHistory) -> list[str]:
    """The runs of the period in the order they ran: those that committed in it, and the
    lease's run while it held its lease in it."""
    order = list(dict.fromkeys(c.run_id for c in history.checkpoints))
    lease = history.lease
    if lease is not None and lease.run_id not in order:
        held_until = lease.released_at or lease.expires_at
        if lease.acquired_at <= history.until and held_until >= history.since:
            order.append(lease.run_id)
    return order


def _intervals(mine: list[Checkpoint]) -> tuple[tuple[str, tuple[int | None, ...]], ...]:
    per_phase = []
    for phase, is_backlog in (("backlog", True), ("live", False)):
        values = {c.effective_interval_ms for c in mine if c.is_backlog == is_backlog}
        if values:
            per_phase.append((phase, tuple(sorted(values, key=lambda v: (v is None, v or 0)))))
    return tuple(per_phase)


def _end(
    history: JobHistory, run_id: str, mine: list[Checkpoint], later: str | None
) -> Boundary | None:
    lease = history.lease
    if lease is not None and lease.run_id == run_id:
        if lease.released_at is not None:
            return Boundary(
                run_id, lease.released_at, END, f"run {run_id} ended: it released its lease"
            )
        if not lease.alive(history.database_now):
            return Boundary(
                run_id,
                lease.expires_at,
                DEATH,
                f"run {run_id} died: its lease expired and was never released",
            )
        return None
    if later is None or not mine:
        return None
    return Boundary(
        run_id,
        mine[-1].committed_at,
        TAKEOVER,
        f"the last checkpoint of run {run_id}; run {later} took over after it",
    )


def runs(history: JobHistory, phases: list[Span]) -> list[RunRow]:
    """The runs of ``history``'s period, oldest first; ``phases`` are its ``spans``."""
    order, lease, rows = _run_order(history), history.lease, []
    for index, run_id in enumerate(order):
        mine = [c for c in history.checkpoints if c.run_id == run_id]
        later = order[index + 1] if index + 1 < len(order) else None
        if later is None and history.run_after not in (None, run_id):
            later = history.run_after
        if later is None and lease is not None and lease.run_id != run_id:
            later = lease.run_id
        is_lease = lease is not None and lease.run_id == run_id
        launch = None
        if is_lease and lease.acquired_at >= history.since:
            launch = Boundary(run_id, lease.acquired_at, LAUNCH, f"run {run_id} took its lease")
        elif not is_lease and not (index == 0 and history.run_before == run_id):
            launch = Boundary(
                run_id, mine[0].committed_at, LAUNCH, f"the first checkpoint of run {run_id}"
            )
        own = [span for span in phases if span.run_id == run_id]
        total = sum(span.seconds for span in own)
        in_backlog = sum(span.seconds for span in own if span.is_backlog)
        rows.append(
            RunRow(
                run_id=run_id,
                launch=launch,
                end=_end(history, run_id, mine, later),
                checkpoints=len(mine),
                backlog_checkpoints=sum(c.is_backlog for c in mine),
                backlog_time_share=in_backlog / total if total > 0 else None,
                rows=sum(c.num_input_rows for c in mine),
                intervals=_intervals(mine),
            )
        )
    return rows


def boundaries(history: JobHistory, run_rows: list[RunRow]) -> list[Boundary]:
    """The launches and ends of ``run_rows`` within ``history``'s period, in time order."""
    marks = [mark for row in run_rows for mark in (row.launch, row.end) if mark is not None]
    return sorted(
        (mark for mark in marks if history.since <= mark.at <= history.until),
        key=lambda mark: mark.at,
    )
