"""A fake clock and a simulated trigger loop, to test the decider and plan over whole runs.

The simulated job reads a hybrid source: a bounded backlog, then live rows arriving at a
steady rate from time zero. Each batch costs a fixed overhead plus a per-row cost, like a
Spark micro-batch. Batches are gated exactly as the real source gates them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import CheckpointDecider, CommittedBatch
from spark_jobs.backlog.plan import TriggerPlan


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
) -> list[SimBatch]:
    clock = FakeClock()
    t0 = clock.now
    decider = CheckpointDecider(cfg, clock)
    seq = 1
    plan = TriggerPlan.from_decision(seq, decider.decision, stale_after_s=cfg.interval_s * 3)
    last_seq: int | None = None
    last_release: float | None = None
    backlog_left, consumed_live, in_backlog_child = backlog_rows, 0, backlog_rows > 0
    batches: list[SimBatch] = []

    def offset() -> dict[str, object]:
        return {"source": "sim", "backlog": in_backlog_child, "at": [backlog_left, consumed_live]}

    while clock.now - t0 < seconds:
        if not plan.releases(clock.now, offset(), last_seq, last_release):
            clock.advance(tick_s)
            continue
        handoff = in_backlog_child and backlog_left == 0
        if handoff:
            in_backlog_child = False
        if in_backlog_child:
            rows = min(plan.max_rows, backlog_left)
            backlog_left -= rows
        else:
            arrived = math.floor(live_rows_per_s * (clock.now - t0))
            rows = min(plan.max_rows, arrived - consumed_live)
            consumed_live += rows
            if rows == 0 and not handoff:
                clock.advance(tick_s)
                continue
        last_seq, last_release = plan.seq, clock.now
        started = clock.now
        clock.advance(overhead_s + rows * row_cost_s)
        batch = CommittedBatch(len(batches), started, clock.now, rows)
        batches.append(SimBatch(batch.batch_id, started, clock.now, rows, in_backlog_child))
        seq += 1
        decision = decider.on_batch_committed(batch, job_is_backlog=in_backlog_child)
        plan = TriggerPlan.from_decision(seq, decision, cfg.interval_s * 3, {"sim": offset()})
    return batches


def starts(batches: list[SimBatch]) -> list[float]:
    return [b.started_at for b in batches]


def gaps(values: list[float]) -> list[float]:
    return [round(b - a, 6) for a, b in itertools.pairwise(values)]
