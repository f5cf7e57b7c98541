"""``scripts/benchmark --freshness-target 5``: a freshness target against a fixed live interval.

On each live phase (a landing directory, a Kafka topic of the embedded broker), after the
same backlog, the events pipeline runs twice, backlog-aware both times:

- ``fixed-1s``: live interval 1 s;
- ``target-5s``: the job chooses its live interval for a 5 s freshness target (up to
  ``interval`` 30 s). After its steady window at the first rate, the live rate steps up
  (2,000 to 20,000 events a second by default) and the run follows the new rate until any
  backlog the step caused has drained and a second window has passed.

Reported per run: live checkpoints in the steady window, and the p95 of live freshness as
the target judges it (each batch's commit minus its oldest event), with the row-weighted
p95 beside it; after the step the same, or the reason the job recorded for missing the
target. The chart shows each targeted run's chosen interval and its batches' freshness.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from spark_jobs.backlog.freshness import p95
from spark_jobs.metrics.schema import backlog_interval_changes, make_engine
from tools.pipelines.report import (
    Checkpoint,
    caught_up,
    epoch,
    freshness_s,
    save_chart,
    weighted_percentile,
)
from tools.pipelines.runs import KafkaTopic, Run, Workspace, for_seconds_after, say
from tools.services.broker import EmbeddedBroker

PARTITIONS = 4


@dataclass(frozen=True)
class Window:
    """A stretch of live checkpoints, as the target judges it."""

    checkpoints: int
    seconds: float
    batch_p95_s: float
    row_p95_s: float
    median_interval_s: float

    @classmethod
    def of(cls, live: Sequence[Checkpoint], seconds: float) -> Window:
        fresh = [c.freshness_s for c in live if c.freshness_s is not None]
        gaps = sorted(b.started_at - a.started_at for a, b in itertools.pairwise(live))
        return cls(
            checkpoints=len(live),
            seconds=seconds,
            batch_p95_s=p95(fresh) if fresh else float("nan"),
            row_p95_s=weighted_percentile(freshness_s(live), 0.95),
            median_interval_s=gaps[len(gaps) // 2] if gaps else float("nan"),
        )


#: One chart panel: the targeted run's name, checkpoints, chosen intervals (at, seconds,
#: reason) and rate step, and the fixed run's checkpoints.
Panel = tuple[str, list[Checkpoint], list[tuple[float, float, str]], float | None, list[Checkpoint]]


class RateStep:
    """A ``keep_going``: ``window_s`` of live data at the first rate, then ``rate`` events a
    second until the run is live again and ``window_s`` more have passed."""

    def __init__(self, run: Run, rate: int, window_s: float, give_up_s: float = 240.0):
        self._run, self._rate, self._window_s, self._give_up_s = run, rate, window_s, give_up_s
        self._live_since: float | None = None
        self.step_at: float | None = None

    def __call__(self, checkpoints: list[Checkpoint]) -> bool:
        if self.step_at is None:
            steady = caught_up(checkpoints)
            if steady and steady[0].started_at + self._window_s + 2 <= checkpoints[-1].started_at:
                assert self._run.producer is not None
                self.step_at = checkpoints[-1].committed_at
                say(f"[{self._run.name}] the live rate steps up to {self._rate:,} events/s")
                self._run.producer.set_rate(self._rate)
            return True
        after = [c for c in checkpoints if c.started_at >= self.step_at]
        drained = after_backlog(after)
        if not drained:
            return after[-1].committed_at - self.step_at < self._give_up_s if after else True
        return drained[-1].started_at - drained[0].started_at < self._window_s


def after_backlog(checkpoints: Sequence[Checkpoint], settle: int = 3) -> list[Checkpoint]:
    """The live checkpoints after the last backlog one, less the first ``settle`` (they
    still carry what piled up)."""
    last_backlog = max((i for i, c in enumerate(checkpoints) if c.is_backlog), default=-1)
    return [c for c in checkpoints[last_backlog + 1 :] if not c.is_backlog][settle:]


def interval_changes(url: str, job: str) -> list[tuple[float, float, str]]:
    """(at, interval in seconds, reason) of each live interval the job chose."""
    engine = make_engine(url)
    table = backlog_interval_changes
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(table.c.at, table.c.interval_ms, table.c.reason)
                .where(table.c.job_name == job)
                .order_by(table.c.at)
            ).all()
    finally:
        engine.dispose()
    return [(epoch(at), ms / 1000, reason) for at, ms, reason in rows]


def plot(runs: Sequence[Panel], target_s: float, path: Path) -> Path:
    """Per live phase: the interval the targeted run chose over time, each of its live
    batches' freshness and the fixed 1 s run's beside them, the target, and the rate step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(runs), 1, figsize=(12, 3.2 * len(runs)), squeeze=False)
    for axis, (name, checkpoints, changes, step_at, fixed) in zip(axes[:, 0], runs, strict=True):
        origin = checkpoints[0].started_at
        live = [c for c in checkpoints if not c.is_backlog and c.freshness_s is not None]
        fixed_live = [c for c in fixed if not c.is_backlog and c.freshness_s is not None]
        axis.plot(
            [c.committed_at - fixed[0].started_at for c in fixed_live],
            [c.freshness_s for c in fixed_live],
            ".",
            ms=2,
            color="#8c959f",
            label="fixed 1 s interval: batch freshness",
        )
        axis.plot(
            [c.committed_at - origin for c in live],
            [c.freshness_s for c in live],
            ".",
            ms=4,
            color="#2ca02c",
            label="target: batch freshness (commit - oldest event)",
        )
        if changes:
            times = [at - origin for at, _, _ in changes] + [checkpoints[-1].committed_at - origin]
            values = [value for _, value, _ in changes]
            axis.step(
                times,
                [*values, values[-1]],
                where="post",
                color="#6639ba",
                lw=2,
                label="chosen interval",
            )
        axis.axhline(target_s, color="#cf222e", ls="--", lw=1, label=f"target {target_s:g} s")
        backlog = [c for c in checkpoints if c.is_backlog]
        for c in backlog:
            axis.axvspan(
                c.started_at - origin, c.committed_at - origin, color="#b5651d", alpha=0.15, lw=0
            )
        if step_at is not None:
            axis.axvline(step_at - origin, color="#555555", ls=":", lw=1)
            axis.annotate(
                "rate step",
                (step_at - origin, 0.98),
                xycoords=("data", "axes fraction"),
                ha="left",
                va="top",
                fontsize="small",
                color="#555555",
            )
        axis.set_ylim(0, max(2 * target_s, *(c.freshness_s for c in live[-20:])) * 1.05)
        axis.set_title(name)
        axis.set_ylabel("seconds")
        axis.legend(loc="upper left", fontsize="small")
    axes[-1, 0].set_xlabel("seconds since the first batch started (shaded: backlog)")
    figure.suptitle("live interval chosen for a freshness target")
    return save_chart(figure, path)


@dataclass(frozen=True)
class Outcome:
    """One live phase: the fixed interval's window, the target's, and after the step."""

    live: str
    fixed: Window
    target: Window
    after_step: Window | None
    #: The last reason the targeted run recorded for its interval.
    last_reason: str | None

    def as_json(self) -> dict[str, object]:
        return {
            "fixed_1s": self.fixed.__dict__,
            "target": self.target.__dict__,
            "after_step": None if self.after_step is None else self.after_step.__dict__,
            "checkpoint_ratio": self.fixed.checkpoints / max(self.target.checkpoints, 1),
            "last_reason": self.last_reason,
        }


def steady_window(checkpoints: Sequence[Checkpoint], window_s: float) -> Window:
    steady = caught_up(checkpoints)
    if not steady:
        return Window.of([], window_s)
    end = steady[0].started_at + window_s
    return Window.of([c for c in steady if c.committed_at <= end], window_s)


def run_phase(
    args: argparse.Namespace, workspace: Workspace, kafka: KafkaTopic | None
) -> tuple[Outcome, Panel]:
    """The two runs on one live phase."""
    live = "landing" if kafka is None else "kafka"
    window_s = args.window
    common = {
        "spark.backlog.checkpointing.interval-during-backlog": "30s",
        "spark.backlog.checkpointing.max-batch-rows": str(args.max_batch_rows),
    }
    configurations = {
        "fixed-1s": {"spark.backlog.checkpointing.interval": "1s"},
        f"target-{args.freshness_target:g}s": {
            "spark.backlog.checkpointing.interval": "30s",
            "spark.backlog.checkpointing.freshness-target": f"{args.freshness_target:g}s",
        },
    }
    measured: dict[str, list[Checkpoint]] = {}
    step_at = None
    for label, conf in configurations.items():
        run = Run.on(
            workspace,
            f"{live}-{label}",
            common | conf,
            ["--shuffle-partitions", "2"],
            kafka,
            PARTITIONS,
        )
        if label == "fixed-1s":
            keep_going = for_seconds_after(caught_up, window_s + 2)
        else:
            keep_going = step = RateStep(run, args.rate_step, window_s)
        measured[label] = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
        if label != "fixed-1s":
            step_at = step.step_at
    fixed, targeted = measured.values()
    target_name = f"{live}-target-{args.freshness_target:g}s"
    changes = interval_changes(workspace.metrics_url, target_name)
    after = None
    if step_at is not None:
        drained = after_backlog([c for c in targeted if c.started_at >= step_at])
        if drained:
            after = Window.of(drained, drained[-1].committed_at - drained[0].started_at)
    outcome = Outcome(
        live,
        steady_window(fixed, window_s),
        steady_window(targeted, window_s),
        after,
        changes[-1][2] if changes else None,
    )
    return outcome, (target_name, targeted, changes, step_at, fixed)


def table(outcomes: Sequence[Outcome], target_s: float) -> list[str]:
    lines = [
        "| live phase: run | live checkpoints | median interval (s) | batch freshness p95 (s) "
        "| row freshness p95 (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        for name, w in (
            ("fixed 1 s", o.fixed),
            (f"target {target_s:g} s", o.target),
            ("target, after the step", o.after_step),
        ):
            if w is not None:
                lines.append(
                    f"| {o.live}: {name} ({w.seconds:.0f} s) | {w.checkpoints} | "
                    f"{w.median_interval_s:.2f} | {w.batch_p95_s:.2f} | {w.row_p95_s:.2f} |"
                )
    return lines


def main(args: argparse.Namespace, workspace: Workspace) -> int:
    outcomes, charts = [], []
    for live in args.live:
        if live == "landing":
            outcome, chart = run_phase(args, workspace, None)
        else:
            names = ["kafka-fixed-1s", f"kafka-target-{args.freshness_target:g}s"]
            with EmbeddedBroker(
                workspace.root / "broker", dict.fromkeys(names, PARTITIONS)
            ) as broker:
                kafka = KafkaTopic(broker.bootstrap_servers, "", PARTITIONS)
                outcome, chart = run_phase(args, workspace, kafka)
        outcomes.append(outcome)
        charts.append(chart)
    path = plot(charts, args.freshness_target, args.chart or workspace.root / "freshness.png")
    load_average = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    for line in ["", *table(outcomes, args.freshness_target), ""]:
        say(line)
    for o in outcomes:
        say(f"{o.live}: last interval reason: {o.last_reason}")
    say(f"chart: {path}")
    say(f"load average at the end: {load_average}")
    summary = {
        "freshness_target_s": args.freshness_target,
        "live_events_per_s": args.live_events_per_s,
        "rate_step": args.rate_step,
        "load_average": load_average,
        **{o.live: o.as_json() for o in outcomes},
    }
    say(json.dumps(summary, default=lambda v: round(v, 3) if isinstance(v, float) else str(v)))
    return 0
