"""Side by side on the same data: the configurations a Spark user would set by hand, and
backlog-aware checkpointing.

- static short: trigger ``interval`` with a per-batch row limit sized for live data;
- static long: trigger ``interval-during-backlog``, no limit;
- backlog-aware: ``interval`` live, batches sized for ``interval-during-backlog`` in backlog.

Each runs the events pipeline with spark-submit on a fresh checkpoint, with live events
arriving from the start, until it has followed live data in steady state for a while.
Reports backlog drain time, backlog checkpoints, and live freshness p50/p95, then the
ratios; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from spark_jobs.demo.report import (
    Checkpoint,
    caught_up,
    freshness_s,
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


@dataclass(frozen=True)
class Setup:
    name: str
    conf: dict[str, str]
    args: list[str]
    cadence_s: float


@dataclass(frozen=True)
class Result:
    name: str
    drain_s: float
    backlog_checkpoints: int
    freshness_p50_s: float
    freshness_p95_s: float
    live_checkpoints_measured: int


def setups(
    interval_s: float, backlog_interval_s: float, live_rows_per_batch: int, max_batch_rows: int
) -> list[Setup]:
    aware = {
        "spark.backlog.checkpointing.interval": f"{interval_s:g}s",
        "spark.backlog.checkpointing.interval-during-backlog": f"{backlog_interval_s:g}s",
        "spark.backlog.checkpointing.max-batch-rows": str(max_batch_rows),
    }
    return [
        Setup(
            "static-short",
            {},
            ["--static-trigger", f"{interval_s:g}s", "--static-max-rows", str(live_rows_per_batch)],
            interval_s,
        ),
        Setup(
            "static-long", {}, ["--static-trigger", f"{backlog_interval_s:g}s"], backlog_interval_s
        ),
        Setup("backlog-aware", aware, [], interval_s),
    ]


def measure(setup: Setup, checkpoints: list[Checkpoint], window_s: float) -> Result:
    backlog = [c for c in checkpoints if c.is_backlog]
    steady = caught_up(checkpoints)
    if steady:
        start = steady[0].started_at
        steady = [c for c in steady if c.committed_at <= start + window_s]
    fresh = freshness_s(steady)
    return Result(
        name=setup.name,
        drain_s=phase_stats(backlog).duration_s,
        backlog_checkpoints=len(backlog),
        freshness_p50_s=weighted_percentile(fresh, 0.5),
        freshness_p95_s=weighted_percentile(fresh, 0.95),
        live_checkpoints_measured=len(steady),
    )


def table(results: list[Result]) -> list[str]:
    lines = [
        "| configuration | backlog drain (s) | backlog checkpoints | live freshness p50 (s) "
        "| live freshness p95 (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.drain_s:.1f} | {r.backlog_checkpoints} | "
            f"{r.freshness_p50_s:.2f} | {r.freshness_p95_s:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="backlog-benchmark", description=__doc__)
    add_workspace_arguments(parser, "var/benchmark", events=1_000_000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--interval-during-backlog", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--max-batch-rows", type=int, default=500_000, help="the memory bound of backlog-aware"
    )
    args = parser.parse_args(argv)
    try:
        workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"backlog-benchmark: {error}", file=sys.stderr)
        return 2
    workdir = workspace.root
    # "Sized for live data": room for four intervals' worth of arrivals per batch.
    live_rows = 4 * round(args.live_events_per_s * args.interval)
    results, timelines = [], []
    configurations = setups(
        args.interval, args.interval_during_backlog, live_rows, args.max_batch_rows
    )
    for setup in configurations:
        window_s = max(60.0, 3 * setup.cadence_s)
        run = Run(
            setup.name,
            workdir / setup.name,
            workdir / "history",
            workspace.metrics_url,
            setup.conf,
            setup.args,
        )
        keep_going = for_seconds_after(caught_up, window_s + 2)
        checkpoints = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
        results.append(measure(setup, checkpoints, window_s))
        timelines.append((setup.name, checkpoints))
        say(f"[{setup.name}] {results[-1]}")

    short, long, aware = results
    ratios = {
        "drain_speedup_vs_static_short": short.drain_s / aware.drain_s,
        "drain_ratio_vs_static_long": aware.drain_s / long.drain_s,
        "freshness_p50_ratio_vs_static_short": aware.freshness_p50_s / short.freshness_p50_s,
        "freshness_p50_gain_vs_static_long": long.freshness_p50_s / aware.freshness_p50_s,
        "backlog_checkpoints": {r.name: r.backlog_checkpoints for r in results},
        "drain_s": {r.name: round(r.drain_s, 1) for r in results},
        "events": args.events,
        "live_events_per_s": args.live_events_per_s,
    }
    chart = plot_timeline(
        timelines,
        workdir / "benchmark.png",
        f"{args.events:,}-event backlog then {args.live_events_per_s} events/s: "
        f"interval {args.interval:g} s, interval-during-backlog {args.interval_during_backlog:g} s",
    )
    say("")
    for line in table(results):
        say(line)
    say("")
    say(
        f"backlog-aware drains {ratios['drain_speedup_vs_static_short']:.1f}x faster than static "
        f"short and takes {ratios['drain_ratio_vs_static_long']:.2f}x the time of static long;"
    )
    say(
        f"its live freshness p50 is {ratios['freshness_p50_ratio_vs_static_short']:.2f}x static "
        f"short's and {ratios['freshness_p50_gain_vs_static_long']:.1f}x better than static long's."
    )
    say(f"chart: {chart}")
    say(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in ratios.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
