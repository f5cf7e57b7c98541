"""When the next micro-batch (= checkpoint) may start and how much data it may take.

Pure, like Flink's ``CheckpointRequestDecider``: it is told about committed batches and
status changes, reads time only from the injected clock, and returns decisions. The
coordinator owns the timers, the I/O and Spark.

Translation of FLIP-309 to micro-batches (docs/concepts.md has the reasoning):
- backlog: batches back to back, each sized from the measured throughput to take about
  ``interval-during-backlog``; with ``0`` the largest batch the row cap allows;
- real time: one batch per ``interval`` (start to start) with everything that arrived;
- ``min-pause`` separates the commit of one batch from the start of the next;
- backlog ends: the next batch is due no later than ``now + interval``;
- backlog starts: the deadline already armed stands, later batches follow backlog rules;
- with a freshness target, the live interval is chosen from measured live batches
  (``freshness.py``) instead of being ``interval``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from spark_jobs.backlog.config import BacklogConfig, checkpoint_interval
from spark_jobs.backlog.freshness import Bounds, FreshnessWindow, IntervalChoice, live_batch

Clock = Callable[[], float]

#: A size estimate may not exceed the largest measured batch by more than this factor.
MAX_EXTRAPOLATION = 10
_SAMPLES = 8


@dataclass(frozen=True)
class CommittedBatch:
    """What the coordinator learned from one committed micro-batch (epoch seconds)."""

    batch_id: int
    started_at: float
    committed_at: float
    num_rows: int
    #: The first batch of a query run also pays for JVM warm-up and query start: its time
    #: says little about throughput.
    first_of_run: bool = False
    #: The event time of its oldest input row, where the query observes one.
    oldest_event_at: float | None = None

    @property
    def duration_s(self) -> float:
        return max(self.committed_at - self.started_at, 0.0)


@dataclass(frozen=True)
class Decision:
    """The next batch may start at ``due_at`` and take at most ``max_rows`` rows.

    ``standing`` means the decision also holds for the batches after the next one, so a
    source may run them back to back without waiting for a fresh decision: in backlog,
    without min-pause, once the batch size no longer depends on the next measurement.
    """

    is_backlog: bool
    interval_s: float | None
    due_at: float
    max_rows: int
    standing: bool
    #: Set when this decision changed the live interval chosen for the freshness target:
    #: why, to be recorded with the change.
    interval_reason: str | None = None


class ThroughputEstimator:
    """Fits ``duration = overhead + rows * cost`` over recent batches.

    Every micro-batch has a fixed cost (0.15-0.9 s measured) besides its data, so a
    plain rows/second rate would underestimate how much a longer batch can take.
    """

    def __init__(self) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=_SAMPLES)
        self._warm_up: tuple[int, float] | None = None

    def observe(self, rows: int, seconds: float, *, warm_up: bool = False) -> None:
        """Record a batch; a warm-up batch only stands in until a regular one is measured,
        as a pessimistic bound (its time includes the warm-up)."""
        if rows > 0 and seconds > 0:
            if warm_up:
                self._warm_up = (rows, seconds)
            else:
                self._samples.append((rows, seconds))

    def seconds_per_row(self) -> float | None:
        """The measured cost of one more row in a batch (None before any regular batch)."""
        return self._fit()[1] if self._samples else None

    @property
    def settled(self) -> bool:
        """Two regular measurements: enough to size batches without asking again each time."""
        return len(self._samples) >= 2

    def rows_for(self, target_s: float) -> int | None:
        """Rows a batch can take to last about ``target_s``; None before any measurement.

        A batch lasts at least twice its fixed cost: below that, smaller batches would not
        checkpoint more often, only slower. Until a batch that long was measured, the data
        part of small batches drowns in noise, so the size at least doubles each time.
        """
        if not self._samples:
            if self._warm_up is None:
                return None
            rows, seconds = self._warm_up
            return max(1, round(rows * target_s / seconds))
        overhead, cost = self._fit()
        target_s = max(target_s, 2 * overhead)
        rows = (target_s - overhead) / cost
        largest_rows, largest_s = max(self._samples)
        if largest_s < target_s:
            rows = max(rows, 2 * largest_rows)
        return round(max(1.0, min(rows, largest_rows * MAX_EXTRAPOLATION)))

    def _fit(self) -> tuple[float, float]:
        rows = [float(r) for r, _ in self._samples]
        secs = [s for _, s in self._samples]
        if len(rows) >= 2 and max(rows) >= 1.5 * min(rows):
            mean_r, mean_s = sum(rows) / len(rows), sum(secs) / len(secs)
            var = sum((r - mean_r) ** 2 for r in rows)
            cov = sum((r - mean_r) * (s - mean_s) for r, s in zip(rows, secs, strict=True))
            cost = cov / var
            overhead = mean_s - cost * mean_r
            if cost > 0 and overhead >= 0:
                return overhead, cost
        # Too little spread to separate the fixed cost: fold it into the per-row cost,
        # which errs towards smaller batches.
        return 0.0, sum(secs) / sum(rows)


class CheckpointDecider:
    """Decides the next checkpoint from statuses, measured throughput and the clock."""

    def __init__(self, config: BacklogConfig, clock: Clock):
        self._config = config
        self._clock = clock
        self._throughput = ThroughputEstimator()
        self._freshness = FreshnessWindow()
        self._live_choice: IntervalChoice | None = None
        self._changed_choice: IntervalChoice | None = None
        self._last_started_at: float | None = None
        # None until the first status arrives: the first report is not a switch.
        self._backlog: bool | None = None
        # Nothing is known at start: the first batch may start at once and take up to the
        # row cap. Its time includes the run's warm-up, so a smaller probe would measure
        # nothing more and only add a checkpoint.
        self._decision = Decision(
            is_backlog=False,
            interval_s=config.interval_s,
            due_at=clock(),
            max_rows=config.max_batch_rows,
            standing=False,
        )

    @property
    def decision(self) -> Decision:
        return self._decision

    def is_due(self) -> bool:
        """Whether a checkpoint (the next micro-batch) may start now."""
        return self._clock() >= self._decision.due_at

    def on_batch_committed(self, batch: CommittedBatch, job_is_backlog: bool) -> Decision:
        """Decide after a commit; ``job_is_backlog`` is the status the batch's progress carried.

        A batch that carried live data keeps the live cadence from its start, which also
        bounds the first live batch after backlog by ``now + interval``. A batch that
        carried backlog runs the next one back to back, unless backlog has just started:
        then the live deadline already armed stands.
        """
        self._throughput.observe(batch.num_rows, batch.duration_s, warm_up=batch.first_of_run)
        was_backlog = self._backlog
        if not job_is_backlog and was_backlog is False:
            self._observe_live(batch)
        self._last_started_at = batch.started_at
        self._backlog = job_is_backlog
        if not job_is_backlog:
            self._choose_live_interval()
        earliest = batch.committed_at + self._config.min_pause_s
        if job_is_backlog and was_backlog is not False:
            due = earliest
        else:
            due = max(batch.started_at + self._live_interval_s(), earliest)
        return self._decide(due)

    def on_status(self, job_is_backlog: bool) -> Decision:
        """Decide after the job status changed between commits."""
        if job_is_backlog == self._backlog:
            return self._decision
        due = self._decision.due_at
        ended_backlog = bool(self._backlog) and not job_is_backlog
        self._backlog = job_is_backlog
        if not job_is_backlog:
            self._choose_live_interval()
        if ended_backlog:
            due = min(due, self._clock() + self._live_interval_s())
        return self._decide(due)

    def reconfigure(self, config: BacklogConfig) -> Decision:
        """New intervals (or freshness target) for the running job. In real time the next
        batch is due no later than ``now + interval``, as when backlog ends; in backlog the
        batch size follows."""
        self._config = config
        due = self._decision.due_at
        if not self._backlog:
            self._choose_live_interval(forced=True)
            due = min(due, self._clock() + self._live_interval_s())
        return self._decide(due)

    def _observe_live(self, batch: CommittedBatch) -> None:
        released_under = self._decision.interval_s
        if released_under is None:
            return
        measured = live_batch(
            released_under,
            batch.started_at,
            batch.committed_at,
            batch.num_rows,
            self._last_started_at,
            batch.oldest_event_at,
        )
        if measured is not None:
            self._freshness.observe(measured)

    def _choose_live_interval(self, forced: bool = False) -> None:
        """Re-choose the live interval for the freshness target; a change (or any choice,
        when ``forced`` by a reconfiguration) is kept to be recorded with the next decision."""
        target = self._config.freshness_target_s
        if target is None:
            self._live_choice = None
            return
        choice = self._freshness.choose(
            target,
            Bounds(self._config.min_pause_s, self._config.interval_s),
            None if self._live_choice is None else self._live_choice.interval_s,
            self._throughput.seconds_per_row(),
        )
        if forced or choice.differs_from(self._live_choice):
            self._live_choice = self._changed_choice = choice

    def _live_interval_s(self) -> float:
        interval = checkpoint_interval(self._config, False, self._chosen_live_s())
        return self._config.interval_s if interval is None else interval

    def _chosen_live_s(self) -> float | None:
        return None if self._live_choice is None else self._live_choice.interval_s

    def _decide(self, due_at: float) -> Decision:
        changed, self._changed_choice = self._changed_choice, None
        self._decision = Decision(
            is_backlog=bool(self._backlog),
            interval_s=checkpoint_interval(
                self._config, bool(self._backlog), self._chosen_live_s()
            ),
            due_at=due_at,
            max_rows=self._batch_rows(),
            standing=bool(self._backlog)
            and self._config.min_pause_s == 0
            and (self._throughput.settled or self._config.interval_during_backlog_s == 0),
            interval_reason=None if changed is None else changed.reason,
        )
        return self._decision

    def _batch_rows(self) -> int:
        cap = self._config.max_batch_rows
        target_s = checkpoint_interval(self._config, bool(self._backlog))
        if not self._backlog or target_s is None:
            return cap
        estimate = self._throughput.rows_for(target_s)
        return cap if estimate is None else min(cap, estimate)
