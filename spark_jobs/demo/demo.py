"""The demo: a 2-million-event backlog, then live events, through the backlog-aware job.

Writes the backlog, starts a producer of live landing files, runs the events pipeline with
spark-submit on local Spark and SQLite until it has followed live data for a while, then
prints a summary per phase and writes a PNG timeline.
"""

from __future__ import annotations

import argparse
import sys

from spark_jobs.demo.report import (
    Checkpoint,
    cadence_s,
    caught_up,
    freshness_s,
    load,
    median,
    phase_stats,
    plot_timeline,
    weighted_percentile,
)
from spark_jobs.demo.runs import (
    Run,
    add_workspace_arguments,
    for_seconds_after,
    prepare_workspace,
    say,
)
from spark_jobs.jobs.launch import JavaMissing

CONF = {
    "spark.backlog.checkpointing.interval": "2s",
    "spark.backlog.checkpointing.interval-during-backlog": "1min",
    "spark.backlog.checkpointing.max-batch-rows": "1000000",
}


def summarise(checkpoints: list[Checkpoint], transitions: list[dict]) -> list[str]:
    backlog = phase_stats([c for c in checkpoints if c.is_backlog])
    live_checkpoints = [c for c in checkpoints if not c.is_backlog]
    live = phase_stats(live_checkpoints)
    steady = caught_up(checkpoints)
    gaps = cadence_s(steady)
    fresh = freshness_s(steady)
    lines = [
        "phase      checkpoints   duration        rows      rows/s",
        f"backlog    {backlog.checkpoints:11d} {backlog.duration_s:9.1f} s "
        f"{backlog.rows:11,} {backlog.rows_per_s:11,.0f}",
        f"live       {live.checkpoints:11d} {live.duration_s:9.1f} s "
        f"{live.rows:11,} {live.rows_per_s:11,.0f}",
        "",
        f"transitions: {', '.join(t['reason'] for t in transitions) or 'none'}",
        f"real time, once caught up ({len(steady)} checkpoints): "
        f"cadence median {median(gaps):.2f} s (configured 2 s), "
        f"event freshness p50 {weighted_percentile(fresh, 0.5):.2f} s, "
        f"p95 {weighted_percentile(fresh, 0.95):.2f} s",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backlog-demo", description=__doc__)
    add_workspace_arguments(parser, "var/demo", events=2_000_000)
    parser.add_argument("--live-seconds", type=float, default=40.0, help="time to follow live data")
    args = parser.parse_args(argv)
    try:
        workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"backlog-demo: {error}", file=sys.stderr)
        return 2
    workdir = workspace.root
    run = Run("demo", workdir / "run", workdir / "history", workspace.metrics_url, CONF)
    keep_going = for_seconds_after(
        lambda checkpoints: any(not c.is_backlog for c in checkpoints), args.live_seconds
    )
    checkpoints = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
    _, transitions = load(run.metrics_url, run.name)
    say("")
    for line in summarise(checkpoints, transitions):
        say(line)
    chart = plot_timeline(
        [("backlog-aware checkpointing: backlog (shaded), then live", checkpoints)],
        workdir / "timeline.png",
        f"{args.events:,}-event backlog, then {args.live_events_per_s} events/s live",
    )
    say(f"\ntimeline chart: {chart}")
    say(f"metrics: {workspace.metrics_url} (tables backlog_checkpoints, backlog_transitions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
