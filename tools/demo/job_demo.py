"""The demo: a 2-million-event file backlog, then a Kafka topic, through the backlog-aware job.

Writes the history, starts the embedded Kafka broker with a topic that already holds a
pile of events and keeps receiving live ones, and runs the events pipeline with
spark-submit on local Spark and SQLite. The job drains the files, stays in backlog while the
topic's lag is high, turns live once caught up; then a burst makes it fall behind, re-enter
backlog and recover. Prints each checkpoint, a summary, and writes a PNG timeline.
(``--live landing`` runs the landing-directory variant instead; ``--live postgres-cdc`` a
PostgreSQL table's snapshot, then its changes, copied into a table, and checks the copy.)
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import JavaMissing, require_java
from tools.pipelines.cdc_runs import CdcRun, Exactness, cdc_server, target_server
from tools.pipelines.report import (
    Checkpoint,
    cadence_s,
    caught_up,
    cost_lines,
    epoch,
    freshness_s,
    load,
    median,
    periods,
    phase_changes,
    phase_stats,
    plot_timeline,
    reentry,
    weighted_percentile,
)
from tools.pipelines.runs import (
    BurstAfterLive,
    KafkaTopic,
    Run,
    add_workspace_arguments,
    for_seconds_after,
    fresh_metrics,
    prepare_workspace,
    say,
)
from tools.services.broker import EmbeddedBroker
from tools.services.postgres import PostgresUnavailable

CONF = {
    "spark.backlog.checkpointing.interval": "2s",
    "spark.backlog.checkpointing.interval-during-backlog": "1min",
    "spark.backlog.checkpointing.max-batch-rows": "100000",
    "spark.backlog.lag.offsets.enter-threshold": "50000",
    "spark.backlog.lag.offsets.leave-threshold": "10000",
}
TOPIC = "events"
#: Enough partitions that the embedded broker's ~5 MiB each hold every record of the demo.
PARTITIONS = 8
#: The CDC phase's: the same intervals and batch bound. The lag thresholds count events on
#: files and topics, but bytes of WAL on a changelog, so they are left out there: the
#: snapshot is backlog, the changelog live.
CDC_CONF = {key: value for key, value in CONF.items() if ".lag." not in key}


def summarise(
    checkpoints: list[Checkpoint], transitions: list[dict], burst_at: float | None = None
) -> list[str]:
    """Each backlog and live period, where a checkpoint's time goes in each phase, the
    transitions, real time before any burst, the burst."""
    origin = checkpoints[0].started_at if checkpoints else 0.0
    lines = ["period                checkpoints        rows      rows/s   decided by"]
    for period in periods(checkpoints):
        stats = phase_stats(period)
        held = Counter(f"{c.rule}: {c.phase}" for c in period)
        lines.append(
            f"{'backlog' if period[0].is_backlog else 'live':8}"
            f"{period[0].started_at - origin:6.1f}-{period[-1].committed_at - origin:6.1f} s "
            f"{stats.checkpoints:6d} {stats.rows:11,} {stats.rows_per_s:11,.0f}   "
            + ", ".join(f"{what} ({count})" for what, count in held.items())
        )
    before_burst = [c for c in checkpoints if burst_at is None or c.committed_at < burst_at]
    steady = caught_up(before_burst)
    gaps = cadence_s(steady)
    fresh = freshness_s(steady)
    lines += [
        "",
        *cost_lines(checkpoints),
        "",
        "transitions:",
        *(
            f"  {epoch(t['at']) - origin:7.1f} s  {'backlog' if t['is_backlog'] else 'live   '}  "
            f"{t['reason']}"
            for t in transitions
        ),
        f"real time, once caught up ({len(steady)} checkpoints before any burst): "
        f"cadence median {median(gaps):.2f} s (configured 2 s), "
        f"event freshness p50 {weighted_percentile(fresh, 0.5):.2f} s, "
        f"p95 {weighted_percentile(fresh, 0.95):.2f} s",
    ]
    if burst_at is not None:
        answer = reentry(transitions, burst_at)
        lines.append(
            f"burst at {burst_at - origin:.1f} s: back in backlog after "
            f"{_seconds(answer.detect_s)}, live again {_seconds(answer.recovery_to_live_s)} later"
        )
    return lines


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/job-demo", description=__doc__)
    add_workspace_arguments(parser, "var/demo", events=2_000_000)
    parser.add_argument(
        "--live-seconds", type=float, default=20.0, help="time to follow live data, twice"
    )
    parser.add_argument("--live", choices=["kafka", "landing", "postgres-cdc"], default="kafka")
    parser.add_argument(
        "--cdc-rows",
        type=count_argument,
        default=1_000_000,
        help="rows of the table to copy, with --live postgres-cdc",
    )
    parser.add_argument(
        "--cdc-changes-per-s",
        type=float,
        default=50.0,
        help="transactions a second of the writer, with --live postgres-cdc",
    )
    parser.add_argument(
        "--topic-backlog",
        type=int,
        default=500_000,
        help="events in the topic at the start",
    )
    parser.add_argument("--burst", type=count_argument, default=600_000, help="events of the burst")
    args = parser.parse_args(argv)
    if args.live == "postgres-cdc":
        return cdc_demo(args)
    try:
        workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"scripts/job-demo: {error}", file=sys.stderr)
        return 2
    workdir = workspace.root
    if args.live == "landing":
        run = Run("demo", workdir / "run", workdir / "history", workspace.metrics_url, CONF)
        keep_going = for_seconds_after(caught_up, 2 * args.live_seconds)
        checkpoints = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
        report(args, run, checkpoints, None, _events_title(args))
        return 0
    with EmbeddedBroker(workdir / "broker", {TOPIC: PARTITIONS}) as broker:
        say(f"embedded Kafka broker at {broker.bootstrap_servers}, topic {TOPIC!r}")
        kafka = KafkaTopic(broker.bootstrap_servers, TOPIC, PARTITIONS)
        run = Run(
            "demo", workdir / "run", workdir / "history", workspace.metrics_url, CONF, kafka=kafka
        )
        script = BurstAfterLive(run, args.burst, args.live_seconds)
        checkpoints = run.execute(
            workspace.first_live_id, args.live_events_per_s, script, args.topic_backlog
        )
    report(args, run, checkpoints, script.burst_at, _events_title(args))
    return 0


def cdc_demo(args: argparse.Namespace) -> int:
    """A table's snapshot then its changes, copied while a writer keeps changing it; then the
    copy checked against the table. The server and the run's checkpoint are removed after."""
    try:
        require_java()
        with cdc_server() as server, target_server() as target:
            say(f"PostgreSQL: the table at {server.url}, its copy at {target.url}")
            exactness = _copy_and_follow(args, server.url, target.url)
    except (JavaMissing, PostgresUnavailable) as error:
        print(f"scripts/job-demo: {error}", file=sys.stderr)
        return 2
    say(f"copy of the table: {exactness.verdict()}")
    return 0 if exactness.exact else 1


def _copy_and_follow(args: argparse.Namespace, url: str, target_url: str) -> Exactness:
    workdir = args.workdir.resolve()
    metrics = fresh_metrics(workdir)
    run = CdcRun("demo-cdc", workdir / "cdc", url, target_url, "accounts", metrics, CDC_CONF)
    try:
        keep_going = for_seconds_after(caught_up, 2 * args.live_seconds)
        checkpoints = run.execute(args.cdc_rows, args.cdc_changes_per_s, 0, keep_going)
        exactness = run.verify()
        title = (
            f"{args.cdc_rows:,}-row PostgreSQL table: its snapshot, then its changelog at "
            f"{args.cdc_changes_per_s:g} transactions/s"
        )
        report(args, run, checkpoints, None, title)
        return exactness
    finally:
        run.remove_checkpoint()


def _events_title(args: argparse.Namespace) -> str:
    live = "a Kafka topic" if args.live == "kafka" else "a landing directory"
    return f"{args.events:,}-event file backlog, then {live} at {args.live_events_per_s} events/s"


def report(
    args: argparse.Namespace,
    run: Run | CdcRun,
    checkpoints: list[Checkpoint],
    burst_at: float | None,
    title: str,
) -> None:
    _, transitions = load(run.metrics_url, run.name)
    say("")
    for line in summarise(checkpoints, transitions, burst_at):
        say(line)
    marks = [(epoch(t["at"]), t["reason"]) for t in transitions] + phase_changes(checkpoints)
    if burst_at is not None:
        marks.append((burst_at, f"burst of {args.burst:,} events"))
    chart = plot_timeline(
        [("backlog-aware checkpointing: backlog shaded, transitions dashed", checkpoints)],
        args.workdir.resolve() / "timeline.png",
        title,
        [marks],
    )
    say(f"\ntimeline chart: {chart}")
    say(f"metrics: {run.metrics_url} (tables backlog_checkpoints, backlog_transitions)")


if __name__ == "__main__":
    sys.exit(main())
