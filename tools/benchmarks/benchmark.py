"""Side by side on the same data: the configurations a Spark user would set by hand, and
backlog-aware checkpointing.

- static short: trigger ``interval`` with a per-batch row limit sized for live data;
- static long: trigger ``interval-during-backlog``, no limit;
- backlog-aware: ``interval`` live, batches sized for ``interval-during-backlog`` in backlog.

Each runs the events pipeline with spark-submit on a fresh checkpoint, with live events
arriving from the start, until it has followed live data in steady state for a while; with
the live phase a landing directory, then a Kafka topic of the embedded broker (which also
holds a pile of events at the start, and gets a burst once the run is live). Reports
backlog drain time, backlog checkpoints, live freshness p50/p95 and, on Kafka, how long the
lag rule took to see the burst (``reentry_detect_s``) and to return to live
(``recovery_to_live_s``); then the ratios. The last line is one JSON object.

``--live postgres-cdc`` runs the same three on a PostgreSQL table instead: its snapshot in
primary-key chunks is the backlog, its changelog the live data, with a writer changing it at
a steady rate from the start (the same rows and the same writer seed for each), copied into a
table that must equal the source at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.backlog.values import count_argument
from spark_jobs.jobs.startup import JavaMissing, require_java
from tools.benchmarks import freshness_benchmark
from tools.pipelines.cdc_runs import CdcRun, cdc_server, target_server
from tools.pipelines.report import (
    Checkpoint,
    Reentry,
    caught_up,
    epoch,
    freshness_s,
    load,
    phase_stats,
    plot_timeline,
    reentry,
    weighted_percentile,
)
from tools.pipelines.runs import (
    BurstAfterLive,
    KafkaTopic,
    Run,
    Workspace,
    add_workspace_arguments,
    for_seconds_after,
    fresh_metrics,
    prepare_workspace,
    say,
)
from tools.services.broker import EmbeddedBroker
from tools.services.postgres import PostgresUnavailable


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
    reentry: Reentry


#: The lag rule every configuration records (static ones only record, they do not act).
LAG_RULE = {
    "spark.backlog.lag.offsets.enter-threshold": "50000",
    "spark.backlog.lag.offsets.leave-threshold": "10000",
}
#: Enough partitions that the embedded broker's ~5 MiB each hold every record of a run.
PARTITIONS = 16
#: The writer's seed, the same for every configuration.
CDC_SEED = 7


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


def measure(
    setup: Setup, checkpoints: list[Checkpoint], window_s: float, answer: Reentry
) -> Result:
    """Drain and freshness before any burst; the burst's answer as measured."""
    steady = caught_up(checkpoints)
    backlog = [c for c in checkpoints if c.is_backlog]
    if steady:
        backlog = [c for c in backlog if c.committed_at <= steady[0].started_at]
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
        reentry=answer,
    )


def table(live: str, results: list[Result]) -> list[str]:
    lines = [
        f"| {live}: configuration | backlog drain (s) | backlog checkpoints "
        "| live freshness p50 (s) | live freshness p95 (s) | re-entry detected (s) "
        "| back to live (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.name} | {r.drain_s:.1f} | {r.backlog_checkpoints} | "
            f"{r.freshness_p50_s:.2f} | {r.freshness_p95_s:.2f} | "
            f"{_seconds(r.reentry.detect_s)} | {_seconds(r.reentry.recovery_to_live_s)} |"
        )
    return lines


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


def ratios(results: list[Result]) -> dict[str, object]:
    """Backlog-aware against each static configuration that ran."""
    by_name = {r.name: r for r in results}
    found: dict[str, object] = {}
    aware, short, long = (by_name.get(n) for n in ("backlog-aware", "static-short", "static-long"))
    if aware is not None and short is not None:
        found["drain_speedup_vs_static_short"] = short.drain_s / aware.drain_s
        found["freshness_p50_ratio_vs_static_short"] = aware.freshness_p50_s / short.freshness_p50_s
    if aware is not None and long is not None:
        found["drain_ratio_vs_static_long"] = aware.drain_s / long.drain_s
        found["freshness_p50_gain_vs_static_long"] = long.freshness_p50_s / aware.freshness_p50_s
    found["backlog_checkpoints"] = {r.name: r.backlog_checkpoints for r in results}
    found["drain_s"] = {r.name: round(r.drain_s, 1) for r in results}
    return found


def verdict(live: str, found: Mapping[str, object]) -> str | None:
    """The ratios in a sentence, for those that were measured (None: none was)."""
    parts = []
    if "drain_speedup_vs_static_short" in found:
        speedup = found["drain_speedup_vs_static_short"]
        assert isinstance(speedup, float)
        parts.append(
            f"drains {speedup:.1f}x faster than static short"
            if speedup >= 1
            else f"drains slower than static short, at {speedup:.2f}x its speed"
        )
    if "drain_ratio_vs_static_long" in found:
        parts.append(f"takes {found['drain_ratio_vs_static_long']:.2f}x the time of static long")
    if "freshness_p50_ratio_vs_static_short" in found:
        parts.append(
            f"its live freshness p50 is {found['freshness_p50_ratio_vs_static_short']:.2f}x "
            "static short's"
        )
    if "freshness_p50_gain_vs_static_long" in found:
        parts.append(f"{found['freshness_p50_gain_vs_static_long']:.1f}x better than static long's")
    return f"{live}: backlog-aware " + "; ".join(parts) + "." if parts else None


def run_all(
    args: argparse.Namespace, workspace: Workspace, kafka: KafkaTopic | None
) -> tuple[list[Result], list[tuple[str, list[Checkpoint]]], list[list[tuple[float, str]]]]:
    """The three configurations one after another on one kind of live phase."""
    # "Sized for live data": room for four intervals' worth of arrivals per batch.
    live_rows = 4 * round(args.live_events_per_s * args.interval)
    results, timelines, marks = [], [], []
    live = "landing" if kafka is None else "kafka"
    # On Kafka the cap must be below what a burst brings per batch, or a live batch takes
    # the whole burst and nothing is left behind to see.
    cap = args.max_batch_rows if kafka is None else args.kafka_max_batch_rows
    for setup in setups(args.interval, args.interval_during_backlog, live_rows, cap):
        if setup.name not in args.configurations:
            continue
        window_s = max(60.0, 3 * setup.cadence_s)
        name = f"{live}-{setup.name}"
        run = Run.on(
            workspace,
            name,
            setup.conf | LAG_RULE,
            [
                *setup.args,
                "--shuffle-partitions",
                str(args.shuffle_partitions),
                "--rows-per-partition",
                str(cap // args.shuffle_partitions),
            ],
            kafka,
            PARTITIONS,
        )
        if kafka is None:
            keep_going = for_seconds_after(caught_up, window_s + 2)
            checkpoints = run.execute(workspace.first_live_id, args.live_events_per_s, keep_going)
            burst_at = None
        else:
            script = BurstAfterLive(run, args.burst, window_s + 2)
            checkpoints = run.execute(
                workspace.first_live_id, args.live_events_per_s, script, args.topic_backlog
            )
            burst_at = script.burst_at
        _, transitions = load(run.metrics_url, run.name)
        results.append(measure(setup, checkpoints, window_s, reentry(transitions, burst_at)))
        timelines.append((name, checkpoints))
        run_marks = [(epoch(t["at"]), t["reason"]) for t in transitions]
        marks.append(run_marks + ([(burst_at, "burst")] if burst_at else []))
        say(f"[{name}] {results[-1]}")
    return results, timelines, marks


def run_cdc(
    args: argparse.Namespace, workspace: Workspace, url: str, target_url: str
) -> tuple[list[Result], list[tuple[str, list[Checkpoint]]], list[list[tuple[float, str]]]]:
    """The three configurations one after another, each on a fresh table of the same rows with
    the same writer; each copy is checked against its table (a copy that differs fails)."""
    # Rows are changed rows here: four intervals' worth of the writer's (about one a
    # transaction, two for a move or a pair, and an update's rows, four in ten transactions
    # being updates), which rounds up to one chunk in the snapshot.
    per_transaction = 1.2 + 0.4 * (args.cdc_rows_per_update - 1)
    live_rows = 4 * round(per_transaction * args.cdc_changes_per_s * args.interval)
    results, timelines, marks = [], [], []
    for setup in setups(
        args.interval, args.interval_during_backlog, live_rows, args.max_batch_rows
    ):
        if setup.name not in args.configurations:
            continue
        window_s = max(60.0, 3 * setup.cadence_s)
        name = f"postgres-cdc-{setup.name}"
        run = CdcRun(
            name,
            workspace.root / name,
            url,
            target_url,
            f"accounts_{setup.name.replace('-', '_')}",
            workspace.metrics_url,
            setup.conf,
            [*setup.args, "--shuffle-partitions", str(args.shuffle_partitions)],
        )
        keep_going = for_seconds_after(caught_up, window_s + 2)
        checkpoints = run.execute(
            args.cdc_rows, args.cdc_changes_per_s, CDC_SEED, keep_going, args.cdc_rows_per_update
        )
        exactness = run.verify()
        say(f"[{name}] copy of {run.table}: {exactness.verdict()}")
        if not exactness.exact:
            raise RuntimeError(f"[{name}] the copy differs from the table")
        run.drop()
        _, transitions = load(run.metrics_url, run.name)
        results.append(measure(setup, checkpoints, window_s, reentry(transitions, None)))
        timelines.append((name, checkpoints))
        marks.append([(epoch(t["at"]), t["reason"]) for t in transitions])
        say(f"[{name}] {results[-1]}")
    return results, timelines, marks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/benchmark", description=__doc__)
    add_workspace_arguments(parser, "var/benchmark", events=1_000_000)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds")
    parser.add_argument("--interval-during-backlog", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--max-batch-rows",
        type=count_argument,
        default=500_000,
        help="the memory bound of backlog-aware",
    )
    parser.add_argument(
        "--live",
        choices=["landing", "kafka", "postgres-cdc"],
        action="append",
        help="live phase(s) to measure (default: all three)",
    )
    parser.add_argument(
        "--cdc-rows", type=count_argument, default=1_000_000, help="rows of the CDC table"
    )
    parser.add_argument(
        "--cdc-changes-per-s",
        type=float,
        default=50.0,
        help="transactions a second of the CDC table's writer",
    )
    parser.add_argument(
        "--cdc-rows-per-update",
        type=count_argument,
        default=1,
        help="rows each of the writer's updates changes (1; four transactions in ten update)",
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=count_argument,
        default=2,
        help="the pipeline's, for every configuration: one per core of local[2] halves the "
        "state commits of four (see docs/tuning.md)",
    )
    parser.add_argument("--topic-backlog", type=int, default=300_000)
    parser.add_argument("--burst", type=count_argument, default=1_000_000, help="events, on Kafka")
    parser.add_argument(
        "--kafka-max-batch-rows",
        type=count_argument,
        default=200_000,
        help="the memory bound of backlog-aware on Kafka",
    )
    names = [s.name for s in setups(1.0, 1.0, 1, 1)]
    parser.add_argument(
        "--configurations",
        nargs="+",
        choices=names,
        default=names,
        help="which to run (default: all); ratios need backlog-aware and the other",
    )
    parser.add_argument(
        "--freshness-target",
        type=float,
        help="seconds: instead of the three configurations, a fixed 1 s live interval against "
        "this freshness target, with a rate step (tools/benchmarks/freshness_benchmark.py)",
    )
    parser.add_argument(
        "--rate-step", type=count_argument, default=20_000, help="events/s after the step"
    )
    parser.add_argument("--window", type=float, default=60.0, help="seconds of steady live data")
    parser.add_argument("--chart", type=Path, help="where to write the freshness chart")
    args = parser.parse_args(argv)
    if args.freshness_target is not None:
        args.live = args.live or ["landing", "kafka"]
        if "postgres-cdc" in args.live:
            parser.error("--freshness-target runs on the landing and kafka live phases")
        try:
            return freshness_benchmark.main(args, prepare_workspace(args))
        except JavaMissing as error:
            print(f"scripts/benchmark: {error}", file=sys.stderr)
            return 2
    args.live = args.live or ["landing", "kafka", "postgres-cdc"]
    try:
        if args.live == ["postgres-cdc"]:  # no event files to write
            require_java()
            root = args.workdir.resolve()
            workspace = Workspace(root, 0, fresh_metrics(root))
        else:
            workspace = prepare_workspace(args)
    except JavaMissing as error:
        print(f"scripts/benchmark: {error}", file=sys.stderr)
        return 2
    topics = [f"kafka-{name}" for name in args.configurations]
    summary: dict[str, object] = {}
    if {"landing", "kafka"} & set(args.live):
        summary |= {"events": args.events, "live_events_per_s": args.live_events_per_s}
    lines: list[str] = []
    for live in args.live:
        backlog = f"{args.events:,}-event backlog then {live} at {args.live_events_per_s} events/s"
        if live == "landing":
            results, timelines, marks = run_all(args, workspace, None)
        elif live == "postgres-cdc":
            backlog = (
                f"{args.cdc_rows:,}-row table's snapshot then its changelog at "
                f"{args.cdc_changes_per_s:g} transactions/s"
                + (f", {args.cdc_rows_per_update} rows an update" * (args.cdc_rows_per_update > 1))
            )
            summary["cdc_rows"] = args.cdc_rows
            summary["cdc_changes_per_s"] = args.cdc_changes_per_s
            summary["cdc_rows_per_update"] = args.cdc_rows_per_update
            try:
                with cdc_server() as server, target_server() as target:
                    results, timelines, marks = run_cdc(args, workspace, server.url, target.url)
            except PostgresUnavailable as error:
                print(f"scripts/benchmark: {error}", file=sys.stderr)
                return 2
        else:
            with EmbeddedBroker(
                workspace.root / "broker", dict.fromkeys(topics, PARTITIONS)
            ) as broker:
                kafka = KafkaTopic(broker.bootstrap_servers, "", PARTITIONS)
                results, timelines, marks = run_all(args, workspace, kafka)
        found = ratios(results)
        if live == "kafka":
            found["reentry_detect_s"] = {r.name: _round(r.reentry.detect_s) for r in results}
            found["recovery_to_live_s"] = {
                r.name: _round(r.reentry.recovery_to_live_s) for r in results
            }
        summary[live] = found
        chart = plot_timeline(
            timelines,
            workspace.root / f"benchmark-{live}.png",
            f"{backlog}: interval {args.interval:g} s, interval-during-backlog "
            f"{args.interval_during_backlog:g} s",
            marks,
        )
        lines += ["", *table(live, results), ""]
        sentence = verdict(live, found)
        lines += [f"chart: {chart}"] if sentence is None else [sentence, f"chart: {chart}"]
    for line in lines:
        say(line)
    say(json.dumps(_rounded(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
