"""The in-process coordinator: statuses in, decisions out, every checkpoint recorded.

A checkpoint's row says where its time went and the state it carries, a transition's row
each operator's status (FLIP-327) when the query's operator graph is known: what a user
reads to tune the intervals.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import CheckpointDecider, CommittedBatch, Decision
from spark_jobs.backlog.freshness import oldest_event_at
from spark_jobs.backlog.graph import OperatorGraph
from spark_jobs.backlog.lag import LagDetector, watermark_lag_s
from spark_jobs.backlog.status import BacklogModel, SourceStatus
from spark_jobs.coordinator.progress import BatchProgress, StateOperatorProgress
from spark_jobs.metrics.schema import CheckpointRow, IntervalChangeRow, TransitionRow
from spark_jobs.sources.quarantine import count_set_aside
from spark_jobs.storage.files import StorageError

logger = logging.getLogger(__name__)


class DecisionApplier(Protocol):
    """Makes the query follow a decision: by gating its sources or by restarting it."""

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None: ...

    def reconfigure(self, config: BacklogConfig) -> None: ...


class StatusProbe(Protocol):
    """A backlog signal for a source whose progress carries none (Spark's file source)."""

    def observe(self, progress: BatchProgress) -> None: ...

    def status(self) -> SourceStatus: ...


class Recorder(Protocol):
    def record_checkpoint(self, row: CheckpointRow) -> None: ...

    def record_transition(self, row: TransitionRow) -> None: ...

    def record_interval_change(self, row: IntervalChangeRow) -> None: ...


@dataclass(frozen=True)
class Seed:
    """The job's status as its last recorded checkpoint left it, where a new run picks up.

    A restart is not a change of status: the new run's first status is a transition only
    if it differs from this one, and the lag rules keep their state. Without a seed (the
    job's first run), the first status is the job's first transition.
    """

    backlog_sources: frozenset[str]
    lag_states: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_sources_json(cls, text: str) -> Seed:
        """From a checkpoint row's ``sources`` column."""
        entries = [e for e in json.loads(text) if isinstance(e, dict) and "name" in e]
        return cls(
            backlog_sources=frozenset(
                str(e["name"]) for e in entries if e.get("is_backlog") and not e.get("finished")
            ),
            lag_states={
                str(e["name"]): e["lag_state"]
                for e in entries
                if isinstance(e.get("lag_state"), dict)
            },
        )


class BacklogCoordinator:
    """Aggregates the sources' statuses, asks the decider, applies the answer and records it.

    Every status passes through the lag rules, which may hold a source in backlog whatever
    its phase. Called from the query listener after every committed micro-batch; owns no
    thread.

    ``handling_ms`` keeps, per recent batch, how long its progress took here (deciding,
    publishing the plan, journaling the metrics row): the driver's share of a checkpoint,
    which Spark's ``durationMs`` does not see. A gated source waits for it between batches.
    """

    #: Recent batches whose handling time is kept.
    HANDLING_KEPT = 1000

    def __init__(
        self,
        config: BacklogConfig,
        applier: DecisionApplier,
        recorder: Recorder,
        *,
        clock: Callable[[], float] = time.time,
        probes: Iterable[StatusProbe] = (),
        graph: OperatorGraph | None = None,
        seed: Seed | None = None,
    ):
        self.config = config
        # Progress arrives on the listener's thread, reconfigurations on the control poller's.
        self._lock = threading.Lock()
        self._applier = applier
        self._recorder = recorder
        self._probes = list(probes)
        self._graph = graph
        self.model = BacklogModel(graph.source_names() if graph else ())
        self.decider = CheckpointDecider(config, clock)
        self._clock = clock
        self._lag = LagDetector(config.lag_rules, clock)
        self._backlog_sources: set[str] | None = None
        if seed is not None:
            self._backlog_sources = set(seed.backlog_sources)
            for name, state in seed.lag_states.items():
                self._lag.restore(name, state)
        self._runs: set[str] = set()
        self.last_progress: BatchProgress | None = None
        self.handling_ms: deque[tuple[int, float]] = deque(maxlen=self.HANDLING_KEPT)

    @property
    def job_is_backlog(self) -> bool | None:
        """The job status, or None before any source reported."""
        return None if self._backlog_sources is None else bool(self._backlog_sources)

    def start(self) -> Decision:
        """Apply the first decision, informed by the probes when there are any."""
        now = datetime.fromtimestamp(self._clock(), UTC)
        if self._probes:
            self._observe([probe.status() for probe in self._probes], now)
            decision = self.decider.on_status(bool(self._backlog_sources))
        else:
            decision = self.decider.decision
        self._applier.apply(decision)
        self._record_interval_change(decision, now)
        return decision

    def reconfigure(self, config: BacklogConfig) -> Decision:
        """New intervals while the query runs; the next decision follows them at once."""
        with self._lock:
            self.config = config
            self._applier.reconfigure(config)
            decision = self.decider.reconfigure(config)
            self._applier.apply(decision)
            self._record_interval_change(decision, datetime.fromtimestamp(self._clock(), UTC))
            return decision

    def on_progress(self, progress: BatchProgress) -> Decision:
        """Decide after a committed batch.

        A batch replayed from the offset log after a restart carries no latest offset, so
        nothing about lag: its phase counts only when that says backlog, since a lag rule
        could still hold a live phase in backlog.
        """
        began = time.perf_counter()
        with self._lock:
            decision = self._on_progress(progress)
            self.handling_ms.append((progress.batch_id, (time.perf_counter() - began) * 1000))
            return decision

    def _on_progress(self, progress: BatchProgress) -> Decision:
        statuses = [
            status
            for source in progress.sources
            if (status := source.hybrid_status()) is not None
            and (source.latest_offset is not None or status.is_backlog)
        ]
        for probe in self._probes:
            probe.observe(progress)
            statuses.append(probe.status())
        lag_s = watermark_lag_s(self._clock(), progress.watermark, progress.num_input_rows)
        self._observe(statuses, progress.committed_at, lag_s)
        job_is_backlog = bool(self._backlog_sources)
        batch = CommittedBatch(
            batch_id=progress.batch_id,
            started_at=progress.started_at.timestamp(),
            committed_at=progress.committed_at.timestamp(),
            num_rows=progress.num_input_rows,
            first_of_run=progress.run_id not in self._runs,
            oldest_event_at=oldest_event_at(progress.observed_metrics),
        )
        self._runs.add(progress.run_id)
        decision = self.decider.on_batch_committed(batch, job_is_backlog)
        self._applier.apply(decision, progress)
        self._record_checkpoint(progress, decision)
        self._record_interval_change(decision, progress.committed_at)
        self.last_progress = progress
        return decision

    def _observe(
        self, statuses: list[SourceStatus], at: datetime, watermark_lag: float | None = None
    ) -> None:
        if not statuses:
            return
        for status in statuses:
            self.model.report(self._lag.observe(status, watermark_lag))
        now_backlog = set(self.model.backlog_sources())
        before = self._backlog_sources
        self._backlog_sources = now_backlog
        if before is not None and bool(before) == bool(now_backlog):
            return
        reason = self._reason(before, now_backlog)
        self._recorder.record_transition(
            TransitionRow(
                job_name=self.config.job_name,
                run_id=self.config.run_id,
                at=at,
                is_backlog=bool(now_backlog),
                reason=reason,
                operators=json.dumps(self._graph.statuses(self.model)) if self._graph else None,
            )
        )
        operators = f"; operators: {self._graph.describe(self.model)}" if self._graph else ""
        logger.info(
            "job %s is now %s (%s)%s",
            self.config.job_name,
            "in backlog" if now_backlog else "live",
            reason,
            operators,
        )

    def _reason(self, before: set[str] | None, now: set[str]) -> str:
        """Which sources changed and by which rule: ``hybrid-phase: events is live (landing)``.
        The job's first status names what it rests on: every source in backlog, or else
        every source."""
        if before is None:
            changed = sorted(now) if now else sorted(s.name for s in self.model.sources())
        else:
            changed = sorted(now - before) if now else sorted(before - now)
        parts = []
        for name in changed:
            status = self.model.status(name)
            if status.finished:
                what = "finished"
            else:
                what = "is in backlog" if status.is_backlog else "is live"
                what += f" ({status.phase})" if status.phase else ""
            parts.append(f"{status.rule or 'reported'}: {name} {what}")
        return "; ".join(parts)

    def _record_interval_change(self, decision: Decision, at: datetime) -> None:
        """A new live interval chosen for the freshness target, with its reason."""
        if decision.interval_reason is None or decision.interval_s is None:
            return
        self._recorder.record_interval_change(
            IntervalChangeRow(
                job_name=self.config.job_name,
                run_id=self.config.run_id,
                at=at,
                interval_ms=round(decision.interval_s * 1000),
                reason=decision.interval_reason,
            )
        )
        logger.info(
            "job %s: live interval %.2fs (%s)",
            self.config.job_name,
            decision.interval_s,
            decision.interval_reason,
        )

    def _record_checkpoint(self, progress: BatchProgress, decision: Decision) -> None:
        interval = decision.interval_s
        self._recorder.record_checkpoint(
            CheckpointRow(
                job_name=self.config.job_name,
                run_id=self.config.run_id,
                batch_id=progress.batch_id,
                committed_at=progress.committed_at,
                is_backlog=decision.is_backlog,
                effective_interval_ms=None if interval is None else round(interval * 1000),
                num_input_rows=progress.num_input_rows,
                batch_duration_ms=progress.duration_ms,
                watermark=progress.watermark,
                sources=json.dumps(
                    [
                        s.as_json() | {"lag_state": self._lag.state(s.name)}
                        for s in self.model.sources()
                    ]
                ),
                observed_metrics=json.dumps(progress.observed_metrics)
                if progress.observed_metrics
                else None,
                quarantined=_set_aside(progress),
                **dataclasses.asdict(progress.cost),
                sink_output_rows=progress.sink_output_rows,
                sink_commit_ms=progress.sink_commit_ms,
                **_state_columns(progress.state_operators),
            )
        )


def _state_columns(operators: Sequence[StateOperatorProgress]) -> dict[str, int | str | None]:
    """The checkpoint's state: totals over its stateful operators and each one's numbers
    (none for a query without state). The size on disk is unknown unless every operator
    reports its own."""
    if not operators:
        return {}
    disk = [op.disk_bytes for op in operators if op.disk_bytes is not None]
    return {
        "state_rows_total": sum(op.rows_total for op in operators),
        "state_rows_updated": sum(op.rows_updated for op in operators),
        "state_memory_bytes": sum(op.memory_bytes for op in operators),
        "state_disk_bytes": sum(disk) if len(disk) == len(operators) else None,
        "state_commit_ms": sum(op.commit_ms for op in operators),
        "state_operators": json.dumps([op.as_json() for op in operators]),
    }


def _set_aside(progress: BatchProgress) -> int | None:
    """Malformed files and records the batch's sources set aside, where they have a
    quarantine; a quarantine that cannot be read leaves the count unknown, not the batch."""
    counts = []
    for source in progress.sources:
        end = source.end_offset
        if not isinstance(end, dict) or "source" not in end:
            continue
        start = source.start_offset if isinstance(source.start_offset, dict) else None
        try:
            counts.append(count_set_aside(start, end))
        except (OSError, StorageError, ValueError, KeyError) as error:
            logger.warning(
                "batch %s: cannot count what was set aside: %s", progress.batch_id, error
            )
    known = [count for count in counts if count is not None]
    return sum(known) if known else None
