"""What a job's metrics rows say, as typed values: what ``BacklogMetricsHook``'s reads of
a job's checkpoints and transitions return. A column an older release did not write stays
None, so that a reader shows it as unknown, not as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from spark_jobs.backlog.lag import OFFSET_LAG, WATERMARK_LAG

#: The rules that hold a source in backlog because the job trails it (FLIP-328), as opposed
#: to a phase rule (``hybrid-phase``, ``pending-files``) that says it reads history.
LAG_RULES = frozenset({OFFSET_LAG, WATERMARK_LAG})
#: Spark's ``durationMs`` parts that every checkpoint pays whatever its data: its fixed cost.
FIXED_PARTS = (
    "latest_offset_ms",
    "get_batch_ms",
    "query_planning_ms",
    "wal_commit_ms",
    "commit_offsets_ms",
)


@dataclass(frozen=True)
class SourceReport:
    """What one source said of itself at a checkpoint (an entry of its ``sources`` JSON).

    :param name: The source's name.
    :param is_backlog: Whether it was in backlog.
    :param rule: What decided that: a phase rule (``hybrid-phase``, ``pending-files``) or a
        lag rule (``offset-lag``, ``watermark-lag``); None when the source named none.
    :param lag: What the source knew of its distance to the live end, as (metric, value)
        pairs, e.g. ``("offsets_behind_latest", 1200.0)``.
    :param health: What the source said of its health in words, as (name, value) pairs,
        e.g. ``("slot_wal_status", "reserved")``.
    """

    name: str
    is_backlog: bool
    rule: str | None
    lag: tuple[tuple[str, float], ...]
    health: tuple[tuple[str, str], ...] = ()

    @property
    def held_by_lag(self) -> bool:
        """In backlog because a lag rule holds it, not because of its phase."""
        return self.is_backlog and self.rule in LAG_RULES


@dataclass(frozen=True)
class Checkpoint:
    """One committed micro-batch, with where its time went and the state it carried.

    The duration parts and state numbers are None on a row an older release recorded (or
    one rebuilt after a crash): unknown, not zero.

    :param run_id: The run that committed it.
    :param batch_id: Spark's batch id.
    :param committed_at: When it was committed (aware, UTC).
    :param is_backlog: The job's phase: True in backlog.
    :param effective_interval_ms: The checkpoint interval in force; None when periodic
        checkpoints were disabled.
    :param num_input_rows: Rows the batch read.
    :param batch_duration_ms: The batch's whole duration.
    :param recovered: True when the next run rebuilt the row after a crash.
    :param sources: What each source said of itself.
    :param latest_offset_ms: Asking the sources for their latest offsets.
    :param get_batch_ms: Building the batch's input.
    :param query_planning_ms: Planning the batch's query.
    :param add_batch_ms: The data work: reading, processing, updating state, writing.
    :param wal_commit_ms: Writing the offset log (write-ahead).
    :param commit_offsets_ms: Writing the commit log.
    :param sink_output_rows: Rows the sink wrote.
    :param state_rows_total: Rows in state, summed over the stateful operators.
    :param state_rows_updated: State rows the batch updated.
    :param state_memory_bytes: State held in memory.
    :param state_disk_bytes: State on disk (the checkpoint's state files).
    :param state_commit_ms: Committing the state stores.
    """

    run_id: str
    batch_id: int
    committed_at: datetime
    is_backlog: bool
    effective_interval_ms: int | None
    num_input_rows: int
    batch_duration_ms: int
    recovered: bool
    sources: tuple[SourceReport, ...]
    latest_offset_ms: int | None
    get_batch_ms: int | None
    query_planning_ms: int | None
    add_batch_ms: int | None
    wal_commit_ms: int | None
    commit_offsets_ms: int | None
    sink_output_rows: int | None
    state_rows_total: int | None
    state_rows_updated: int | None
    state_memory_bytes: int | None
    state_disk_bytes: int | None
    state_commit_ms: int | None

    @property
    def other_ms(self) -> int | None:
        """Spark's own bookkeeping: the duration less every part (at least 0); None while
        a part is unknown."""
        parts = [getattr(self, name) for name in (*FIXED_PARTS, "add_batch_ms")]
        if any(part is None for part in parts):
            return None
        return max(self.batch_duration_ms - sum(parts), 0)

    @property
    def fixed_ms(self) -> int | None:
        """The checkpoint's fixed cost: every part but the data work, and the bookkeeping."""
        other = self.other_ms
        if other is None:
            return None
        return sum(getattr(self, name) for name in FIXED_PARTS) + other

    @property
    def held_by_lag(self) -> bool:
        """In backlog, and a lag rule holds one of its sources there."""
        return self.is_backlog and any(source.held_by_lag for source in self.sources)


@dataclass(frozen=True)
class OperatorStatus:
    """One operator's FLIP-327 status after a transition.

    :param id: The operator's id in the job's graph.
    :param kind: ``source``, ``one-input``, ``join`` or ``union``.
    :param source: The source a source operator reads; None for the others.
    :param inputs: The ids of the operators it reads from.
    :param is_backlog: Whether it was in backlog.
    """

    id: str
    kind: str
    source: str | None
    inputs: tuple[str, ...]
    is_backlog: bool


@dataclass(frozen=True)
class Transition:
    """One change of the job's phase.

    :param run_id: The run it happened in.
    :param at: When (aware, UTC).
    :param is_backlog: The phase it changed to: True for backlog.
    :param reason: Which sources changed and by which rule.
    :param operators: Each operator's status after it; None when the job reported no
        operator graph.
    """

    run_id: str
    at: datetime
    is_backlog: bool
    reason: str
    operators: tuple[OperatorStatus, ...] | None


@dataclass(frozen=True)
class IntervalChange:
    """A new live interval the job chose for its freshness target.

    :param run_id: The run that chose it.
    :param at: When (aware, UTC).
    :param interval_ms: The interval chosen.
    :param reason: Why: the freshness it keeps, or why the target cannot be met.
    """

    run_id: str
    at: datetime
    interval_ms: int
    reason: str


@dataclass(frozen=True)
class ControlRequest:
    """A request Airflow made to the job (``reconfigure`` or ``stop``) and its answer.

    :param requested_at: When it was made (aware, UTC).
    :param action: ``reconfigure`` or ``stop``.
    :param settings: For reconfigure, the new settings as JSON text.
    :param status: ``pending``, ``claimed``, ``applied``, ``rejected`` or ``withdrawn``.
    :param answer: The job's answer; None until answered.
    :param answered_by_run: The run that took it; None until one did.
    """

    requested_at: datetime
    action: str
    settings: str
    status: str
    answer: str | None
    answered_by_run: str | None
