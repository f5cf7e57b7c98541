"""A fake clock and a simulated trigger loop, to test the decider and plan over whole runs.

The simulated job reads a hybrid source: a bounded backlog, then live rows arriving at a
steady rate from time zero (or a step to another rate), each stamped with its arrival time
less a fixed event delay. Each batch costs a fixed overhead plus a per-row cost, like a
Spark micro-batch. Batches are gated exactly as the real source gates them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import CheckpointDecider, CommittedBatch
from spark_jobs.backlog.plan import STALE_GRACE_S, TriggerPlan


class FakeClock:
    def __init__(self, start: float = 1_000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class SimBatch:
    batch_id: int
    started_at: float
    committed_at: float
    rows: int
    is_backlog: bool
    #: Commit minus the oldest row's event time (live batches with rows only).
    freshness_s: float | None = None
    interval_s: float | None = None
    interval_reason: str | None = None


@dataclass(frozen=True)
class Arrivals:
    """Live rows a second, from time zero, and from ``step_at_s`` on ``step_rows_per_s``."""

    rows_per_s: float
    step_at_s: float = math.inf
    step_rows_per_s: float = 0.0

    def count(self, elapsed_s: float) -> int:
        """Rows arrived by ``elapsed_s``."""
        before = self.rows_per_s * min(elapsed_s, self.step_at_s)
        return math.floor(before + self.step_rows_per_s * max(elapsed_s - self.step_at_s, 0.0))

    def time_of(self, row: int) -> float:
        """When row number ``row`` (from 1) arrived, in seconds from time zero."""
        before_step = self.rows_per_s * self.step_at_s
        if row <= before_step:
            return row / self.rows_per_s
        return self.step_at_s + (row - before_step) / self.step_rows_per_s


def config(**conf: str) -> BacklogConfig:
    return BacklogConfig.from_spark_conf(
        {"spark.backlog.job-name": "sim"}
        | {f"spark.backlog.checkpointing.{k.replace('_', '-')}": v for k, v in conf.items()}
    )


def simulate(
    cfg: BacklogConfig,
    backlog_rows: int,
    live_rows_per_s: float,
    seconds: float,
    overhead_s: float = 0.3,
    row_cost_s: float = 2e-6,
    tick_s: float = 0.1,
    listener_lag_s: float = 0.05,
    arrivals: Arrivals | None = None,
    event_delay_s: float = 0.0,
) -> list[SimBatch]:
    """Each plan reaches the source ``listener_lag_s`` after the commit it follows, as it
    does through Spark's asynchronous listener bus; triggers in between see the old one."""
    clock = FakeClock()
    t0 = clock.now
    arrivals = arrivals or Arrivals(live_rows_per_s)
    decider = CheckpointDecider(cfg, clock)
    stale_after_s = cfg.interval_s + STALE_GRACE_S
    plan = TriggerPlan.from_decision(1, decider.decision, stale_after_s)
    next_plan: tuple[float, TriggerPlan] | None = None
    last_seq: int | None = None
    waiting_at, waiting_since = None, clock.now
    backlog_left, consumed_live, in_backlog_child = backlog_rows, 0, backlog_rows > 0
    batches: list[SimBatch] = []

    def offset() -> dict[str, object]:
        return {"source": "sim", "backlog": in_backlog_child, "at": [backlog_left, consumed_live]}

    while clock.now - t0 < seconds:
        if next_plan is not None and clock.now >= next_plan[0]:
            plan, next_plan = next_plan[1], None
        start = offset()
        if start != waiting_at:
            waiting_at, waiting_since = start, clock.now
        if not plan.releases(clock.now, start, last_seq, waiting_since):
            clock.advance(tick_s)
            continue
        handoff = in_backlog_child and backlog_left == 0
        if handoff:
            in_backlog_child = False
        oldest_event_at = None
        if in_backlog_child:
            rows = min(plan.max_rows, backlog_left)
            backlog_left -= rows
        else:
            rows = min(plan.max_rows, arrivals.count(clock.now - t0) - consumed_live)
            if rows == 0 and not handoff:
                clock.advance(tick_s)
                continue
            if rows:
                oldest_event_at = t0 + arrivals.time_of(consumed_live + 1) - event_delay_s
            consumed_live += rows
        last_seq = plan.seq
        started = clock.now
        clock.advance(overhead_s + rows * row_cost_s)
        batch = CommittedBatch(
            len(batches), started, clock.now, rows, oldest_event_at=oldest_event_at
        )
        decision = decider.on_batch_committed(batch, job_is_backlog=in_backlog_child)
        batches.append(
            SimBatch(
                batch.batch_id,
                started,
                clock.now,
                rows,
                in_backlog_child,
                None if oldest_event_at is None else clock.now - oldest_event_at,
                decision.interval_s,
                decision.interval_reason,
            )
        )
        following = TriggerPlan.from_decision(
            plan.seq + 1, decision, stale_after_s, {"sim": offset()}
        )
        next_plan = (clock.now + listener_lag_s, following)
    return batches


def starts(batches: list[SimBatch]) -> list[float]:
    return [b.started_at for b in batches]


def gaps(values: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(values)]
